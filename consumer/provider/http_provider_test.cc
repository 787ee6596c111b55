// HttpProvider against the in-process ProviderSim over real loopback HTTP.
#include "consumer/provider/http_provider.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "consumer/provider/curl_session.h"
#include "gtest/gtest.h"
#include "sim/provider_sim.h"

namespace handoff::consumer {
namespace {

using sim::Fault;

constexpr char kToken[] = "s3cr3t-T0KEN-value";

// A provider whose answers are scripted per `from` cursor (/v1/pages and /v1/stream
// alike) and whose requests are counted per cursor: for tests that need one given
// request, and only that one, refused. A one-shot fault of the simulator goes to
// whichever request comes first, the Fetch's own or its prefetch's.
class ScriptedProvider {
 public:
  struct Answer {
    int status = 200;
    std::string body;
    std::string content_type = "application/json";
    std::string retry_after;  // the Retry-After header, when not empty
    bool chunked = false;     // sent in chunks without a Content-Length
  };

  ScriptedProvider() {
    auto handle = [this](const httplib::Request& req, httplib::Response& res) {
      const std::string from = req.get_param_value("from");
      Answer answer{400, R"({"error":"invalid_request","details":{"message":"unscripted"}})"};
      {
        absl::MutexLock lock(&mu_);
        ++requests_[from];
        auto it = answers_.find(from);
        if (it != answers_.end()) answer = it->second;
      }
      if (!answer.retry_after.empty()) res.set_header("Retry-After", answer.retry_after);
      res.status = answer.status;
      if (!answer.chunked) {
        res.set_content(answer.body, answer.content_type.c_str());
        return;
      }
      res.set_chunked_content_provider(
          answer.content_type, [body = answer.body](size_t offset, httplib::DataSink& sink) {
            const size_t n = std::min<size_t>(16 << 10, body.size() - offset);
            if (n > 0 && !sink.write(body.data() + offset, n)) return false;
            if (offset + n == body.size()) sink.done();
            return true;
          });
    };
    server_.Get("/v1/pages", handle);
    server_.Get("/v1/stream", handle);
    port_ = server_.bind_to_any_port("127.0.0.1");
    listener_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() is a no-op until the listen loop runs.
    while (port_ > 0 && !server_.is_running()) std::this_thread::yield();
  }
  ~ScriptedProvider() {
    server_.stop();
    listener_.join();
  }

  std::string base_url() const { return absl::StrCat("http://127.0.0.1:", port_); }

  void Set(const std::string& from, Answer answer) {
    absl::MutexLock lock(&mu_);
    answers_[from] = std::move(answer);
  }

  int Requests(const std::string& from) const {
    absl::MutexLock lock(&mu_);
    auto it = requests_.find(from);
    return it == requests_.end() ? 0 : it->second;
  }

  bool WaitForRequests(const std::string& from, int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = requests_.find(from);
      return it != requests_.end() && it->second >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

  // A valid empty page from `from_block` whose `next` is `next` (it advances).
  static Answer EmptyPage(uint64_t from_block, const std::string& next) {
    return Answer{200, absl::StrCat(R"({"from":)", from_block, R"(,"through":null,"next":")",
                                    next, R"(","reorg":false,"safe":null,"finalized":null,)",
                                    R"("tip":null,"items":[]})")};
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread listener_;
  mutable absl::Mutex mu_;
  std::map<std::string, Answer> answers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> requests_ ABSL_GUARDED_BY(mu_);
};

HttpProviderOptions ScriptedOptions(const ScriptedProvider& server,
                                    handoff::v1::Transport transport) {
  HttpProviderOptions o;
  o.base_url = server.base_url();
  o.chain = "sim";
  o.source = "logs";
  o.filter = "all";
  o.transport = transport;
  o.api_key = kToken;
  o.read_timeout = absl::Seconds(20);
  return o;
}

// Whether `text` holds any `min_length` consecutive bytes of `secret`.
bool HasFragmentOf(absl::string_view text, absl::string_view secret, size_t min_length) {
  for (size_t i = 0; i + min_length <= secret.size(); ++i) {
    if (absl::StrContains(text, secret.substr(i, min_length))) return true;
  }
  return false;
}

class HttpProviderTest : public ::testing::Test {
 protected:
  void SetUp() override { StartSim(sim::ProviderSimOptions()); }

  void StartSim(sim::ProviderSimOptions o) {
    if (sim_) sim_->Stop();
    o.chain.seed = 5;
    o.chain.initial_head = 200;
    o.chain.logs_per_block = 5;
    o.chain.finality_lag = 20;
    o.bearer_token = kToken;
    o.threads = 16;
    if (o.heartbeat == absl::Seconds(30)) o.heartbeat = absl::Seconds(60);
    o.fault_settings.retry_after_seconds = 7;
    o.fault_settings.rate_limit_seconds = 3;
    o.sse_close_delimited = sse_close_delimited_;
    sim_ = std::make_unique<sim::ProviderSim>(o);
    ASSERT_TRUE(sim_->Start(0).ok());
  }

  HttpProviderOptions Options(handoff::v1::Transport transport) {
    HttpProviderOptions o;
    o.base_url = sim_->base_url() + "/";
    o.chain = "sim";
    o.source = "erc20 transfers";  // needs escaping
    o.filter = "all&more=1";
    o.page_limit = 50;
    o.transport = transport;
    o.api_key = kToken;
    o.read_timeout = absl::Seconds(20);
    o.max_prefetch_age = absl::Hours(1);  // however long the test is descheduled
    return o;
  }

  // An adapter whose pages take slots of `budget`, as every source's in handoffd.
  std::unique_ptr<HttpProvider> MakeUnder(handoff::v1::Transport transport,
                                          std::shared_ptr<PageBudget> budget) {
    HttpProviderOptions o = Options(transport);
    o.page_budget = std::move(budget);
    return Make(std::move(o));
  }

