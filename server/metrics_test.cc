#include "server/metrics.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/testing/fake_source_manager.h"

namespace handoff::server {
namespace {

std::string Scrape(const prometheus::Collectable& collectable) {
  return prometheus::TextSerializer().Serialize(collectable.Collect());
}

TEST(MetricsObserverTest, CountsEngineEvents) {
  prometheus::Registry registry;
  MetricsObserver observer(&registry);
  observer.OnPageCommitted("a");
  observer.OnPageCommitted("a");
  observer.OnCommit("a", 10, absl::Milliseconds(3));
  observer.OnRefusal("a", "rate_limited");
  observer.OnRetry("a");
  observer.OnCorrection("a", 5);
  const std::string text = Scrape(registry);
  EXPECT_NE(text.find("handoff_pages_committed_total{source=\"a\"} 2"), std::string::npos)
      << text;
  EXPECT_NE(text.find("handoff_step_events_total{source=\"a\"} 10"), std::string::npos);
  EXPECT_NE(text.find("handoff_commit_latency_seconds_count{source=\"a\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("handoff_commit_latency_seconds_bucket{source=\"a\",le=\"0.005\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("handoff_provider_refusals_total{code=\"rate_limited\",source=\"a\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("handoff_retries_total{source=\"a\"} 1"), std::string::npos);
  EXPECT_NE(text.find("handoff_corrections_total{source=\"a\"} 1"), std::string::npos);
  EXPECT_NE(text.find("handoff_correction_depth_blocks_sum{source=\"a\"} 5"), std::string::npos);
}

// The code label is the provider's `error` string, which a provider may vary at will (up
// to 64 KiB): only the contract's codes and Handoff's own keep their value, anything else
// is "other", so the number of series stays bounded.
TEST(MetricsObserverTest, RefusalCodesOutsideTheContractAreOther) {
  prometheus::Registry registry;
  MetricsObserver observer(&registry);
  const std::vector<std::string> kept = {
      "chain_unavailable", "rate_limited",     "resync_required",
      "cursor_mismatch",   "invalid_request",  "unauthorized",
      "forbidden",         "payment_required", "insufficient_credit",
      "network",           "timeout",          "page_too_large"};
  for (const std::string& code : kept) observer.OnRefusal("a", code);
  for (int i = 0; i < 100; ++i) observer.OnRefusal("a", absl::StrCat("made_up_", i));
  observer.OnRefusal("a", std::string(64 << 10, 'x'));
  observer.OnRefusal("a", "Rate_Limited");  // codes are exact
  const std::string text = Scrape(registry);
  for (const std::string& code : kept) {
    EXPECT_NE(text.find(absl::StrCat("handoff_provider_refusals_total{code=\"", code,
                                     "\",source=\"a\"} 1\n")),
              std::string::npos)
        << code;
  }
  EXPECT_NE(text.find("handoff_provider_refusals_total{code=\"other\",source=\"a\"} 102\n"),
            std::string::npos)
      << text.substr(0, 1024);
  EXPECT_EQ(text.find("made_up_"), std::string::npos);
  EXPECT_EQ(text.find("xxxx"), std::string::npos);
  size_t series = 0;
  for (size_t at = text.find("handoff_provider_refusals_total{"); at != std::string::npos;
       at = text.find("handoff_provider_refusals_total{", at + 1)) {
    ++series;
  }
  EXPECT_EQ(series, kept.size() + 1);
  EXPECT_EQ(RefusalCodeLabel(""), "");
  EXPECT_EQ(RefusalCodeLabel("cursor_mismatch"), "cursor_mismatch");
}

// Every series with source="<id>" in `text`, one per line.
std::vector<std::string> SeriesOf(const std::string& text, const std::string& id) {
  std::vector<std::string> out;
  const std::string label = absl::StrCat("source=\"", id, "\"");
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    if (!line.empty() && line[0] != '#' && line.find(label) != std::string::npos) {
      out.push_back(line);
    }
    start = end + 1;
  }
  return out;
}

// A deleted source's series leave every family (a halted or stale source must not stay
// on dashboards), the other sources' stay, and a source re-created under the same id
// counts from zero.
TEST(MetricsObserverTest, DeletedSourceLeavesEveryFamilyAndARecreatedOneStartsAtZero) {
  prometheus::Registry registry;
  MetricsObserver observer(&registry);
  for (const std::string id : {"gone", "kept"}) {
    observer.OnPageCommitted(id);
    observer.OnPageCommitted(id);
    observer.OnCommit(id, 10, absl::Milliseconds(3));
    observer.OnRefusal(id, "rate_limited");
    observer.OnRefusal(id, "");
    observer.OnRefusal(id, "made_up");
    observer.OnRetry(id);
    observer.OnCorrection(id, 5);
  }
  const std::vector<std::string> kept_before = SeriesOf(Scrape(registry), "kept");
  ASSERT_FALSE(SeriesOf(Scrape(registry), "gone").empty());

  observer.OnSourceDeleted("gone");
  std::string text = Scrape(registry);
  EXPECT_EQ(SeriesOf(text, "gone"), std::vector<std::string>{}) << text;
  EXPECT_EQ(SeriesOf(text, "kept"), kept_before);
  observer.OnSourceDeleted("never_seen");  // nothing to remove: no effect
  EXPECT_EQ(Scrape(registry), text);

  observer.OnPageCommitted("gone");
  observer.OnRefusal("gone", "rate_limited");
  text = Scrape(registry);
  EXPECT_NE(text.find("handoff_pages_committed_total{source=\"gone\"} 1\n"), std::string::npos)
      << text;
  EXPECT_NE(
      text.find("handoff_provider_refusals_total{code=\"rate_limited\",source=\"gone\"} 1\n"),
      std::string::npos);
  EXPECT_EQ(SeriesOf(text, "gone").size(), 2u) << text;
}

// What ProgressCollector exports is read from the manager on each scrape: a deleted
// source is gone at the next scrape.
TEST(ProgressCollectorTest, DeletedSourceIsGoneAtTheNextScrape) {
  testing::FakeSourceManager manager;
  handoff::v1::CreateSourceRequest request;
  request.mutable_spec()->set_id("gone");
  request.mutable_spec()->set_provider_url("http://x");
  ASSERT_TRUE(manager.CreateSource(request).ok());
  handoff::v1::Progress p;
  p.set_source_id("gone");
  p.set_state(handoff::v1::SOURCE_STATE_AUTH_FAILED);
  p.mutable_counters()->set_applied(42);
  ASSERT_TRUE(manager.SetProgress(p).ok());
  ProgressCollector collector(&manager, [] { return absl::OkStatus(); });
  ASSERT_NE(Scrape(collector).find(
                "handoff_source_state{source=\"gone\",state=\"SOURCE_STATE_AUTH_FAILED\"} 1"),
            std::string::npos);
  ASSERT_TRUE(manager.DeleteSource("gone").ok());
  const std::string text = Scrape(collector);
  EXPECT_EQ(SeriesOf(text, "gone"), std::vector<std::string>{}) << text;
  EXPECT_NE(text.find("handoff_sources 0"), std::string::npos) << text;
}

TEST(ProgressCollectorTest, ExportsDurableFiguresPerSource) {
  testing::FakeSourceManager manager;
  handoff::v1::CreateSourceRequest request;
  request.mutable_spec()->set_id("src");
  request.mutable_spec()->set_provider_url("http://x");
  ASSERT_TRUE(manager.CreateSource(request).ok());
  handoff::v1::Progress p;
  p.set_source_id("src");
  p.set_state(handoff::v1::SOURCE_STATE_BACKING_OFF);
  p.mutable_counters()->set_applied(42);
  p.mutable_counters()->set_replayed(3);
  p.mutable_counters()->set_ignored(2);
  p.mutable_counters()->set_quarantined(1);
  p.mutable_counters()->set_open_holds(4);
  p.mutable_checkpoint()->set_applied_block(1000);
  p.mutable_highest_finalized()->set_number(990);
  p.mutable_highest_safe()->set_number(995);
  p.set_tip(1010);
  p.set_lag_blocks(10);
  ASSERT_TRUE(manager.SetProgress(p).ok());

  consumer::PageBudget::Options budget_options;
  budget_options.slots = 8;
  budget_options.adaptive_min = 3;
  std::shared_ptr<consumer::PageBudget> budget =
      consumer::PageBudget::Create(std::move(budget_options));
  std::optional<consumer::PageSlot> held = budget->TryAcquire();
  ASSERT_TRUE(held.has_value());
  ProgressCollector collector(
      &manager, [] { return absl::OkStatus(); },
      [] {
        return store::Store::MemoryUsage{/*memtable_bytes=*/5 << 20, /*block_cache_bytes=*/7000};
      },
      budget);
  const std::string text = Scrape(collector);
  for (const char* expected : {
           "handoff_events_applied_total{source=\"src\"} 42",
           "handoff_events_replayed_total{source=\"src\"} 3",
           "handoff_events_ignored_total{source=\"src\"} 2",
           "handoff_events_quarantined_total{source=\"src\"} 1",
           "handoff_open_holds{source=\"src\"} 4",
           "handoff_applied_block{source=\"src\"} 1000",
           "handoff_finalized_block{source=\"src\"} 990",
           "handoff_safe_block{source=\"src\"} 995",
           "handoff_tip_block{source=\"src\"} 1010",
           "handoff_lag_blocks{source=\"src\"} 10",
           "handoff_source_state{source=\"src\",state=\"SOURCE_STATE_BACKING_OFF\"} 1",
           "handoff_source_state{source=\"src\",state=\"SOURCE_STATE_RUNNING\"} 0",
           "handoff_sources 1",
           "handoff_store_healthy 1",
           "handoff_store_memtable_bytes 5242880",
           "handoff_store_block_cache_bytes 7000",
           "handoff_page_slots 8",
           "handoff_page_slots_limit 3",
           "handoff_page_slots_held 1",
           "handoff_page_slot_waiters 0",
       }) {
    EXPECT_NE(text.find(expected), std::string::npos) << expected << "\n" << text;
  }
}

TEST(MetricsEndpointTest, BindsAFreePortAndRefusesABadAddress) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto endpoint = MetricsEndpoint::Start("127.0.0.1:0", {registry});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  EXPECT_GT((*endpoint)->port(), 0);
  const auto taken =
      MetricsEndpoint::Start(absl::StrCat("127.0.0.1:", (*endpoint)->port()), {registry});
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace handoff::server
