// Per-event CPU costs of the ingest path, in isolation (Google Benchmark):
//   bazel run -c opt //bench:micro_bench
// Key encoding (store/keys.h) and EventRow serialization run once per applied event;
// page parsing has its own benchmark (//consumer/provider:page_parser_bench).
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "handoff/v1/source.pb.h"
#include "sim/synthetic_chain.h"
#include "store/keys.h"

namespace {

const std::vector<handoff::v1::EventRow>& Rows() {
  static const auto* rows = [] {
    handoff::sim::ChainOptions o;
    o.initial_head = 200;
    o.logs_per_block = 10;
    handoff::sim::SyntheticChain chain(o);
    return new std::vector<handoff::v1::EventRow>(chain.Canonical(0, 99));
  }();
  return *rows;
}

void BM_PositionalKey(benchmark::State& state) {
  uint64_t i = 0;
  for (auto _ : state) {
    std::string key = handoff::store::keys::Positional("source-0001", {i / 10, i % 10});
    benchmark::DoNotOptimize(key);
    ++i;
  }
}
BENCHMARK(BM_PositionalKey);

void BM_SerializeRow(benchmark::State& state) {
  const auto& rows = Rows();
  size_t i = 0, bytes = 0;
  for (auto _ : state) {
    std::string s = rows[i++ % rows.size()].SerializeAsString();
    bytes += s.size();
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_SerializeRow);

void BM_SerializeRowReusedBuffer(benchmark::State& state) {
  const auto& rows = Rows();
  size_t i = 0, bytes = 0;
  std::string s;
  for (auto _ : state) {
    s.clear();
    rows[i++ % rows.size()].AppendToString(&s);
    bytes += s.size();
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_SerializeRowReusedBuffer);

void BM_ParseRow(benchmark::State& state) {
  const std::string bytes = Rows()[0].SerializeAsString();
  handoff::v1::EventRow row;
  for (auto _ : state) {
    benchmark::DoNotOptimize(row.ParseFromString(bytes));
  }
}
BENCHMARK(BM_ParseRow);

}  // namespace

BENCHMARK_MAIN();