  std::unique_ptr<HttpProvider> Make(HttpProviderOptions o) {
    auto p = HttpProvider::Create(std::move(o));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  static Page ExpectPage(FetchResult r) {
    EXPECT_TRUE(r.page.has_value()) << (r.refusal ? r.refusal->message : "");
    return r.page ? *std::move(r.page) : Page();
  }

  static void ExpectNoSecret(const FetchResult& r) {
    if (r.refusal) {
      EXPECT_FALSE(absl::StrContains(r.refusal->message, kToken)) << r.refusal->message;
      EXPECT_FALSE(absl::StrContains(r.refusal->code, kToken));
      EXPECT_FALSE(absl::StrContains(r.refusal->funding_action_json, kToken));
    }
  }

  std::vector<sim::RequestRecord> StreamRequests() {
    std::vector<sim::RequestRecord> out;
    for (auto& r : sim_->Requests()) {
      if (r.path == "/v1/stream") out.push_back(r);
    }
    return out;
  }

  // The SSE tests run over both body framings a server may use: chunked, and
  // delimited by the connection's close (no length, no chunks).
  void CheckSseWalkFromTheCommittedCursor();
  void CheckSseReconnectsAfterDropsAndControls();

  bool sse_close_delimited_ = false;
  std::unique_ptr<sim::ProviderSim> sim_;
};

TEST_F(HttpProviderTest, PollWalksTheChainAndMatchesCanonical) {
  auto p = Make(Options(handoff::v1::TRANSPORT_POLL));
  std::string cursor = "0";
  std::vector<handoff::v1::EventRow> rows;
  for (int i = 0; i < 100; ++i) {
    Page page = ExpectPage(p->Fetch(cursor));
    if (page.items.empty() && page.next == cursor) break;  // nothing new yet
    EXPECT_FALSE(page.reorg);
    rows.insert(rows.end(), page.items.begin(), page.items.end());
    cursor = page.next;
  }
  auto canonical = sim_->chain().Canonical(0, 200);
  ASSERT_EQ(rows.size(), canonical.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].SerializeAsString(), canonical[i].SerializeAsString()) << i;
  }
  for (const auto& r : sim_->Requests()) {
    EXPECT_TRUE(r.authorized);
    EXPECT_FALSE(r.has_last_event_id);
  }
  // "latest" resolves to a real cursor at the head.
  Page latest = ExpectPage(p->Fetch("latest"));
  EXPECT_NE(latest.next, "latest");
  EXPECT_TRUE(latest.items.empty());
}

// Polled requests lease pooled sessions: caught-up sources polling one after another
// share one kept-alive connection instead of opening one each, a Close() makes the
// next poll open a new connection, and sources catching up lease sessions the same way.
TEST_F(HttpProviderTest, PollsOfManySourcesShareWarmConnections) {
  auto pool = std::make_shared<CurlSessionPool>(4);
  std::vector<std::unique_ptr<HttpProvider>> providers;
  for (int i = 0; i < 20; ++i) {
    HttpProviderOptions o = Options(handoff::v1::TRANSPORT_POLL);
    o.poll_prefetch = false;
    o.session_pool = pool;
    providers.push_back(Make(std::move(o)));
  }
  const std::string head = ExpectPage(providers[0]->Fetch("latest")).next;
  for (auto& p : providers) {
    Page page = ExpectPage(p->Fetch(head));
    ASSERT_TRUE(page.items.empty());
    ASSERT_EQ(page.next, head);  // caught up: nothing new
  }
  auto ports = [&] {
    std::vector<int> out;
    for (const auto& r : sim_->Requests()) out.push_back(r.remote_port);
    return out;
  };
  const std::vector<int> caught_up = ports();
  ASSERT_EQ(caught_up.size(), 21u);
  EXPECT_EQ(std::set<int>(caught_up.begin(), caught_up.end()).size(), 1u)
      << "each poll should reuse the warm connection";
  EXPECT_EQ(pool->stats().created, 1);
  EXPECT_EQ(pool->stats().idle, 1);

  providers[7]->Close();
  ExpectPage(providers[7]->Fetch(head));
  ExpectPage(providers[8]->Fetch(head));
  std::vector<int> after_close = ports();
  ASSERT_EQ(after_close.size(), 23u);
  EXPECT_NE(after_close[21], after_close[20]) << "Close() must drop the connection";
  EXPECT_EQ(after_close[22], after_close[21]);

  // Catching up (a page with events): the source gives its session back after each
  // page too, and a caught-up source polling in between reuses the same connection.
  Page first = ExpectPage(providers[0]->Fetch("0"));
  ASSERT_FALSE(first.items.empty());
  EXPECT_EQ(pool->stats().idle, 1);
  ExpectPage(providers[1]->Fetch(head));
  ExpectPage(providers[0]->Fetch(first.next));
  std::vector<int> mixed = ports();
  ASSERT_EQ(mixed.size(), 26u);
  EXPECT_EQ(mixed[24], mixed[23]);
  EXPECT_EQ(mixed[25], mixed[23]) << "one warm connection serves both";
  EXPECT_EQ(pool->stats().created, 1);
}

// Sources catching up at the same time hold as many sessions as they have requests in
// flight, here two, and no more once their requests are done.
TEST_F(HttpProviderTest, SourcesCatchingUpHoldNoSessionBetweenPages) {
  auto pool = std::make_shared<CurlSessionPool>(4);
  auto make = [&] {
    HttpProviderOptions o = Options(handoff::v1::TRANSPORT_POLL);
    o.poll_prefetch = false;
    o.session_pool = pool;
    return Make(std::move(o));
  };
  std::unique_ptr<HttpProvider> a = make();
  std::unique_ptr<HttpProvider> b = make();
  Page pa = ExpectPage(a->Fetch("0"));
  Page pb = ExpectPage(b->Fetch("0"));
  ASSERT_FALSE(pa.items.empty());
  ASSERT_FALSE(pb.items.empty());
  // One after the other: one session, given back after each page.
  EXPECT_EQ(pool->stats().created, 1);
  EXPECT_EQ(pool->stats().idle, 1);
  std::thread other([&] { ExpectPage(b->Fetch(pb.next)); });
  ExpectPage(a->Fetch(pa.next));
  other.join();
  EXPECT_LE(pool->stats().created, 2);
  EXPECT_EQ(pool->stats().idle, pool->stats().created);
  a.reset();
  b.reset();
  EXPECT_EQ(pool->stats().idle, pool->stats().created);
}

// Concurrent polls lease distinct sessions (one request per session at a time), and
// the pool keeps no more idle sessions than its bound.
TEST_F(HttpProviderTest, ConcurrentPollsLeaseDistinctSessions) {
  auto pool = std::make_shared<CurlSessionPool>(2);
  std::vector<std::thread> threads;
  std::atomic<int> pages{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      HttpProviderOptions o = Options(handoff::v1::TRANSPORT_POLL);
      o.session_pool = pool;
      auto p = Make(std::move(o));
      std::string cursor = "0";
      for (int i = 0; i < 5; ++i) {
        FetchResult r = p->Fetch(cursor);
        if (!r.page.has_value()) continue;
        ++pages;
        cursor = r.page->next;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(pages.load(), 30);
  EXPECT_LE(pool->stats().idle, 2);
  EXPECT_GE(pool->stats().created, 2);
}

// The prefetched page is handed out only to Fetch(next) and equals a fresh request's
// page; a Fetch of any other cursor (a commit that failed) or a Close() discards it.
TEST_F(HttpProviderTest, PollPrefetchIsHandedOutOnlyForTheCommittedNext) {
  auto p = Make(Options(handoff::v1::TRANSPORT_POLL));
  HttpProviderOptions plain_options = Options(handoff::v1::TRANSPORT_POLL);
  plain_options.poll_prefetch = false;
  auto plain = Make(std::move(plain_options));
  Page first = ExpectPage(p->Fetch("0"));
  ASSERT_FALSE(first.items.empty());
  ASSERT_NE(first.next, "0");
  // The commit "failed": the engine asks for "0" again and gets the same page.
  Page again = ExpectPage(p->Fetch("0"));
  EXPECT_EQ(again.from, first.from);
  EXPECT_EQ(again.next, first.next);
  EXPECT_EQ(again.items.size(), first.items.size());
  // Committed: Fetch(next) gets what a fresh, unprefetched request gets.
  Page second = ExpectPage(p->Fetch(first.next));
  Page fresh = ExpectPage(plain->Fetch(first.next));
  EXPECT_EQ(second.from, fresh.from);
  EXPECT_EQ(second.next, fresh.next);
  ASSERT_EQ(second.items.size(), fresh.items.size());
  for (size_t i = 0; i < fresh.items.size(); ++i) {
    EXPECT_EQ(second.items[i].SerializeAsString(), fresh.items[i].SerializeAsString()) << i;
  }
  // A Close() drops the speculation; the next Fetch still answers correctly.
  p->Close();
  Page third = ExpectPage(p->Fetch(second.next));
  EXPECT_EQ(third.from, ExpectPage(plain->Fetch(second.next)).from);
}

// The prefetch chain keeps two pages fetched ahead of the engine, each under a slot, and
// follows the pages as the engine takes them; a Fetch of any other cursor drops the
// chain and gives its slots back.
TEST_F(HttpProviderTest, PollPrefetchChainStaysTwoPagesAheadAndAMissDropsIt) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(8);
  auto p = MakeUnder(handoff::v1::TRANSPORT_POLL, budget);
  HttpProviderOptions plain_options = Options(handoff::v1::TRANSPORT_POLL);
  plain_options.poll_prefetch = false;
  auto plain = Make(std::move(plain_options));
  const size_t before = sim_->Requests().size();
  std::optional<Page> first = ExpectPage(p->Fetch("0"));
  ASSERT_TRUE(sim_->WaitForRequests(before + 3, absl::Seconds(10)));
  const Page second_fresh = ExpectPage(plain->Fetch(first->next));
  const Page third_fresh = ExpectPage(plain->Fetch(second_fresh.next));
  std::vector<sim::RequestRecord> requests = sim_->Requests();
  EXPECT_EQ(requests[before].from, "0");
  EXPECT_EQ(requests[before + 1].from, first->next);
  EXPECT_EQ(requests[before + 2].from, second_fresh.next);
  EXPECT_TRUE(p->Ready(first->next));
  EXPECT_EQ(budget->held(), 3u);  // the page and the two fetched ahead
  // The engine takes the next page: the chain fetches one more.
  std::optional<Page> second = ExpectPage(p->Fetch(first->next));
  EXPECT_EQ(second->from, second_fresh.from);
  ASSERT_EQ(second->items.size(), second_fresh.items.size());
  for (size_t i = 0; i < second->items.size(); ++i) {
    EXPECT_EQ(second->items[i].SerializeAsString(), second_fresh.items[i].SerializeAsString());
  }
  ASSERT_TRUE(sim_->WaitForRequests(before + 6, absl::Seconds(10)));  // 2 were `plain`'s
  requests = sim_->Requests();
  EXPECT_EQ(requests.back().from, third_fresh.next);
  // A miss (the commit of `second` failed, its cursor is read again): the chain's two
  // pages and their slots are dropped.
  const std::string first_next = first->next;
  first.reset();
  std::optional<Page> again = ExpectPage(p->Fetch(first_next));
  EXPECT_EQ(again->from, second_fresh.from);
  second.reset();
  again.reset();
  // What remains held is the new chain's, started after `again`: at most two pages.
  EXPECT_LE(budget->held(), 2u);
  p.reset();
  EXPECT_EQ(budget->held(), 0u);
}

// A halted source's provider is cancelled and closed, then kept until an operator acts:
// Close gives the slots of the pages fetched ahead back to the shared budget at once,
// so that the other sources are not left waiting for them.
TEST_F(HttpProviderTest, CloseGivesThePrefetchedPagesSlotsBack) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(3);
  auto p = MakeUnder(handoff::v1::TRANSPORT_POLL, budget);
  const size_t before = sim_->Requests().size();
  std::optional<Page> first = ExpectPage(p->Fetch("0"));
  // The chain holds the other two slots, and waits for room (the engine has not taken
  // a page it fetched).
  ASSERT_TRUE(sim_->WaitForRequests(before + 3, absl::Seconds(10)));
  EXPECT_EQ(budget->held(), 3u);
  p->Cancel();
  p->Close();
  // Another source's two pages get their slots (the provider is still alive).
  std::atomic<bool> give_up{false};
  absl::Notification acquired;
  std::vector<PageSlot> others;
  std::thread other([&] {
    for (int i = 0; i < 2; ++i) {
      std::optional<PageSlot> slot = budget->Acquire([&] { return give_up.load(); });
      if (!slot.has_value()) return;
      others.push_back(*std::move(slot));
    }
    acquired.Notify();
  });
  EXPECT_TRUE(acquired.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << budget->held() << " slots held";
  give_up.store(true);
  budget->WakeWaiters();
  other.join();
  EXPECT_TRUE(first->slot.held());  // the page the engine has is its own to release
}

// Every page is fetched under a slot of the shared PageBudget and holds it until it is
// destroyed; a Fetch without a free slot waits for one (and Cancel ends the wait); a
// prefetch takes a slot only when one is free.
TEST_F(HttpProviderTest, PollFetchesUnderAPageSlotAndWaitsForOne) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(2);
  auto p = MakeUnder(handoff::v1::TRANSPORT_POLL, budget);
  const size_t before = sim_->Requests().size();
  std::optional<Page> first = ExpectPage(p->Fetch("0"));
  EXPECT_TRUE(first->slot.held());
  // The page and the prefetch of its next hold both slots.
  ASSERT_TRUE(sim_->WaitForRequests(before + 2, absl::Seconds(10)));
  EXPECT_EQ(budget->held(), 2u);
  // The engine rereads "0" (a failed commit): the prefetch is dropped (its slot too) and
  // this Fetch takes the free slot. No slot is left for a prefetch of the next page.
  std::optional<Page> again = ExpectPage(p->Fetch("0"));
  EXPECT_EQ(budget->held(), 2u);
  const size_t requests = sim_->Requests().size();
  // Both slots are held by pages the engine has not released: the next Fetch waits.
  absl::Notification done;
  FetchResult result;
  std::thread fetcher([&] {
    result = p->Fetch(again->next);
    done.Notify();
  });
  while (budget->waiting() != 1) std::this_thread::yield();
  EXPECT_FALSE(done.HasBeenNotified());
  EXPECT_EQ(sim_->Requests().size(), requests);  // nothing requested without a slot
  first.reset();  // the engine releases a page: the waiting Fetch goes on
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  fetcher.join();
  ASSERT_TRUE(result.page.has_value());
  EXPECT_TRUE(result.page->slot.held());
  EXPECT_EQ(budget->held(), 2u);
  EXPECT_LE(budget->peak_held(), 2u);
  again.reset();
  result.page.reset();
  EXPECT_EQ(budget->held(), 0u);
}

TEST_F(HttpProviderTest, CancelEndsAFetchWaitingForAPageSlot) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(1);
  std::optional<PageSlot> taken = budget->TryAcquire();  // another source's page
  ASSERT_TRUE(taken.has_value());
  for (handoff::v1::Transport t : {handoff::v1::TRANSPORT_POLL, handoff::v1::TRANSPORT_SSE}) {
    SCOPED_TRACE(t);
    auto p = MakeUnder(t, budget);
    absl::Notification done;
    FetchResult result;
    std::thread fetcher([&] {
      result = p->Fetch("0");
      done.Notify();
    });
    // Polling: the Fetch waits for a slot; SSE: the reader does, with a parsed page.
    while (budget->waiting() != 1) std::this_thread::yield();
    EXPECT_FALSE(done.HasBeenNotified());
    p->Cancel();
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    fetcher.join();
    ASSERT_TRUE(result.refusal.has_value());
    EXPECT_EQ(result.refusal->kind, RefusalKind::kCancelled);
    p.reset();  // the reader is gone too
    EXPECT_EQ(budget->waiting(), 0u);
    EXPECT_EQ(budget->held(), 1u);  // only the other source's page
  }
}

