// Page parsing cost on a realistic page (1000 simulator logs, ~690 KB): simdjson (the
// production PageParser) versus nlohmann::json doing the same conversion to a Page.
//   bazel run -c opt //consumer/provider:page_parser_bench
// Figures are recorded at the top of page_parser.h.
#include <benchmark/benchmark.h>
#include <simdjson.h>

#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "consumer/provider/page_parser.h"
#include "consumer/row_pool.h"
#include "sim/synthetic_chain.h"

namespace handoff::consumer {
namespace {

const std::string& PageBody() {
  static const std::string* body = [] {
    sim::ChainOptions o;
    o.initial_head = 200;
    o.logs_per_block = 10;
    sim::SyntheticChain chain(o);
    sim::PageContent page = chain.BuildPage(sim::CursorPosition{50, 0}, 1000);
    return new std::string(absl::StrCat(
        R"({"from":50,"through":{"number":)", *page.through, R"(,"hash":")", page.through_hash,
        R"("},"next":"YzoxNTA6MDpkZWFkYmVlZg","reorg":false,"safe":{"number":190,"hash":")",
        page.safe_hash, R"("},"finalized":{"number":150,"hash":")", page.finalized_hash,
        R"("},"tip":200,"items":[)", page.items_json, "]}"));
  }();
  return *body;
}

// The production parser. With `recycle_rows` each page's rows go back to the row pool,
// as in production, so the next parse overwrites recycled strings instead of allocating.
void ParsePages(benchmark::State& state, bool recycle_rows) {
  const std::string& body = PageBody();
  PageParser parser;
  for (auto _ : state) {
    absl::StatusOr<Page> page = parser.Parse(body);
    if (!page.ok() || page->items.size() != 1000) state.SkipWithError("parse failed");
    if (recycle_rows) RowPool::Default().Give(std::move(page->items));
    benchmark::DoNotOptimize(page);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * body.size()));
}

void BM_SimdjsonPageParser(benchmark::State& state) { ParsePages(state, false); }
BENCHMARK(BM_SimdjsonPageParser);

void BM_SimdjsonPageParserRecycled(benchmark::State& state) { ParsePages(state, true); }
BENCHMARK(BM_SimdjsonPageParserRecycled);

// The DOM parse alone (runtime-dispatched stage 1 and 2, no Page built).
void BM_SimdjsonDomOnly(benchmark::State& state) {
  const std::string& body = PageBody();
  simdjson::padded_string padded(body);
  simdjson::dom::parser parser;
  for (auto _ : state) {
    simdjson::dom::element doc;
    if (parser.parse(padded).get(doc) != simdjson::SUCCESS) state.SkipWithError("parse failed");
    benchmark::DoNotOptimize(doc);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * body.size()));
  state.SetLabel(std::string(simdjson::get_active_implementation()->name()));
}
BENCHMARK(BM_SimdjsonDomOnly);

uint64_t HexQuantity(const std::string& s) { return std::stoull(s.substr(2), nullptr, 16); }

bool IsHex(const std::string& s, size_t digits) {
  if (s.size() < 2 || s[0] != '0' || s[1] != 'x') return false;
  if (digits != 0 && s.size() != digits + 2) return false;
  for (size_t i = 2; i < s.size(); ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

void BM_NlohmannToPage(benchmark::State& state) {
  const std::string& body = PageBody();
  for (auto _ : state) {
    nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) state.SkipWithError("parse failed");
    Page page;
    page.from = j["from"].get<uint64_t>();
    page.next = j["next"].get<std::string>();
    page.reorg = j["reorg"].get<bool>();
    page.through = BlockMarkValue{j["through"]["number"].get<uint64_t>(),
                                  j["through"]["hash"].get<std::string>()};
    for (const auto& item : j["items"]) {
      handoff::v1::EventRow& row = page.items.emplace_back();
      row.set_address(item["address"].get<std::string>());
      for (const auto& t : item["topics"]) row.add_topics(t.get<std::string>());
      row.set_data(item["data"].get<std::string>());
      row.set_block_number(HexQuantity(item["blockNumber"].get<std::string>()));
      row.set_block_hash(item["blockHash"].get<std::string>());
      row.set_transaction_hash(item["transactionHash"].get<std::string>());
      row.set_transaction_index(HexQuantity(item["transactionIndex"].get<std::string>()));
      row.set_log_index(HexQuantity(item["logIndex"].get<std::string>()));
      bool ok = IsHex(row.address(), 40) && IsHex(row.block_hash(), 64) &&
                IsHex(row.transaction_hash(), 64) && IsHex(row.data(), 0);
      if (!ok) state.SkipWithError("bad hex");
    }
    benchmark::DoNotOptimize(page);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * body.size()));
}
BENCHMARK(BM_NlohmannToPage);

}  // namespace
}  // namespace handoff::consumer

BENCHMARK_MAIN();
