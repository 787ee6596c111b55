// ProviderSim over HTTP with a plain client: params, cursors, admin, canonical, SSE.
#include "sim/provider_sim.h"

#include <httplib.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "consumer/provider/page_parser.h"
#include "consumer/provider/sse_parser.h"
#include "gtest/gtest.h"

namespace handoff::sim {
namespace {

class ProviderSimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ProviderSimOptions o;
    o.chain.initial_head = 100;
    o.chain.logs_per_block = 3;
    o.heartbeat = absl::Milliseconds(50);
    o.decimal_strings = true;
    sim_ = std::make_unique<ProviderSim>(o);
    absl::StatusOr<int> port = sim_->Start(0);
    ASSERT_TRUE(port.ok());
    client_ = std::make_unique<httplib::Client>("127.0.0.1", *port);
  }

  httplib::Result Pages(const std::string& from, const std::string& source = "s") {
    return client_->Get(absl::StrCat("/v1/pages?chain=sim&source=", source,
                                     "&filter=f&limit=30&from=", from).c_str());
  }

  std::unique_ptr<ProviderSim> sim_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(ProviderSimTest, ServesPagesCursorsAndNoOpPages) {
  auto r = Pages("0");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  absl::StatusOr<consumer::Page> page = consumer::ParsePage(r->body);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->from, 0u);
  EXPECT_EQ(page->through->number, 9u);
  EXPECT_EQ(page->items.size(), 30u);
  EXPECT_EQ(page->tip, 100u);
  EXPECT_EQ(page->finalized->number, 68u);
  // The cursor is bound to the source.
  auto other = Pages(page->next, "other");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 409);
  EXPECT_TRUE(absl::StrContains(other->body, "cursor_mismatch"));
  // At the tip: an empty page with the request cursor unchanged.
  std::string tip = sim_->EncodeCursor("s", "f", {101, 0});
  auto at_tip = Pages(tip);
  absl::StatusOr<consumer::Page> noop = consumer::ParsePage(at_tip->body);
  ASSERT_TRUE(noop.ok());
  EXPECT_TRUE(noop->items.empty());
  EXPECT_EQ(noop->next, tip);
  // Bad requests.
  EXPECT_EQ(client_->Get("/v1/pages?chain=sim&source=s&filter=f")->status, 400);
  EXPECT_EQ(client_->Get("/v1/pages?chain=x&source=s&filter=f&from=0")->status, 400);
  EXPECT_EQ(client_->Get("/v1/pages?chain=sim&source=s&filter=f&from=0&limit=0")->status, 400);
}

// response_delay holds every polled response (the benchmark's farther provider): no
// answer comes sooner than the delay, and the page is the same.
TEST_F(ProviderSimTest, ResponseDelayHoldsEachPolledResponse) {
  // The same page (cursors are sealed per simulator instance, so compared without next).
  absl::StatusOr<consumer::Page> base = consumer::ParsePage(Pages("0")->body);
  ASSERT_TRUE(base.ok()) << base.status();
  ProviderSimOptions o;
  o.chain.initial_head = 100;
  o.chain.logs_per_block = 3;
  o.decimal_strings = true;
  o.response_delay = absl::Milliseconds(50);
  ProviderSim far(o);
  absl::StatusOr<int> port = far.Start(0);
  ASSERT_TRUE(port.ok());
  httplib::Client client("127.0.0.1", *port);
  for (int i = 0; i < 3; ++i) {
    const absl::Time start = absl::Now();
    auto r = client.Get("/v1/pages?chain=sim&source=s&filter=f&limit=30&from=0");
    ASSERT_TRUE(r);
    EXPECT_GE(absl::Now() - start, o.response_delay);
    EXPECT_EQ(r->status, 200);
    absl::StatusOr<consumer::Page> page = consumer::ParsePage(r->body);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_EQ(page->from, base->from);
    ASSERT_EQ(page->items.size(), base->items.size());
    for (size_t k = 0; k < page->items.size(); ++k) {
      EXPECT_EQ(page->items[k].SerializeAsString(), base->items[k].SerializeAsString());
    }
  }
  far.Stop();
}

TEST_F(ProviderSimTest, AdminArmsFaultsAndExposesTheCanonicalChain) {
  ASSERT_EQ(client_->Post("/sim/admin/fault?kind=rate_limited&count=1")->status, 200);
  auto limited = Pages("0");
  EXPECT_EQ(limited->status, 429);
  EXPECT_EQ(limited->get_header_value("Retry-After"), "2");
  EXPECT_EQ(Pages("0")->status, 200);
  EXPECT_EQ(client_->Post("/sim/admin/fault?kind=nope")->status, 400);
  ASSERT_EQ(client_->Post("/sim/admin/fault?kind=chain_unavailable&probability=1")->status, 200);
  EXPECT_EQ(Pages("0")->status, 503);
  EXPECT_EQ(Pages("0")->status, 503);
  ASSERT_EQ(client_->Post("/sim/admin/faults/clear")->status, 200);
  EXPECT_EQ(Pages("0")->status, 200);

  auto reorg = client_->Post("/sim/admin/reorg?depth=2");
  ASSERT_EQ(reorg->status, 200);
  EXPECT_EQ(reorg->body, "{\"fork\":99}");
  auto canonical = client_->Get("/sim/canonical?from=98&to=100");
  ASSERT_EQ(canonical->status, 200);
  std::string wrapped = absl::StrCat(
      R"({"from":0,"through":null,"next":"x","reorg":false,"safe":null,"finalized":null,)",
      R"("tip":null,"items":)",
      canonical->body.substr(canonical->body.find("\"items\":") + 8));
  absl::StatusOr<consumer::Page> page = consumer::ParsePage(wrapped.substr(0, wrapped.size()));
  ASSERT_TRUE(page.ok()) << page.status();
  auto expected = sim_->chain().Canonical(98, 100);
  ASSERT_EQ(page->items.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(page->items[i].SerializeAsString(), expected[i].SerializeAsString());
  }
  EXPECT_EQ(client_->Post("/sim/admin/advance?blocks=5")->body, "{\"head\":105}");
  EXPECT_TRUE(absl::StrContains(client_->Get("/sim/status")->body, "\"head\":105"));
}

TEST_F(ProviderSimTest, StreamsFramesWithIdsAndHeartbeats) {
  httplib::Headers headers = {{"Last-Event-ID", "95"}};
  consumer::SseParser parser(1 << 20);
  std::vector<consumer::SseFrame> frames;
  auto r = client_->Get(
      "/v1/stream?chain=sim&source=s&filter=f&limit=30&from=0", headers,
      [&](const char* data, size_t len) {
        EXPECT_TRUE(parser.Feed(absl::string_view(data, len),
                                [&](consumer::SseFrame&& f) { frames.push_back(std::move(f)); })
                        .ok());
        return frames.size() < 3;  // two pages, then a heartbeat
      });
  ASSERT_EQ(frames.size(), 3u);
  absl::StatusOr<consumer::Page> first = consumer::ParsePage(frames[0].data);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->from, 95u);  // Last-Event-ID wins over from=0
  EXPECT_EQ(frames[0].id, first->next);
  absl::StatusOr<consumer::Page> heartbeat = consumer::ParsePage(frames[2].data);
  ASSERT_TRUE(heartbeat.ok());
  EXPECT_TRUE(heartbeat->items.empty());
  EXPECT_EQ(frames[2].id, frames[1].id);
  auto requests = sim_->Requests();
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests.back().last_event_id, "95");
}

}  // namespace
}  // namespace handoff::sim
