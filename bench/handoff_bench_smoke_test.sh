#!/usr/bin/env bash
# Runs the harness in smoke mode and checks that the report names every scenario.
# No timing assertion: the figures of a smoke run mean nothing.
set -euo pipefail
bench="$1"
handoffd="$2"  # the admin, idle and recovery scenarios run it as a process
out="${TEST_TMPDIR}/report"
mkdir -p "$out"
"$bench" --smoke --out_dir="$out" --scratch="${TEST_TMPDIR}/scratch" \
  --data_dir="${TEST_TMPDIR}/data" --handoffd="$handoffd" --history=/dev/null
for f in REPORT.md report.json; do
  [[ -s "$out/$f" ]] || { echo "missing $out/$f"; exit 1; }
done
for s in "1 end to end" "2 many sources" "3 external sink" "4 recovery" "5 memory" \
         "6 admin latency" "7 idle cost"; do
  grep -q "| $s |" "$out/REPORT.md" || { echo "REPORT.md lacks scenario '$s'"; cat "$out/REPORT.md"; exit 1; }
done
# Scenario 2's largest row sets the engine beside the storage with as many writers.
grep -q " writers, " "$out/REPORT.md" || { echo "REPORT.md lacks the bare RocksDB many-writer limit"; exit 1; }
grep -q "polling sources, .* context switches and .* page faults each; steal " "$out/REPORT.md" ||
  { echo "REPORT.md's idle polling row lacks its per-poll events or steal"; exit 1; }
grep -q "| 4 recovery | handoffd's exec to the first new commit" "$out/REPORT.md" ||
  { echo "REPORT.md's recovery row is not handoffd's own start"; exit 1; }
# Every probe must have produced figures, not an error.
if grep -q "^## Failures" "$out/REPORT.md"; then
  cat "$out/REPORT.md"
  exit 1
fi
# --rerender writes the same report again from report.json alone, measuring nothing.
again="${TEST_TMPDIR}/rerendered"
"$bench" --rerender="$out/report.json" --out_dir="$again" --history=/dev/null
cmp -s "$out/REPORT.md" "$again/REPORT.md" ||
  { echo "--rerender wrote a different REPORT.md"; diff "$out/REPORT.md" "$again/REPORT.md"; exit 1; }
if "$bench" --rerender="$out/REPORT.md" --out_dir="$again" --history=/dev/null 2>/dev/null; then
  echo "--rerender accepted a file that is not a report.json"; exit 1
fi
echo "smoke report OK"
