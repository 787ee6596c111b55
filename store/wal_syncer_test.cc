#include "store/wal_syncer.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace handoff::store {
namespace {

// A sync that the test holds until it lets it go, counting how many began.
class GatedSync {
 public:
  absl::Status operator()() {
    const int n = ++started_;
    if (n <= hold_first_) released_[n - 1].WaitForNotification();
    return fail_.load() ? absl::UnavailableError("disk gone") : absl::OkStatus();
  }
  void HoldFirst(int n) { hold_first_ = n; }
  void Release(int i) { released_[i].Notify(); }
  int started() const { return started_.load(); }
  void FailFromNow() { fail_.store(true); }

 private:
  std::atomic<int> started_{0};
  int hold_first_ = 0;
  absl::Notification released_[4];
  std::atomic<bool> fail_{false};
};

TEST(WalSyncerTest, ZeroTicketNeedsNoSync) {
  int syncs = 0;
  WalSyncer syncer([&] {
    ++syncs;
    return absl::OkStatus();
  });
  EXPECT_TRUE(syncer.Await(SyncTicket{}).ok());
  EXPECT_EQ(syncs, 0);
}

TEST(WalSyncerTest, AwaitReturnsOnlyAfterASyncThatBeganAfterTheWrite) {
  GatedSync gate;
  gate.HoldFirst(2);
  WalSyncer syncer([&] { return gate(); });
  const SyncTicket first = syncer.Written();
  // The first sync is running (held); a write now is not covered by it.
  while (gate.started() < 1) std::this_thread::yield();
  const SyncTicket second = syncer.Written();
  std::atomic<bool> second_done{false};
  std::thread waiter([&] {
    EXPECT_TRUE(syncer.Await(second).ok());
    second_done.store(true);
  });
  gate.Release(0);
  EXPECT_TRUE(syncer.Await(first).ok());
  // The first sync finished; the second ticket still waits for the second sync.
  while (gate.started() < 2) std::this_thread::yield();
  EXPECT_FALSE(second_done.load());
  gate.Release(1);
  waiter.join();
  EXPECT_TRUE(second_done.load());
  EXPECT_EQ(syncer.syncs(), 2u);
}

TEST(WalSyncerTest, OneSyncCoversEveryTicketTakenBeforeIt) {
  GatedSync gate;
  gate.HoldFirst(1);
  WalSyncer syncer([&] { return gate(); });
  syncer.Written();  // starts the first sync, which the test holds
  while (gate.started() < 1) std::this_thread::yield();
  std::vector<SyncTicket> queued;
  for (int i = 0; i < 10; ++i) queued.push_back(syncer.Written());
  EXPECT_FALSE(syncer.IsSynced(queued.front()));
  gate.Release(0);
  for (const SyncTicket& t : queued) EXPECT_TRUE(syncer.Await(t).ok());
  for (const SyncTicket& t : queued) EXPECT_TRUE(syncer.IsSynced(t));
  // The ten writes made while the first sync ran share the second one.
  EXPECT_EQ(syncer.syncs(), 2u);
}

TEST(WalSyncerTest, AFailedSyncFailsEveryUnsyncedTicketForGood) {
  GatedSync gate;
  WalSyncer syncer([&] { return gate(); });
  const SyncTicket good = syncer.Written();
  ASSERT_TRUE(syncer.Await(good).ok());
  gate.FailFromNow();
  const SyncTicket bad = syncer.Written();
  EXPECT_EQ(syncer.Await(bad).code(), absl::StatusCode::kUnavailable);
  const int started = gate.started();
  // Later tickets fail too, without another sync of pages the kernel may have dropped.
  const SyncTicket later = syncer.Written();
  EXPECT_EQ(syncer.Await(later).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(gate.started(), started);
  // What was synced before the failure stays synced.
  EXPECT_TRUE(syncer.Await(good).ok());
}

TEST(WalSyncerTest, DestructionSyncsWhatWasWritten) {
  std::atomic<int> syncs{0};
  {
    GatedSync gate;
    gate.HoldFirst(1);
    WalSyncer syncer([&] {
      ++syncs;
      return gate();
    });
    syncer.Written();
    while (gate.started() < 1) std::this_thread::yield();
    syncer.Written();  // not covered by the running sync
    gate.Release(0);
  }
  EXPECT_EQ(syncs.load(), 2);
}

// Pacing (min_interval): the syncs nobody waits for begin at most once per interval,
// and the writes made meanwhile share them.
TEST(WalSyncerTest, AtMostOneSyncBeginsPerIntervalWhileNobodyWaits) {
  std::atomic<int> syncs{0};
  const absl::Duration interval = absl::Milliseconds(20);
  WalSyncer syncer(
      [&] {
        ++syncs;
        return absl::OkStatus();
      },
      interval);
  const absl::Time start = absl::Now();
  SyncTicket last;
  int writes = 0;
  // Writes for 200 ms that nobody awaits: unpaced, each would get a sync of its own
  // (the sync returns at once).
  while (absl::Now() - start < absl::Milliseconds(200)) {
    last = syncer.Written();
    ++writes;
  }
  const int unawaited = syncs.load();
  const absl::Duration elapsed = absl::Now() - start;
  // The first sync begins at once, then at most one per interval.
  EXPECT_LE(unawaited, 1 + static_cast<int>(elapsed / interval) + 1) << writes << " writes";
  EXPECT_TRUE(syncer.Await(last).ok());
  EXPECT_TRUE(syncer.IsSynced(last));
}

TEST(WalSyncerTest, AWaiterEndsThePacedWaitAtOnce) {
  // An hour between syncs: only the waiter can start the second one in this test's time.
  WalSyncer syncer([] { return absl::OkStatus(); }, absl::Hours(1));
  ASSERT_TRUE(syncer.Await(syncer.Written()).ok());  // the first: after a quiet spell
  const SyncTicket paced = syncer.Written();
  EXPECT_TRUE(syncer.Await(paced).ok());
  EXPECT_EQ(syncer.syncs(), 2u);
}

TEST(WalSyncerTest, DestructionEndsThePacedWaitAndSyncs) {
  std::atomic<int> syncs{0};
  {
    WalSyncer syncer(
        [&] {
          ++syncs;
          return absl::OkStatus();
        },
        absl::Hours(1));
    ASSERT_TRUE(syncer.Await(syncer.Written()).ok());
    syncer.Written();  // paced: nobody waits for it
    syncer.Written();
  }
  // One more sync, for both writes, without waiting out the hour.
  EXPECT_EQ(syncs.load(), 2);
}

}  // namespace
}  // namespace handoff::store