// A worker about to wait long (a hold, a retry) drops what was fetched ahead, so that no
// slot is held for the length of the wait; the next Fetch asks again.
TEST_F(HttpProviderTest, DropReadAheadGivesBackTheSlotsOfPagesFetchedAhead) {
  for (handoff::v1::Transport t : {handoff::v1::TRANSPORT_POLL, handoff::v1::TRANSPORT_SSE}) {
    SCOPED_TRACE(t);
    std::shared_ptr<PageBudget> budget = PageBudget::Create(8);
    auto p = MakeUnder(t, budget);
    std::optional<Page> first = ExpectPage(p->Fetch("0"));
    // The prefetch, or the stream's buffered pages, take slots beside the page's.
    while (budget->held() < 2) std::this_thread::yield();
    p->DropReadAhead();
    EXPECT_EQ(budget->held(), 1u);  // the engine's page only
    const std::string next = first->next;
    const uint64_t from = first->through->number + 1;
    first.reset();
    EXPECT_EQ(budget->held(), 0u);
    Page second = ExpectPage(p->Fetch(next));
    EXPECT_EQ(second.from, from);
    EXPECT_TRUE(second.slot.held());
  }
}

TEST_F(HttpProviderTest, SseQueuesPagesOnlyUnderPageSlots) {
  std::shared_ptr<PageBudget> budget = PageBudget::Create(1);
  auto p = MakeUnder(handoff::v1::TRANSPORT_SSE, budget);
  std::optional<Page> first = ExpectPage(p->Fetch("0"));
  EXPECT_TRUE(first->slot.held());
  // The reader has the next frame but no slot to parse it under (a source waiting for a
  // slot holds the frame's bytes, not a parsed page): it waits, and Fetch would wait
  // for it.
  while (budget->waiting() != 1) std::this_thread::yield();
  EXPECT_FALSE(p->Ready(first->next));
  const std::string next = first->next;
  first.reset();
  Page second = ExpectPage(p->Fetch(next));
  EXPECT_TRUE(second.slot.held());
  EXPECT_FALSE(second.items.empty());
  EXPECT_EQ(budget->peak_held(), 1u);
}

