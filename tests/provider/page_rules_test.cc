// Issue 4, the contract's page rules, applied by the real engine to pages the simulator
// serves over HTTP (polling and SSE): delete-and-insert (a correction's rows replace the
// orphaned ones), corrections that rewind below the start block (never clamped), both
// kinds of empty page, and the highest finalized mark kept across lower and null marks
// and across restarts.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "consumer/fault_points.h"
#include "gtest/gtest.h"
#include "tests/provider/rig.h"

namespace handoff::tests {
namespace {

class PageRulesTest : public ProviderRigTest,
                      public ::testing::WithParamInterface<handoff::v1::Transport> {};

// The first correction page the engine fetched, if any.
std::optional<FetchRecord> FirstCorrection(const std::vector<FetchRecord>& j) {
  for (const FetchRecord& r : j) {
    if (r.is_page && r.reorg) return r;
  }
  return std::nullopt;
}

TEST_P(PageRulesTest, CorrectionsReplaceTheOrphanedRows) {
  const std::string id = "reorged";
  Create(Spec(id, GetParam(), 150));
  ASSERT_TRUE(WaitIdle(id));
  const std::vector<handoff::v1::EventRow> old_rows = Rows(id);
  absl::StatusOr<uint64_t> fork = sim().chain().Reorg(6);
  ASSERT_TRUE(fork.ok());
  ASSERT_EQ(*fork, 195u);
  sim().chain().AddBlocks(2);
  ASSERT_TRUE(WaitCaughtUp(id));
  ASSERT_TRUE(WaitFor(id, [](const handoff::v1::Progress& p) {
    return p.counters().corrections() >= 1;
  }));
  std::optional<FetchRecord> correction = FirstCorrection(journal_.Of(id));
  ASSERT_TRUE(correction.has_value());
  EXPECT_EQ(correction->from, 195u);
  // Every row equals the surviving chain: the orphans of 195..200 are gone.
  ExpectRowsCanonical(id, 150, head());
  const std::vector<handoff::v1::EventRow> rows = Rows(id);
  ASSERT_GE(rows.size(), old_rows.size());
  for (size_t i = 0; i < old_rows.size(); ++i) {
    if (old_rows[i].block_number() < 195) {
      EXPECT_EQ(rows[i].block_hash(), old_rows[i].block_hash()) << i;
    } else {
      EXPECT_NE(rows[i].block_hash(), old_rows[i].block_hash()) << i;
    }
  }
  handoff::v1::Progress p = Progress(id);
  EXPECT_EQ(p.counters().applied(), rows.size() + 18);  // 195..200 applied twice
  ExpectRefusalsKeptTheCursor(id);
}

TEST_P(PageRulesTest, ACorrectionRewindsBelowTheStartBlockUnclamped) {
  const std::string id = "below";
  Create(Spec(id, GetParam(), 190));
  ASSERT_TRUE(WaitIdle(id));
  ExpectRowsCanonical(id, 190, 200);
  // Finalized is 180: a reorg of 15 blocks forks at 186, below the start block.
  absl::StatusOr<uint64_t> fork = sim().chain().Reorg(15);
  ASSERT_TRUE(fork.ok());
  ASSERT_EQ(*fork, 186u);
  sim().chain().AddBlocks(1);
  ASSERT_TRUE(WaitCaughtUp(id));
  std::optional<FetchRecord> correction = FirstCorrection(journal_.Of(id));
  ASSERT_TRUE(correction.has_value());
  EXPECT_EQ(correction->from, 186u);
  // The page's whole range was applied: its rows below the start block too.
  ExpectRowsCanonical(id, 186, head());
  const std::vector<handoff::v1::EventRow> rows = Rows(id);
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows.front().block_number(), 186u);
}

TEST_P(PageRulesTest, ANonAdvancingEmptyPageCommitsNothing) {
  const std::string id = "idle";
  Create(Spec(id, GetParam(), 150));
  ASSERT_TRUE(WaitIdle(id));
  const handoff::v1::Progress before = Progress(id);
  const size_t seen = journal_.Of(id).size();
  // Several more "nothing new" pages (polls, or SSE heartbeats).
  ASSERT_TRUE(WaitFor(id, [&](const handoff::v1::Progress&) {
    return journal_.Of(id).size() >= seen + 4;
  }));
  const std::vector<FetchRecord> j = journal_.Of(id);
  for (size_t i = seen; i < j.size(); ++i) {
    ASSERT_TRUE(j[i].is_page);
    EXPECT_EQ(j[i].items, 0u);
    EXPECT_EQ(j[i].next, j[i].cursor);
  }
  const handoff::v1::Progress after = Progress(id);
  EXPECT_EQ(after.checkpoint().checkpoint_version(), before.checkpoint().checkpoint_version());
  EXPECT_EQ(after.checkpoint().resume_cursor(), before.checkpoint().resume_cursor());
  EXPECT_EQ(after.counters().pages_committed(), before.counters().pages_committed());
  EXPECT_EQ(after.counters().applied(), before.counters().applied());
}

TEST_P(PageRulesTest, AnAdvancingEmptyPageCommitsItsCursor) {
  // A chain whose blocks hold no matching events: every page is empty but advances.
  sim::ProviderSimOptions o = DefaultSimOptions();
  o.chain.logs_per_block = 0;
  o.chain.initial_head = 300;
  o.chain.max_blocks_per_page = 50;
  StartSim(o);
  const std::string id = "sparse";
  Create(Spec(id, GetParam(), 0));
  handoff::v1::Progress last;
  ASSERT_TRUE(WaitFor(
      id,
      [&](const handoff::v1::Progress& p) {
        std::vector<FetchRecord> j = journal_.Of(id);
        return p.tip() == 300 && !j.empty() && j.back().is_page && j.back().next == j.back().cursor &&
               j.back().cursor == p.checkpoint().resume_cursor() &&
               p.counters().pages_committed() >= 7;
      },
      absl::Seconds(20), &last))
      << last.DebugString();
  // Seven barriers passed (0..49, ..., 300..300), nothing applied.
  EXPECT_EQ(last.counters().pages_committed(), 7u);
  EXPECT_FALSE(last.checkpoint().has_applied());
  EXPECT_EQ(last.counters().applied(), 0u);
  EXPECT_GE(last.checkpoint().checkpoint_version(), 7u);
  EXPECT_NE(last.checkpoint().resume_cursor(), "0");
  EXPECT_TRUE(Rows(id).empty());
  // Each request followed the previous page's committed cursor: nothing was skipped.
  const std::vector<FetchRecord> j = journal_.Of(id);
  uint64_t covered = 0;
  for (size_t i = 0; i < j.size(); ++i) {
    ASSERT_TRUE(j[i].is_page);
    if (j[i].next == j[i].cursor) continue;
    EXPECT_EQ(j[i].from, covered);
    ASSERT_TRUE(j[i].has_through);
    covered = j[i].through + 1;
    if (i + 1 < j.size()) {
      EXPECT_EQ(j[i + 1].cursor, j[i].next);
    }
  }
  EXPECT_EQ(covered, 301u);
  // A restart resumes after the empty stretch, not from the start block.
  Restart();
  sim().chain().AddBlocks(10);
  ASSERT_TRUE(WaitFor(id, [](const handoff::v1::Progress& p) {
    return p.tip() == 310 && p.counters().pages_committed() >= 8;
  }));
  const std::vector<FetchRecord> after = journal_.Of(id);
  ASSERT_GT(after.size(), j.size());
  EXPECT_EQ(after[j.size()].cursor, last.checkpoint().resume_cursor());
  EXPECT_EQ(after[j.size()].from, 301u);
}

// Regression: the simulator's non_advancing_cursor fault built its empty page at epoch 0,
// so after any reorg it served a correction page full of items whose next equalled the
// request cursor, and the engine (rightly) halted with PROTOCOL_VIOLATION.
TEST_P(PageRulesTest, ANonAdvancingCursorAfterAReorgIsOnlyAnEmptyPage) {
  const std::string id = "stalls";
  Create(Spec(id, GetParam(), 150));
  ASSERT_TRUE(WaitIdle(id));
  ASSERT_TRUE(sim().chain().Reorg(3).ok());
  ASSERT_TRUE(WaitCaughtUp(id));
  ASSERT_TRUE(WaitFor(id, [](const handoff::v1::Progress& p) {
    return p.counters().corrections() >= 1;
  }));
  sim().ArmFault(sim::Fault::kNonAdvancingCursor, 2);
  sim().chain().AddBlocks(4);
  ASSERT_TRUE(WaitCaughtUp(id));
  EXPECT_FALSE(IsHalted(Progress(id).state()));
  ExpectRowsCanonical(id, 150, head());
  for (const FetchRecord& r : journal_.Of(id)) {
    if (r.is_page && r.next == r.cursor) {
      EXPECT_EQ(r.items, 0u);
      EXPECT_FALSE(r.reorg);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, PageRulesTest,
                         ::testing::Values(handoff::v1::TRANSPORT_POLL, handoff::v1::TRANSPORT_SSE),
                         [](const ::testing::TestParamInfo<handoff::v1::Transport>& info) {
                           return std::string(info.param == handoff::v1::TRANSPORT_POLL ? "Poll"
                                                                                         : "Sse");
                         });

// The highest finalized mark is kept across lower and null marks and across restarts.
// The provider is replaced on the same port by simulators of the same chain (same seed,
// so cursors and hashes stay valid) whose finality lags further behind, then not at all.
TEST_F(ProviderRigTest, TheHighestFinalizedMarkNeverDecreases) {
  const std::string id = "marks";
  Create(Spec(id, handoff::v1::TRANSPORT_POLL, 150));
  ASSERT_TRUE(WaitIdle(id));
  handoff::v1::Progress p = Progress(id);
  ASSERT_EQ(p.highest_finalized().number(), 180u);
  const std::string hash180 = sim().chain().BlockHash(180);
  EXPECT_EQ(p.highest_finalized().hash(), hash180);
  const int port = sim().port();

  auto check = [&](const char* when) {
    handoff::v1::Progress now = Progress(id);
    EXPECT_EQ(now.highest_finalized().number(), 180u) << when;
    EXPECT_EQ(now.highest_finalized().hash(), hash180) << when;
  };
  auto catch_up_on = [&](uint32_t finality_lag, uint64_t add, bool expect_null) {
    sim::ProviderSimOptions o = DefaultSimOptions();
    o.chain.initial_head = head();
    o.chain.finality_lag = finality_lag;
    StartSim(o, port);
    sim().chain().AddBlocks(add);
    ASSERT_TRUE(WaitIdle(id));
    // The pages really carried the lower (or null) mark.
    std::vector<FetchRecord> j = journal_.Of(id);
    bool carried = false;
    for (const FetchRecord& r : j) {
      if (r.is_page && r.items > 0 && r.from > o.chain.initial_head) {
        carried = true;
        EXPECT_EQ(r.has_finalized, !expect_null);
        if (r.has_finalized) {
          EXPECT_LT(r.finalized, 180u);
        }
      }
    }
    EXPECT_TRUE(carried);
  };

  catch_up_on(/*finality_lag=*/60, 10, /*expect_null=*/false);  // finalized 150
  check("after lower marks");
  Restart();
  check("after a restart (stored checkpoint)");
  ASSERT_TRUE(WaitIdle(id));
  check("after a restart (running)");
  catch_up_on(/*finality_lag=*/100000, 5, /*expect_null=*/true);  // finalized null
  check("after null marks");
  Restart();
  check("after a second restart");
  ExpectRowsCanonical(id, 150, head());
}

// A source started at "latest", over each transport, whose worker is abandoned after its
// first page arrived and before that page's barrier: the restarted worker asks the real
// simulator for that page again by its start block (the cursor was pinned to it before
// anything was applied), not for "latest", and the rows run from that block to the head.
TEST_F(ProviderRigTest, AFirstPageFromLatestIsAskedForAgainByItsStartBlock) {
  for (const handoff::v1::Transport transport :
       {handoff::v1::TRANSPORT_POLL, handoff::v1::TRANSPORT_SSE}) {
    const std::string id = transport == handoff::v1::TRANSPORT_POLL ? "latest-poll"
                                                                    : "latest-sse";
    SCOPED_TRACE(id);
    handoff::v1::SourceSpec spec = Spec(id, transport, 0);
    spec.mutable_start()->set_latest(true);
    absl::Notification crashed;
    consumer::FaultPoints::Arm("ingest.before_barrier", [&crashed] {
      if (crashed.HasBeenNotified()) return false;
      crashed.Notify();
      return true;
    });
    Create(spec);
    ASSERT_TRUE(crashed.WaitForNotificationWithTimeout(absl::Seconds(20)));
    consumer::FaultPoints::DisarmAll();
    const std::vector<FetchRecord> before = journal_.Of(id);
    ASSERT_FALSE(before.empty());
    EXPECT_EQ(before.front().cursor, "latest");
    ASSERT_TRUE(before.front().is_page);
    const uint64_t first = before.front().from;
    Restart();
    sim().chain().AddBlocks(5);
    ASSERT_TRUE(WaitCaughtUp(id));
    const std::vector<FetchRecord> after = journal_.Of(id);
    ASSERT_GT(after.size(), before.size());
    EXPECT_EQ(after[before.size()].cursor, absl::StrCat(first))
        << "the restarted worker did not ask for the first page by its start block";
    for (const FetchRecord& r : after) {
      if (&r != &after.front()) EXPECT_NE(r.cursor, "latest");
    }
    ExpectRowsCanonical(id, first, head());
  }
}

}  // namespace
}  // namespace handoff::tests
