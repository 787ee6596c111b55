#!/usr/bin/env bash
# Runs tests/torture/torture.py with Debian's python3-grpcio (always /usr/bin/python3:
# the python3 on PATH may lack it). Figures on stdout; see torture.py for the knobs.
set -euo pipefail
if ! /usr/bin/python3 -c 'import grpc, grpc_tools' 2>/dev/null; then
  echo "python3-grpcio and python3-grpc-tools are missing: run scripts/setup" >&2
  exit 1
fi
exec /usr/bin/python3 "$(dirname "$0")/torture.py" --handoffd="$1" --provider_sim="$2" \
  --sample_sink="$3" --proto_dir="$4" --sink_proto_dir="$5"