// Ready(c): Fetch(c) would return at once. The worker publishes its last page before a
// Fetch that would wait, so a wrong "true" delays progress and a wrong "false" costs
// only the overlap of one sync.
TEST_F(HttpProviderTest, ReadyTellsWhetherAFetchWouldReturnAtOnce) {
  auto until_ready = [](HttpProvider* p, const std::string& cursor) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!p->Ready(cursor) && absl::Now() < deadline) std::this_thread::yield();
    return p->Ready(cursor);
  };
  // Polling: the provider answers a poll at once, so a Fetch is one exchange away
  // unless a prefetch of another cursor runs (it would be stopped first).
  auto poll = Make(Options(handoff::v1::TRANSPORT_POLL));
  EXPECT_TRUE(poll->Ready("0"));  // nothing prefetched: the poll goes out now
  Page first = ExpectPage(poll->Fetch("0"));
  ASSERT_NE(first.next, "0");
  EXPECT_TRUE(until_ready(poll.get(), first.next));
  EXPECT_FALSE(poll->Ready("0"));  // a prefetch of another cursor runs
  EXPECT_FALSE(ExpectPage(poll->Fetch(first.next)).items.empty());
  HttpProviderOptions plain_options = Options(handoff::v1::TRANSPORT_POLL);
  plain_options.poll_prefetch = false;
  auto plain = Make(std::move(plain_options));
  Page plain_first = ExpectPage(plain->Fetch("0"));
  EXPECT_TRUE(plain->Ready(plain_first.next));

  // SSE: ready once the stream from that cursor has buffered the next page.
  auto stream = Make(Options(handoff::v1::TRANSPORT_SSE));
  EXPECT_FALSE(stream->Ready("0"));  // no stream yet
  Page s1 = ExpectPage(stream->Fetch("0"));
  EXPECT_TRUE(until_ready(stream.get(), s1.next));
  EXPECT_FALSE(stream->Ready("0"));  // the stream does not continue from there
  // At the head (the simulator's heartbeat is 60 s) the stream waits: not ready.
  auto head = Make(Options(handoff::v1::TRANSPORT_SSE));
  const std::string tip = sim_->EncodeCursor("erc20 transfers", "all&more=1", {201, 0});
  const size_t before = sim_->Requests().size();
  std::thread fetcher([&] { head->Fetch(tip); });
  ASSERT_TRUE(sim_->WaitForRequests(before + 1, absl::Seconds(10)));  // the stream is open
  EXPECT_FALSE(head->Ready(tip));
  head->Cancel();
  fetcher.join();
  EXPECT_TRUE(head->Ready(tip));  // cancelled: every Fetch returns at once
}

struct RefusalCase {
  Fault fault;
  RefusalKind kind;
  int status;
  std::string code;
  std::optional<absl::Duration> retry_after;
};

TEST_F(HttpProviderTest, PollRefusalsFollowTheContractTable) {
  HttpProviderOptions o = Options(handoff::v1::TRANSPORT_POLL);
  // Each armed one-shot fault must reach the request this test makes next; a speculative
  // prefetch after the previous page could take it (PollPrefetch* tests cover prefetch).
  o.poll_prefetch = false;
  auto p = Make(std::move(o));
  std::vector<RefusalCase> cases = {
      {Fault::kChainUnavailable, RefusalKind::kRetryAfter, 503, "chain_unavailable", absl::Seconds(7)},
      {Fault::kRateLimited, RefusalKind::kRetryAfter, 429, "rate_limited", absl::Seconds(3)},
      {Fault::kServerError, RefusalKind::kTransient, 500, "internal", std::nullopt},
      {Fault::kResyncRequired, RefusalKind::kResyncRequired, 409, "resync_required", std::nullopt},
      {Fault::kPaymentRequired, RefusalKind::kFundingRequired, 402, "insufficient_credit", std::nullopt},
      {Fault::kTruncatedBody, RefusalKind::kTransient, 0, "network", std::nullopt},
      {Fault::kDropConnection, RefusalKind::kTransient, 0, "network", std::nullopt},
  };
  for (const RefusalCase& c : cases) {
    SCOPED_TRACE(std::string(sim::FaultName(c.fault)));
    sim_->ArmFault(c.fault);
    FetchResult r = p->Fetch("10");
    ASSERT_TRUE(r.refusal.has_value());
    EXPECT_EQ(r.refusal->kind, c.kind);
    EXPECT_EQ(r.refusal->http_status, c.status);
    EXPECT_EQ(r.refusal->code, c.code);
    EXPECT_EQ(r.refusal->retry_after, c.retry_after);
    ExpectNoSecret(r);
    if (c.kind == RefusalKind::kFundingRequired) {
      EXPECT_TRUE(absl::StrContains(r.refusal->funding_action_json, "\"next_action\":{"));
      EXPECT_TRUE(absl::StrContains(r.refusal->funding_action_json, "\"challenges\":["));
      EXPECT_TRUE(absl::StrContains(r.refusal->funding_action_json, "\"credit\":{"));
    }
    // Refusals never move anything: the same cursor works next.
    Page page = ExpectPage(p->Fetch("10"));
    EXPECT_EQ(page.from, 10u);
  }
  // 409 cursor_mismatch: a cursor of another source.
  FetchResult mismatch = p->Fetch(sim_->EncodeCursor("other", "all", {5, 0}));
  ASSERT_TRUE(mismatch.refusal);
  EXPECT_EQ(mismatch.refusal->kind, RefusalKind::kConfigInvalid);
  EXPECT_EQ(mismatch.refusal->http_status, 409);
  EXPECT_EQ(mismatch.refusal->code, "cursor_mismatch");
  // 400 invalid_request: not a cursor.
  FetchResult bad = p->Fetch("garbage!");
  ASSERT_TRUE(bad.refusal);
  EXPECT_EQ(bad.refusal->kind, RefusalKind::kConfigInvalid);
  EXPECT_EQ(bad.refusal->http_status, 400);
  EXPECT_EQ(bad.refusal->code, "invalid_request");
}

