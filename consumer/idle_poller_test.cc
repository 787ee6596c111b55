#include "consumer/idle_poller.h"

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace handoff::consumer {
namespace {

Page NothingNew(const std::string& cursor) {
  Page p;
  p.next = cursor;
  return p;
}

Page WithItem(const std::string& next) {
  Page p;
  p.next = next;
  p.items.emplace_back().set_block_number(7);
  return p;
}

// Answers Fetch from a script (nothing new once it runs out); optionally blocks a Fetch
// until Cancel, as a provider that accepted the request and never answered.
class ScriptedProvider : public Provider {
 public:
  FetchResult Fetch(const std::string& cursor) override {
    absl::MutexLock lock(&mu_);
    ++fetches_;
    cursors_.push_back(cursor);
    if (hang_) {
      hanging_ = true;
      mu_.Await(absl::Condition(&cancelled_));
      Refusal r;
      r.kind = RefusalKind::kCancelled;
      return FetchResult::Refused(r);
    }
    if (script_.empty()) return FetchResult::Of(NothingNew(cursor));
    FetchResult r = std::move(script_.front());
    script_.pop_front();
    return r;
  }
  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  void Close() override {}
  bool PolledPerFetch() const override { return true; }

  void Push(FetchResult r) {
    absl::MutexLock lock(&mu_);
    script_.push_back(std::move(r));
  }
  void HangFromNow() {
    absl::MutexLock lock(&mu_);
    hang_ = true;
  }
  void AwaitHanging() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&hanging_));
  }
  void AwaitFetches(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return fetches_ >= n; };
    mu_.Await(absl::Condition(&enough));
  }
  int fetches() {
    absl::MutexLock lock(&mu_);
    return fetches_;
  }
  std::vector<std::string> cursors() {
    absl::MutexLock lock(&mu_);
    return cursors_;
  }

 private:
  absl::Mutex mu_;
  std::deque<FetchResult> script_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> cursors_ ABSL_GUARDED_BY(mu_);
  int fetches_ ABSL_GUARDED_BY(mu_) = 0;
  bool hang_ ABSL_GUARDED_BY(mu_) = false;
  bool hanging_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

BackoffPolicy Fast() {
  BackoffPolicy p;
  p.initial = absl::Milliseconds(1);
  p.max = absl::Milliseconds(2);
  return p;
}

// What a worker sees of its parked source.
struct Parked {
  ParkedPoll poll;
  absl::Mutex mu;
  std::optional<FetchResult> result ABSL_GUARDED_BY(mu);
  int results ABSL_GUARDED_BY(mu) = 0;
  int nothing_new ABSL_GUARDED_BY(mu) = 0;
  absl::Time last_next ABSL_GUARDED_BY(mu);

  Parked(Provider* provider, Backoff* backoff, std::string cursor) {
    poll.provider = provider;
    poll.backoff = backoff;
    poll.cursor = std::move(cursor);
    poll.at = absl::Now();
    poll.nothing_new = [cursor = poll.cursor](const Page& page) {
      return page.NothingNewAfter(cursor);
    };
    poll.on_nothing_new = [this](absl::Time next) {
      absl::MutexLock lock(&mu);
      ++nothing_new;
      last_next = next;
    };
    poll.on_result = [this](FetchResult r) {
      absl::MutexLock lock(&mu);
      result = std::move(r);
      ++results;
    };
  }
  FetchResult AwaitResult() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](std::optional<FetchResult>* r) { return r->has_value(); }, &result));
    return *std::move(result);
  }
  void AwaitNothingNew(int n) {
    absl::MutexLock lock(&mu);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return nothing_new >= n; };
    mu.Await(absl::Condition(&enough));
  }
};

class IdlePollerTest : public ::testing::Test {
 protected:
  ScriptedProvider provider;
  Backoff backoff{Fast()};
  IdlePoller poller;  // declared last: stops before the providers go
};

TEST_F(IdlePollerTest, PollsUntilSomethingNewAndHandsItBack) {
  provider.Push(FetchResult::Of(NothingNew("c1")));
  provider.Push(FetchResult::Of(NothingNew("c1")));
  provider.Push(FetchResult::Of(WithItem("c2")));
  Parked parked(&provider, &backoff, "c1");
  poller.Park(&parked.poll);
  FetchResult r = parked.AwaitResult();
  ASSERT_TRUE(r.page.has_value());
  EXPECT_EQ(r.page->next, "c2");
  ASSERT_EQ(r.page->items.size(), 1u);
  EXPECT_EQ(r.page->items[0].block_number(), 7);
  poller.Unpark(&parked.poll);  // a no-op now
  EXPECT_EQ(provider.fetches(), 3);
  for (const std::string& c : provider.cursors()) EXPECT_EQ(c, "c1");
  EXPECT_EQ(poller.idle_polls(), 2);
  EXPECT_EQ(poller.parked(), 0u);
  absl::MutexLock lock(&parked.mu);
  EXPECT_EQ(parked.nothing_new, 2);
  EXPECT_EQ(parked.results, 1);
}

