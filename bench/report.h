// Report: turns the probes' figures of one run into bench/REPORT.md (a table of figures,
// limits from the same run, ratios and whether each goal of issue 7 is met, plus the
// memory formula and the History section) and bench/report.json (the same, plus every
// raw probe result).
//
// Thread-compatible.
#ifndef HANDOFF_BENCH_REPORT_H_
#define HANDOFF_BENCH_REPORT_H_

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace handoff::bench {

struct Machine {
  std::string date;
  int nproc = 0;
  std::string cpu;
  std::string kernel;
};

struct Results {
  bool smoke = false;
  Machine machine;
  // Probe name -> the probe's JSON (see handoff_bench.cc for the names).
  nlohmann::json raw = nlohmann::json::object();
  // Markdown appended as "History" (before/after of the performance work).
  std::string history;
};

// Writes <out_dir>/REPORT.md and <out_dir>/report.json.
absl::Status WriteReport(const Results& results, const std::string& out_dir);

}  // namespace handoff::bench

#endif  // HANDOFF_BENCH_REPORT_H_