TEST_F(HttpProviderTest, AuthRefusalsNeverCarryTheKey) {
  HttpProviderOptions none = Options(handoff::v1::TRANSPORT_POLL);
  none.api_key.clear();
  FetchResult r401 = Make(none)->Fetch("0");
  ASSERT_TRUE(r401.refusal);
  EXPECT_EQ(r401.refusal->kind, RefusalKind::kAuthFailed);
  EXPECT_EQ(r401.refusal->http_status, 401);
  HttpProviderOptions wrong = Options(handoff::v1::TRANSPORT_SSE);
  wrong.api_key = std::string(kToken) + "-wrong";
  FetchResult r403 = Make(wrong)->Fetch("0");
  ASSERT_TRUE(r403.refusal);
  EXPECT_EQ(r403.refusal->kind, RefusalKind::kAuthFailed);
  EXPECT_EQ(r403.refusal->http_status, 403);
  ExpectNoSecret(r403);
  // A provider echoing the key would still not leak it.
  Refusal echoed = ClassifyRefusal(400, std::string(R"({"error":"invalid_request","details":{"message":"bad )") + kToken + "\"}}",
                                   std::nullopt, std::nullopt);
  EXPECT_TRUE(absl::StrContains(echoed.message, kToken));  // ClassifyRefusal itself is raw
  HttpProviderOptions unknown_chain = Options(handoff::v1::TRANSPORT_POLL);
  unknown_chain.chain = "nope";
  FetchResult r400 = Make(unknown_chain)->Fetch("0");
  ASSERT_TRUE(r400.refusal);
  EXPECT_EQ(r400.refusal->kind, RefusalKind::kConfigInvalid);
  EXPECT_EQ(r400.refusal->http_status, 400);
}

TEST_F(HttpProviderTest, ClassifiesControlsAndHeaders) {
  Refusal c = ClassifyRefusal(0, R"({"error":"chain_unavailable","retry_after":5})", std::nullopt, std::nullopt);
  EXPECT_EQ(c.kind, RefusalKind::kRetryAfter);
  EXPECT_EQ(c.retry_after, absl::Seconds(5));
  Refusal f = ClassifyRefusal(0, R"({"error":{"code":"payment_required","message":"m","next_action":{"a":1}}})",
                              std::nullopt, 60000);
  EXPECT_EQ(f.kind, RefusalKind::kFundingRequired);
  EXPECT_EQ(f.funding_action_json, R"({"next_action":{"a":1}})");
  EXPECT_EQ(f.retry_after, absl::Seconds(60));
  EXPECT_EQ(ClassifyRefusal(0, R"({"error":"resync_required"})", {}, {}).kind, RefusalKind::kResyncRequired);
  EXPECT_EQ(ClassifyRefusal(0, R"({"error":"cursor_mismatch"})", {}, {}).kind, RefusalKind::kConfigInvalid);
  EXPECT_EQ(ClassifyRefusal(0, "not json", {}, {}).kind, RefusalKind::kTransient);
  EXPECT_EQ(ClassifyRefusal(503, "<html>", {}, {}).kind, RefusalKind::kTransient);
  EXPECT_EQ(ClassifyRefusal(502, "", {}, {}).kind, RefusalKind::kTransient);
  EXPECT_EQ(ClassifyRefusal(404, "", {}, {}).kind, RefusalKind::kConfigInvalid);
  EXPECT_EQ(ClassifyRefusal(429, "", absl::Seconds(9), {}).retry_after, absl::Seconds(9));
  // The delay may sit in `details`; the body's wins over the header's.
  Refusal d = ClassifyRefusal(503, R"({"error":"chain_unavailable","details":{"retry_after":7}})",
                              absl::Seconds(2), {});
  EXPECT_EQ(d.kind, RefusalKind::kRetryAfter);
  EXPECT_EQ(d.retry_after, absl::Seconds(7));
}

// The contract's timings are the defaults: a stream silent for 60 s is dropped (the
// provider writes at least every 30 s), and a spec's options keep them.
TEST(HttpProviderOptionsTest, DefaultsFollowTheContract) {
  EXPECT_EQ(HttpProviderOptions().sse_silence_timeout, absl::Seconds(60));
  EXPECT_EQ(HttpProviderOptions().read_timeout, absl::Seconds(30));
  handoff::v1::SourceSpec spec;
  spec.set_provider_url("http://127.0.0.1:8545");
  spec.set_chain("sim");
  spec.set_source("logs");
  spec.set_filter("all");
  spec.set_transport(handoff::v1::TRANSPORT_SSE);
  EXPECT_EQ(OptionsForSpec(spec).sse_silence_timeout, absl::Seconds(60));
}

TEST_F(HttpProviderTest, PageSizeLimitAbortsTheTransfer) {
  for (auto transport : {handoff::v1::TRANSPORT_POLL, handoff::v1::TRANSPORT_SSE}) {
    HttpProviderOptions o = Options(transport);
    o.max_page_bytes = 4096;
    FetchResult r = Make(o)->Fetch("0");
    ASSERT_TRUE(r.refusal) << transport;
    EXPECT_EQ(r.refusal->kind, RefusalKind::kMalformedPage);
    EXPECT_EQ(r.refusal->code, "page_too_large");
  }
}

