// Per-event CPU costs of the ingest path, in isolation (Google Benchmark):
//   bazel run -c opt //bench:micro_bench
// Key encoding (store/keys.h) and row encoding (store/row_codec.h) run once per applied event;
// page parsing has its own benchmark (//consumer/provider:page_parser_bench). RocksDB's
// CRC32C runs over every byte of the WAL (third_party/rocksdb_crc32c).
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "handoff/v1/source.pb.h"
#include "sim/synthetic_chain.h"
#include "store/keys.h"
#include "store/row_codec.h"
#include "third_party/rocksdb_crc32c/rocksdb_crc32c.h"

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

// The stored form of a row (store/row_codec.h), into a reused buffer as the engine does.
void BM_EncodeRow(benchmark::State& state) {
  const auto& rows = Rows();
  size_t i = 0, bytes = 0;
  std::string s;
  for (auto _ : state) {
    s.clear();
    handoff::store::AppendEncodedRow(rows[i++ % rows.size()], &s);
    bytes += s.size();
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_EncodeRow);

// The row as protobuf serializes it (the stored form before row_codec), for comparison.
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

void BM_DecodeRow(benchmark::State& state) {
  const std::string bytes = handoff::store::EncodeRow(Rows()[0]);
  handoff::v1::EventRow row;
  for (auto _ : state) {
    benchmark::DoNotOptimize(handoff::store::DecodeRow(bytes, &row));
  }
}
BENCHMARK(BM_DecodeRow);

// The simulator rendering a page of 1000 logs (what it spends per page besides the
// socket): it shares the benchmark's cores with the engine it feeds.
void BM_SimulatorPageOf1000Logs(benchmark::State& state) {
  handoff::sim::ChainOptions o;
  o.initial_head = 100000;
  o.logs_per_block = 10;
  handoff::sim::SyntheticChain chain(o);
  uint64_t block = 0, bytes = 0;
  for (auto _ : state) {
    handoff::sim::PageContent page = chain.BuildPage({block, 0}, 1000);
    bytes += page.items_json.size();
    benchmark::DoNotOptimize(page);
    block = (block + 100) % 90000;
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_SimulatorPageOf1000Logs);

// A WAL record's checksum: RocksDB's portable loop against the crc32 instruction, over
// a write group's size of record (Arg: bytes).
template <uint32_t (*kExtend)(uint32_t, const char*, size_t)>
void BM_WalCrc32c(benchmark::State& state) {
  const std::string record(static_cast<size_t>(state.range(0)), 'x');
  uint32_t crc = 0;
  for (auto _ : state) {
    crc = kExtend(crc, record.data(), record.size());
    benchmark::DoNotOptimize(crc);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK_TEMPLATE(BM_WalCrc32c, handoff::rocksdb_crc32c::PortableExtend)->Arg(400 << 10);
BENCHMARK_TEMPLATE(BM_WalCrc32c, handoff::rocksdb_crc32c::Extend)->Arg(400 << 10);

}  // namespace

BENCHMARK_MAIN();