TEST_F(IdlePollerTest, ARefusalGoesBackToTheWorker) {
  Refusal refusal;
  refusal.kind = RefusalKind::kRetryAfter;
  refusal.http_status = 429;
  provider.Push(FetchResult::Refused(refusal));
  Parked parked(&provider, &backoff, "c1");
  poller.Park(&parked.poll);
  FetchResult r = parked.AwaitResult();
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->http_status, 429);
  poller.Unpark(&parked.poll);
  EXPECT_EQ(poller.idle_polls(), 0);
}

TEST_F(IdlePollerTest, NotPolledBeforeItsDeadlineNorAfterUnpark) {
  Parked parked(&provider, &backoff, "c1");
  parked.poll.at = absl::Now() + absl::Hours(1);
  poller.Park(&parked.poll);
  // Another source due now is polled; the first is not.
  ScriptedProvider other;
  Backoff other_backoff(Fast());
  Parked due(&other, &other_backoff, "x");
  poller.Park(&due.poll);
  other.AwaitFetches(3);
  EXPECT_EQ(provider.fetches(), 0);
  EXPECT_EQ(poller.parked(), 2u);
  poller.Unpark(&parked.poll);
  poller.Unpark(&due.poll);
  const int after = other.fetches();
  EXPECT_EQ(poller.parked(), 0u);
  // Unparked: polled no more, however long the poller keeps running.
  ScriptedProvider third;
  Backoff third_backoff(Fast());
  Parked probe(&third, &third_backoff, "y");
  poller.Park(&probe.poll);
  third.AwaitFetches(3);  // the poller went round several times since
  EXPECT_EQ(other.fetches(), after);
  poller.Unpark(&probe.poll);
  absl::MutexLock lock(&parked.mu);
  EXPECT_EQ(parked.results, 0);
  EXPECT_EQ(parked.nothing_new, 0);
}

TEST_F(IdlePollerTest, UnparkWaitsOutAFetchInFlight) {
  provider.HangFromNow();
  Parked parked(&provider, &backoff, "c1");
  poller.Park(&parked.poll);
  provider.AwaitHanging();
  // As a worker's RequestStop: cancel the provider, then Unpark.
  absl::Notification unparked;
  std::thread stopper([&] {
    poller.Unpark(&parked.poll);
    unparked.Notify();
  });
  EXPECT_FALSE(unparked.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  provider.Cancel();
  stopper.join();
  EXPECT_TRUE(unparked.HasBeenNotified());
  EXPECT_EQ(poller.parked(), 0u);
  // The cancelled Fetch's result reached the worker before Unpark returned, or never.
  absl::MutexLock lock(&parked.mu);
  EXPECT_LE(parked.results, 1);
}

TEST_F(IdlePollerTest, ManySourcesDueTogetherAreAllPolled) {
  constexpr int kSources = 50;
  std::vector<std::unique_ptr<ScriptedProvider>> providers;
  std::vector<std::unique_ptr<Backoff>> backoffs;
  std::vector<std::unique_ptr<Parked>> parked;
  for (int i = 0; i < kSources; ++i) {
    providers.push_back(std::make_unique<ScriptedProvider>());
    providers.back()->Push(FetchResult::Of(WithItem(absl::StrCat("n", i))));
    backoffs.push_back(std::make_unique<Backoff>(Fast()));
    parked.push_back(std::make_unique<Parked>(providers.back().get(), backoffs.back().get(),
                                              absl::StrCat("c", i)));
  }
  for (auto& p : parked) poller.Park(&p->poll);
  for (int i = 0; i < kSources; ++i) {
    FetchResult r = parked[i]->AwaitResult();
    ASSERT_TRUE(r.page.has_value());
    EXPECT_EQ(r.page->next, absl::StrCat("n", i));
    EXPECT_EQ(providers[i]->cursors(), std::vector<std::string>{absl::StrCat("c", i)});
  }
  // The last on_result runs while its source is still in flight: a probe polled after it
  // (one poller thread) shows that none of the 50 went back on the schedule.
  ScriptedProvider third;
  Backoff third_backoff(Fast());
  Parked probe(&third, &third_backoff, "y");
  poller.Park(&probe.poll);
  probe.AwaitNothingNew(1);
  poller.Unpark(&probe.poll);
  EXPECT_EQ(poller.parked(), 0u);
}

}  // namespace
}  // namespace handoff::consumer