// A page of 70000 bytes that the default cap (64 MiB) accepts: a lower max_page_bytes
// refuses it as page_too_large, by its Content-Length or, sent in chunks, once the body
// passes the cap; a cap of exactly its size accepts it. An SSE frame is allowed the cap
// and 4 KiB of framing: 70000 data bytes pass 64 KiB + 4 KiB.
TEST(HttpProviderScriptedTest, ALowerPageCapRefusesAPageTheDefaultAccepts) {
  constexpr size_t kPageBytes = 70000;
  ScriptedProvider server;
  std::string page = ScriptedProvider::EmptyPage(10, "next").body;
  page.resize(kPageBytes, ' ');  // JSON whitespace after the object
  server.Set("length", {200, page});
  server.Set("chunked", {200, page, "application/json", "", /*chunked=*/true});
  server.Set("sse", {200, absl::StrCat("id: next\ndata: ", page, "\n\n"), "text/event-stream"});
  struct Case {
    handoff::v1::Transport transport;
    std::string cursor;
    size_t max_page_bytes;  // 0: the default
    bool accepted;
  };
  const Case cases[] = {
      {handoff::v1::TRANSPORT_POLL, "length", 0, true},
      {handoff::v1::TRANSPORT_POLL, "length", kPageBytes, true},
      {handoff::v1::TRANSPORT_POLL, "length", kPageBytes - 1, false},
      {handoff::v1::TRANSPORT_POLL, "length", 64 << 10, false},
      {handoff::v1::TRANSPORT_POLL, "chunked", 0, true},
      {handoff::v1::TRANSPORT_POLL, "chunked", kPageBytes, true},
      {handoff::v1::TRANSPORT_POLL, "chunked", kPageBytes - 1, false},
      {handoff::v1::TRANSPORT_POLL, "chunked", 64 << 10, false},
      {handoff::v1::TRANSPORT_SSE, "sse", 0, true},
      {handoff::v1::TRANSPORT_SSE, "sse", 64 << 10, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.cursor, " under ", c.max_page_bytes));
    HttpProviderOptions o = ScriptedOptions(server, c.transport);
    ASSERT_EQ(o.max_page_bytes, size_t{64} << 20);
    if (c.max_page_bytes != 0) o.max_page_bytes = c.max_page_bytes;
    o.poll_prefetch = false;
    absl::StatusOr<std::unique_ptr<HttpProvider>> p = HttpProvider::Create(o);
    ASSERT_TRUE(p.ok()) << p.status();
    FetchResult r = (*p)->Fetch(c.cursor);
    if (c.accepted) {
      ASSERT_TRUE(r.page.has_value()) << r.refusal->message;
      EXPECT_EQ(r.page->next, "next");
      continue;
    }
    ASSERT_TRUE(r.refusal.has_value());
    EXPECT_EQ(r.refusal->kind, RefusalKind::kMalformedPage);
    EXPECT_EQ(r.refusal->http_status, 200);
    EXPECT_EQ(r.refusal->code, "page_too_large");
    EXPECT_TRUE(absl::StrContains(r.refusal->message,
                                  absl::StrCat("max_page_bytes (", c.max_page_bytes, ")")))
        << r.refusal->message;
    EXPECT_FALSE(HasFragmentOf(r.refusal->message, kToken, 6)) << r.refusal->message;
  }
}

TEST_F(HttpProviderTest, SseStreamsFromTheCommittedCursorWithLastEventId) {
  CheckSseWalkFromTheCommittedCursor();
}

TEST_F(HttpProviderTest, CloseDelimitedSseStreamsFromTheCommittedCursor) {
  sse_close_delimited_ = true;
  StartSim(sim::ProviderSimOptions());
  CheckSseWalkFromTheCommittedCursor();
}

void HttpProviderTest::CheckSseWalkFromTheCommittedCursor() {
  auto p = Make(Options(handoff::v1::TRANSPORT_SSE));
  std::string cursor = "0";
  std::vector<handoff::v1::EventRow> rows;
  for (int i = 0; i < 21; ++i) {  // 10 blocks of 5 logs per page: 21 pages to block 200
    Page page = ExpectPage(p->Fetch(cursor));
    ASSERT_FALSE(page.items.empty());
    rows.insert(rows.end(), page.items.begin(), page.items.end());
    cursor = page.next;
  }
  EXPECT_EQ(rows.size(), sim_->chain().Canonical(0, 200).size());
  auto streams = StreamRequests();
  ASSERT_EQ(streams.size(), 1u);  // one connection for the whole walk
  EXPECT_TRUE(streams[0].has_last_event_id);
  EXPECT_EQ(streams[0].last_event_id, "0");
  EXPECT_TRUE(streams[0].authorized);

  // The engine did not commit the last page: Fetch from the older cursor reconnects.
  Page a = ExpectPage(p->Fetch("50"));
  Page b = ExpectPage(p->Fetch(a.next));
  Page b_again = ExpectPage(p->Fetch(a.next));  // b was not committed
  EXPECT_EQ(b_again.from, b.from);
  EXPECT_EQ(b_again.next, b.next);
  streams = StreamRequests();
  ASSERT_EQ(streams.size(), 3u);
  EXPECT_EQ(streams[1].last_event_id, "50");
  EXPECT_EQ(streams[2].last_event_id, a.next);
  EXPECT_EQ(streams[2].from, a.next);
}

TEST_F(HttpProviderTest, SseLatestSendsNoLastEventId) {
  auto p = Make(Options(handoff::v1::TRANSPORT_SSE));
  Page page = ExpectPage(p->Fetch("latest"));
  EXPECT_TRUE(page.items.empty());
  EXPECT_NE(page.next, "latest");
  auto streams = StreamRequests();
  ASSERT_EQ(streams.size(), 1u);
  EXPECT_FALSE(streams[0].has_last_event_id);
  EXPECT_EQ(streams[0].from, "latest");
  // New blocks arrive on the open stream.
  sim_->chain().AddBlocks(1);
  Page next = ExpectPage(p->Fetch(page.next));
  EXPECT_EQ(next.from, 201u);
  EXPECT_EQ(next.items.size(), 5u);
  EXPECT_EQ(StreamRequests().size(), 1u);
}

// Fetches from the committed cursor until a refusal, committing every page.
FetchResult UntilRefusal(HttpProvider* p, std::string* cursor) {
  for (int i = 0; i < 100000; ++i) {
    FetchResult r = p->Fetch(*cursor);
    if (r.refusal) return r;
    *cursor = r.page->next;
  }
  ADD_FAILURE() << "no refusal";
  return FetchResult();
}

TEST_F(HttpProviderTest, SseReconnectsFromCommittedCursorAfterDropsAndControls) {
  CheckSseReconnectsAfterDropsAndControls();
}

TEST_F(HttpProviderTest, CloseDelimitedSseReconnectsAfterDropsAndControls) {
  sse_close_delimited_ = true;
  CheckSseReconnectsAfterDropsAndControls();
}

