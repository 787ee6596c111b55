// provider_sim: serves the simulated event provider until SIGINT/SIGTERM.
//
//   bazel run //sim:provider_sim -- --port=8545 --blocks_per_second=2 --logs_per_block=20
//       --reorg_probability=0.05 --faults=truncated_body=0.01,chain_unavailable=once
// The bearer token (when wanted) comes from the environment variable named by
// --bearer_token_env, never from the command line.
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "sim/provider_sim.h"

ABSL_FLAG(int, port, 8545, "TCP port (0: any; the bound port is printed)");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to bind");
ABSL_FLAG(std::string, chain, "sim", "the chain name served");
ABSL_FLAG(uint64_t, seed, 1, "chain seed");
ABSL_FLAG(uint64_t, genesis, 0, "first block number");
ABSL_FLAG(uint64_t, initial_head, 1000, "blocks genesis..initial_head exist at start");
ABSL_FLAG(double, blocks_per_second, 0, "new blocks per second (0: instant, no growth)");
ABSL_FLAG(uint32_t, logs_per_block, 10, "logs in every block");
ABSL_FLAG(uint32_t, safe_lag, 6, "safe = head - safe_lag");
ABSL_FLAG(uint32_t, finality_lag, 32, "finalized = head - finality_lag");
ABSL_FLAG(double, reorg_probability, 0, "chance of a reorg per new block");
ABSL_FLAG(uint32_t, reorg_depth, 3, "blocks replaced by a reorg");
ABSL_FLAG(int, heartbeat_ms, 30000, "SSE heartbeat interval");
ABSL_FLAG(int, threads, 64, "server threads (each open stream holds one)");
ABSL_FLAG(absl::Duration, response_delay, absl::ZeroDuration(),
          "hold every polled response this long (a provider farther away than loopback)");
ABSL_FLAG(bool, decimal_strings, false, "page numbers as decimal strings");
ABSL_FLAG(bool, sse_close_delimited, false,
          "SSE bodies end at the connection's close instead of being chunked (cheaper to "
          "serve)");
ABSL_FLAG(std::string, bearer_token_env, "", "env var holding the required bearer token");
ABSL_FLAG(std::string, faults, "",
          "comma-separated kind=probability or kind=once|<count>, e.g. truncated_body=0.01");
ABSL_FLAG(int, retry_after, 1, "chain_unavailable retry_after seconds");
ABSL_FLAG(int, rate_limit, 2, "429 Retry-After seconds");
ABSL_FLAG(int, silence_ms, 90000, "length of the sse_silence fault");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  handoff::sim::KeepFreedMemoryForReuse();
  // Block the stop signals in every thread; main waits for them with sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  handoff::sim::ProviderSimOptions o;
  o.chain.seed = absl::GetFlag(FLAGS_seed);
  o.chain.genesis = absl::GetFlag(FLAGS_genesis);
  o.chain.initial_head = absl::GetFlag(FLAGS_initial_head);
  o.chain.blocks_per_second = absl::GetFlag(FLAGS_blocks_per_second);
  o.chain.logs_per_block = absl::GetFlag(FLAGS_logs_per_block);
  o.chain.safe_lag = absl::GetFlag(FLAGS_safe_lag);
  o.chain.finality_lag = absl::GetFlag(FLAGS_finality_lag);
  o.chain.reorg_probability = absl::GetFlag(FLAGS_reorg_probability);
  o.chain.reorg_depth = absl::GetFlag(FLAGS_reorg_depth);
  o.chain_name = absl::GetFlag(FLAGS_chain);
  o.heartbeat = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
  o.threads = absl::GetFlag(FLAGS_threads);
  o.response_delay = absl::GetFlag(FLAGS_response_delay);
  o.host = absl::GetFlag(FLAGS_host);
  o.decimal_strings = absl::GetFlag(FLAGS_decimal_strings);
  o.sse_close_delimited = absl::GetFlag(FLAGS_sse_close_delimited);
  o.fault_settings.retry_after_seconds = absl::GetFlag(FLAGS_retry_after);
  o.fault_settings.rate_limit_seconds = absl::GetFlag(FLAGS_rate_limit);
  o.fault_settings.silence = absl::Milliseconds(absl::GetFlag(FLAGS_silence_ms));
  std::string env = absl::GetFlag(FLAGS_bearer_token_env);
  if (!env.empty()) {
    const char* token = std::getenv(env.c_str());
    if (token == nullptr || *token == '\0') {
      std::fprintf(stderr, "provider_sim: $%s is not set\n", env.c_str());
      return 2;
    }
    o.bearer_token = token;
  }
  handoff::sim::ProviderSim sim(o);
  for (absl::string_view spec : absl::StrSplit(absl::GetFlag(FLAGS_faults), ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> kv = absl::StrSplit(spec, absl::MaxSplits('=', 1));
    std::optional<handoff::sim::Fault> fault = handoff::sim::FaultFromName(kv[0]);
    double p = 0;
    int count = 0;
    if (!fault || kv.size() != 2) {
      std::fprintf(stderr, "provider_sim: bad --faults entry '%s'\n", std::string(spec).c_str());
      return 2;
    }
    if (kv[1] == "once") {
      sim.ArmFault(*fault, 1);
    } else if (absl::SimpleAtoi(kv[1], &count) && count >= 1) {
      sim.ArmFault(*fault, count);
    } else if (absl::SimpleAtod(kv[1], &p) && p >= 0 && p <= 1) {
      sim.SetFaultProbability(*fault, p);
    } else {
      std::fprintf(stderr, "provider_sim: bad --faults value '%s'\n", std::string(spec).c_str());
      return 2;
    }
  }
  absl::StatusOr<int> port = sim.Start(absl::GetFlag(FLAGS_port));
  if (!port.ok()) {
    std::fprintf(stderr, "provider_sim: %s\n", std::string(port.status().message()).c_str());
    return 1;
  }
  std::printf("provider_sim listening on %s\n", sim.base_url().c_str());
  std::fflush(stdout);
  int signal = 0;
  sigwait(&stop_signals, &signal);
  sim.Stop();
  return 0;
}
