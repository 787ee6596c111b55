// Probes: the measurements of the benchmark harness, each run in its own child process
// (so that its peak RSS and CPU time are its own) against a provider simulator or sample
// sink that the parent process hosts.
//
// A probe reads its parameters from ProbeArgs, measures, and returns one JSON object
// (figures plus "error" when it failed). The parent (handoff_bench.cc) decides which
// probes make a scenario and compares each figure with its limit from the same run.
//
// Not thread-safe: one probe per process.
#ifndef HANDOFF_BENCH_PROBES_H_
#define HANDOFF_BENCH_PROBES_H_

#include <sys/resource.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace handoff::bench {

struct ProbeArgs {
  std::string probe;      // which measurement (see RunProbe)
  std::string sim_url;    // the parent's ProviderSim
  std::string sink_target;  // the parent's SampleSink (host:port)
  std::string dir;        // scratch or data-set directory
  std::string transport = "poll";  // poll | sse
  std::string gate = "immediate";  // immediate | finalized
  std::string mode = "batch";      // single | batch
  std::string handoffd;   // handoffd binary (admin probe); empty: in-process fallback
  int page = 1000;        // page_limit
  int sources = 1;
  int64_t events = 0;     // per source (ingest), or in total (sink, bare loop)
  int64_t rows = 0;       // recovery: receipts per source
  double window_s = 5;    // admin and idle measurement windows
  int logs_per_block = 10;
  int finality_lag = 32;
  bool sync = true;
  // bare_rocks: the engine's sync policy (writes unsynced, a paced background fsync covers
  // every batch written before it began, at most WorkerOptions::max_unsynced_pages batches
  // unsynced per writer); false: every batch synced as it is written.
  bool deferred_sync = true;
};

// This process's peak resident set (VmHWM): its own, also when it was started by
// posix_spawn (whose vfork makes the kernel fold the parent's peak into the child's
// ru_maxrss at exec).
double PeakRssMb();

// What a process's threads have done (getrusage): their CPU time (user + system), the
// times they slept or were preempted, and the pages they touched first.
struct ProcessUsage {
  double cpu_seconds = 0;
  int64_t context_switches = 0;
  int64_t minor_faults = 0;
};
ProcessUsage UsageOf(const rusage& ru);
// This process's, so far.
ProcessUsage ReadProcessUsage();

// The machine's CPU time by kind so far (/proc/stat, all CPUs, in clock ticks): what
// the hypervisor took ("steal": the vCPU was runnable but not running) over the total.
struct MachineTicks {
  int64_t steal = 0;
  int64_t total = 0;
};
MachineTicks ReadMachineTicks();
// The share of the machine's time between two readings that the hypervisor took.
double StealFraction(const MachineTicks& from, const MachineTicks& to);

// Runs args.probe: sim_alone, bare_rocks, e2e, sink_direct, sink_e2e, recovery, admin,
// idle. Never throws; failures are reported as {"error": "..."}.
nlohmann::json RunProbe(const ProbeArgs& args);

}  // namespace handoff::bench

#endif  // HANDOFF_BENCH_PROBES_H_