void HttpProviderTest::CheckSseReconnectsAfterDropsAndControls() {
  sim::ProviderSimOptions o;
  o.heartbeat = absl::Milliseconds(100);  // at the tip, a reconnect gets a heartbeat soon
  StartSim(o);
  auto p = Make(Options(handoff::v1::TRANSPORT_SSE));
  std::string cursor = "0";
  cursor = ExpectPage(p->Fetch(cursor)).next;
  struct Case {
    Fault fault;
    RefusalKind kind;
    std::string code;
  };
  // A dropped connection is a transport error in a chunked body, but the end of a
  // close-delimited one (HTTP cannot tell it from the server finishing): both are
  // transient, and an unfinished frame is discarded either way.
  const std::string dropped = sse_close_delimited_ ? "stream_closed" : "network";
  for (const Case& c : std::vector<Case>{
           {Fault::kDropConnection, RefusalKind::kTransient, dropped},
           {Fault::kIncompleteSseFrame, RefusalKind::kTransient, dropped},
           {Fault::kChainUnavailable, RefusalKind::kRetryAfter, "chain_unavailable"},
           {Fault::kResyncRequired, RefusalKind::kResyncRequired, "resync_required"},
           {Fault::kPaymentRequired, RefusalKind::kFundingRequired, "insufficient_credit"},
       }) {
    SCOPED_TRACE(std::string(sim::FaultName(c.fault)));
    size_t streams_before = StreamRequests().size();
    sim_->ArmFault(c.fault);
    FetchResult r = UntilRefusal(p.get(), &cursor);
    ASSERT_TRUE(r.refusal);
    EXPECT_EQ(r.refusal->kind, c.kind);
    EXPECT_EQ(r.refusal->code, c.code);
    EXPECT_EQ(r.refusal->http_status, 0);
    ExpectNoSecret(r);
    if (c.fault == Fault::kChainUnavailable) {
      EXPECT_EQ(r.refusal->retry_after, absl::Seconds(7));
    }
    if (c.fault == Fault::kPaymentRequired) {
      EXPECT_EQ(r.refusal->retry_after, absl::Seconds(60));
      EXPECT_TRUE(absl::StrContains(r.refusal->funding_action_json, "next_action"));
    }
    if (c.fault == Fault::kIncompleteSseFrame) {
      EXPECT_TRUE(absl::StrContains(r.refusal->message, "incomplete frame")) << r.refusal->message;
    }
    // The next Fetch reconnects from the committed cursor and succeeds.
    Page page = ExpectPage(p->Fetch(cursor));
    auto streams = StreamRequests();
    ASSERT_EQ(streams.size(), streams_before + 1);
    EXPECT_EQ(streams.back().last_event_id, cursor);
    cursor = page.next;  // at the tip this is a heartbeat: the same cursor
  }
}

TEST_F(HttpProviderTest, SseSilenceIsTransientAndHeartbeatsAreNoOpPages) {
  HttpProviderOptions o = Options(handoff::v1::TRANSPORT_SSE);
  o.sse_silence_timeout = absl::Milliseconds(300);
  auto p = Make(o);
  std::string tip = sim_->EncodeCursor(o.source, o.filter, {201, 0});
  FetchResult r = p->Fetch(tip);  // the sim's heartbeat is 60 s: silence
  ASSERT_TRUE(r.refusal);
  EXPECT_EQ(r.refusal->kind, RefusalKind::kTransient);
  EXPECT_EQ(r.refusal->code, "sse_silence");

  sim::ProviderSimOptions fast;
  fast.heartbeat = absl::Milliseconds(50);
  StartSim(fast);
  o = Options(handoff::v1::TRANSPORT_SSE);
  o.sse_silence_timeout = absl::Seconds(20);
  p = Make(o);
  tip = sim_->EncodeCursor(o.source, o.filter, {201, 0});
  for (int i = 0; i < 3; ++i) {
    Page heartbeat = ExpectPage(p->Fetch(tip));
    EXPECT_TRUE(heartbeat.items.empty());
    EXPECT_EQ(heartbeat.next, tip);
  }
  EXPECT_EQ(StreamRequests().size(), 1u);
}

TEST_F(HttpProviderTest, CancelUnblocksABlockedSseFetch) {
  auto p = Make(Options(handoff::v1::TRANSPORT_SSE));
  std::string tip = sim_->EncodeCursor("erc20 transfers", "all&more=1", {201, 0});
  size_t before = sim_->Requests().size();
  absl::Notification done;
  FetchResult result;
  std::thread fetcher([&] {
    result = p->Fetch(tip);
    done.Notify();
  });
  ASSERT_TRUE(sim_->WaitForRequests(before + 1, absl::Seconds(10)));
  EXPECT_FALSE(done.HasBeenNotified());
  p->Cancel();
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  fetcher.join();
  ASSERT_TRUE(result.refusal);
  EXPECT_EQ(result.refusal->kind, RefusalKind::kCancelled);
  FetchResult later = p->Fetch("0");
  ASSERT_TRUE(later.refusal);
  EXPECT_EQ(later.refusal->kind, RefusalKind::kCancelled);
}

TEST_F(HttpProviderTest, CloseUnblocksAndTheNextFetchReconnects) {
  auto p = Make(Options(handoff::v1::TRANSPORT_SSE));
  std::string tip = sim_->EncodeCursor("erc20 transfers", "all&more=1", {201, 0});
  size_t before = sim_->Requests().size();
  absl::Notification done;
  FetchResult result;
  std::thread fetcher([&] {
    result = p->Fetch(tip);
    done.Notify();
  });
  ASSERT_TRUE(sim_->WaitForRequests(before + 1, absl::Seconds(10)));
  p->Close();
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  fetcher.join();
  ASSERT_TRUE(result.refusal);
  EXPECT_EQ(result.refusal->kind, RefusalKind::kTransient);
  EXPECT_EQ(result.refusal->code, "closed");
  Page page = ExpectPage(p->Fetch("0"));
  EXPECT_EQ(page.from, 0u);
}

TEST_F(HttpProviderTest, CorrectionPageAfterReorg) {
  auto p = Make(Options(handoff::v1::TRANSPORT_POLL));
  std::string cursor = "150";
  Page page;
  do {
    page = ExpectPage(p->Fetch(cursor));
    cursor = page.next;
  } while (!page.items.empty());
  ASSERT_TRUE(sim_->chain().Reorg(4).ok());
  Page correction = ExpectPage(p->Fetch(cursor));
  EXPECT_TRUE(correction.reorg);
  EXPECT_EQ(correction.from, 197u);
  EXPECT_EQ(correction.through->number, 200u);
  EXPECT_EQ(correction.items.front().block_hash(), sim_->chain().BlockHash(197));
}

// A refusal the prefetch got is the provider's answer to that request: the Fetch that
// consumes the prefetch returns it, as a Fetch without prefetch would, and does not ask
// again at once (defying a Retry-After, or sending a refused key a second time).
TEST(HttpProviderScriptedTest, APrefetchedRefusalIsReturnedNotRequestedAgain) {
  struct Case {
    std::string name;
    ScriptedProvider::Answer answer;
    RefusalKind kind;
    std::string code;
    std::optional<absl::Duration> retry_after;
  };
  const std::vector<Case> cases = {
      {"rate_limited", {429, R"({"error":"rate_limited"})", "application/json", "3"},
       RefusalKind::kRetryAfter, "rate_limited", absl::Seconds(3)},
      {"chain_unavailable", {503, R"({"error":"chain_unavailable","retry_after":7})"},
       RefusalKind::kRetryAfter, "chain_unavailable", absl::Seconds(7)},
      {"unauthorized", {401, R"({"error":"unauthorized"})"}, RefusalKind::kAuthFailed,
       "unauthorized", std::nullopt},
      {"payment_required",
       {402, R"({"error":{"code":"insufficient_credit","message":"top up",)"
             R"("next_action":{"type":"top_up"},"credit":{"balance":0}}})"},
       RefusalKind::kFundingRequired, "insufficient_credit", std::nullopt},
      {"resync_required", {409, R"({"error":"resync_required"})"},
       RefusalKind::kResyncRequired, "resync_required", std::nullopt},
      {"server_error", {500, R"({"error":"internal"})"}, RefusalKind::kTransient, "internal",
       std::nullopt},
  };
  ScriptedProvider server;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string from = "from-" + c.name;
    const std::string refused = "next-" + c.name;
    server.Set(from, ScriptedProvider::EmptyPage(10, refused));
    server.Set(refused, c.answer);
    auto p = HttpProvider::Create(ScriptedOptions(server, handoff::v1::TRANSPORT_POLL));
    ASSERT_TRUE(p.ok()) << p.status();
    FetchResult first = (*p)->Fetch(from);
    ASSERT_TRUE(first.page.has_value());
    ASSERT_EQ(first.page->next, refused);
    // The prefetch of the next cursor has been sent (and refused, or is in flight).
    ASSERT_TRUE(server.WaitForRequests(refused, 1, absl::Seconds(10)));

    FetchResult r = (*p)->Fetch(refused);
    ASSERT_TRUE(r.refusal.has_value());
    EXPECT_EQ(r.refusal->kind, c.kind);
    EXPECT_EQ(r.refusal->http_status, c.answer.status);
    EXPECT_EQ(r.refusal->code, c.code);
    EXPECT_EQ(r.refusal->retry_after, c.retry_after);
    EXPECT_EQ(server.Requests(refused), 1) << "the refused request was sent again at once";

    // Exactly what a Fetch without prefetch gets for that cursor.
    HttpProviderOptions plain_options = ScriptedOptions(server, handoff::v1::TRANSPORT_POLL);
    plain_options.poll_prefetch = false;
    auto plain = HttpProvider::Create(std::move(plain_options));
    ASSERT_TRUE(plain.ok());
    FetchResult sync = (*plain)->Fetch(refused);
    ASSERT_TRUE(sync.refusal.has_value());
    EXPECT_EQ(r.refusal->kind, sync.refusal->kind);
    EXPECT_EQ(r.refusal->http_status, sync.refusal->http_status);
    EXPECT_EQ(r.refusal->code, sync.refusal->code);
    EXPECT_EQ(r.refusal->message, sync.refusal->message);
    EXPECT_EQ(r.refusal->retry_after, sync.refusal->retry_after);
    EXPECT_EQ(r.refusal->funding_action_json, sync.refusal->funding_action_json);
    EXPECT_EQ(server.Requests(refused), 2);

    // The retry (after the engine's wait) is a new request.
    EXPECT_TRUE((*p)->Fetch(refused).refusal.has_value());
    EXPECT_EQ(server.Requests(refused), 3);
  }
}

// A prefetched refusal is the answer to its cursor only: a Fetch of another cursor (the
// engine rereads an older one) drops it and asks for that cursor.
TEST(HttpProviderScriptedTest, APrefetchedRefusalOfAnotherCursorIsDropped) {
  ScriptedProvider server;
  server.Set("a", ScriptedProvider::EmptyPage(10, "b"));
  server.Set("b", {429, R"({"error":"rate_limited"})", "application/json", "3"});
  auto p = HttpProvider::Create(ScriptedOptions(server, handoff::v1::TRANSPORT_POLL));
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE((*p)->Fetch("a").page.has_value());
  ASSERT_TRUE(server.WaitForRequests("b", 1, absl::Seconds(10)));
  FetchResult again = (*p)->Fetch("a");
  ASSERT_TRUE(again.page.has_value());
  EXPECT_EQ(server.Requests("a"), 2);
}

// The provider's message is cut to 300 bytes; an API key it echoes across that cut must
// not survive in part (redacted in the whole text first, then cut).
TEST(HttpProviderScriptedTest, AKeyAcrossTheMessageCutLeavesNoFragment) {
  const std::string key = kToken;
  ScriptedProvider server;
  for (auto transport : {handoff::v1::TRANSPORT_POLL, handoff::v1::TRANSPORT_SSE}) {
    auto p = HttpProvider::Create(ScriptedOptions(server, transport));
    ASSERT_TRUE(p.ok());
    for (size_t offset = 300 - key.size(); offset <= 300; ++offset) {
      SCOPED_TRACE(absl::StrCat(transport, " key at ", offset));
      const std::string body =
          absl::StrCat(R"({"error":"invalid_request","details":{"message":")",
                       std::string(offset, 'x'), key, R"( was refused"}})");
      const std::string cursor = absl::StrCat("c", transport, "-", offset);
      if (transport == handoff::v1::TRANSPORT_POLL) {
        server.Set(cursor, {400, body});
      } else {  // after the stream started: an `event: error` control
        server.Set(cursor, {200, absl::StrCat("event: error\ndata: ", body, "\n\n"),
                            "text/event-stream"});
      }
      FetchResult r = (*p)->Fetch(cursor);
      ASSERT_TRUE(r.refusal.has_value());
      EXPECT_FALSE(HasFragmentOf(r.refusal->message, key, 4)) << r.refusal->message;
      EXPECT_TRUE(absl::StrContains(r.refusal->message, "xxxx")) << r.refusal->message;
    }
  }
  // A provider that cut its own message inside the key: that start is not left either.
  auto p = HttpProvider::Create(ScriptedOptions(server, handoff::v1::TRANSPORT_POLL));
  ASSERT_TRUE(p.ok());
  server.Set("cut", {401, absl::StrCat(R"({"error":"unauthorized","details":{"message":")",
                                       "bad token ", key.substr(0, 9), R"("}})")});
  FetchResult r = (*p)->Fetch("cut");
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_FALSE(HasFragmentOf(r.refusal->message, key, 4)) << r.refusal->message;
}

// A key with `"` or `\` is spelled escaped in JSON the adapter re-serialises (the
// funding action of a 402): it is redacted in that spelling too.
TEST(HttpProviderScriptedTest, AJsonEscapedKeyIsRedactedToo) {
  const std::string key = "k\"ey\\with-1234567890";
  const std::string escaped = "k\\\"ey\\\\with-1234567890";
  ScriptedProvider server;
  server.Set("0", {402, absl::StrCat(R"({"error":{"code":"payment_required","message":"key )",
                                     escaped, R"( has no credit","next_action":{"url":)",
                                     R"("https://pay.example/?key=)", escaped,
                                     R"("},"challenges":[")", escaped, R"("]}})")});
  HttpProviderOptions o = ScriptedOptions(server, handoff::v1::TRANSPORT_POLL);
  o.api_key = key;
  auto p = HttpProvider::Create(std::move(o));
  ASSERT_TRUE(p.ok());
  FetchResult r = (*p)->Fetch("0");
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->kind, RefusalKind::kFundingRequired);
  EXPECT_TRUE(absl::StrContains(r.refusal->funding_action_json, "pay.example"))
      << r.refusal->funding_action_json;
  for (const std::string* text : {&r.refusal->message, &r.refusal->funding_action_json}) {
    EXPECT_FALSE(HasFragmentOf(*text, key, 6)) << *text;
    EXPECT_FALSE(HasFragmentOf(*text, escaped, 6)) << *text;
  }
  // Control bytes are spelled \t or \u00XX there.
  const std::string tabbed = "tab\tbed\x01-key-0123456789";
  const std::string tabbed_json = "tab\\tbed\\u0001-key-0123456789";
  Refusal f = ClassifyRefusal(
      402, absl::StrCat(R"({"error":{"code":"payment_required","message":"m",)",
                        R"("next_action":{"key":")", tabbed_json, R"("}}})"),
      std::nullopt, std::nullopt, tabbed);
  EXPECT_EQ(f.funding_action_json, R"({"next_action":{"key":"[redacted]"}})");
}

}  // namespace
}  // namespace handoff::consumer
