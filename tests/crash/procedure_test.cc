// The seed's walkthroughs as executed tests, holds and their resolution, empty pages,
// corrections, stale concurrent retries with real threads, and the seed's "common
// unsafe shortcuts", each shown impossible.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "consumer/fault_points.h"
#include "consumer/sink.h"
#include "gtest/gtest.h"
#include "tests/crash/harness.h"
#include "tests/crash/scripts.h"

namespace handoff::tests {
namespace {

using consumer::FaultPoints;
using consumer::PageAttempt;
using consumer::SinkAnswer;
using consumer::testing::MakePage;
using consumer::testing::MakeRow;
using Kind = PageAttempt::Result::Kind;

Position P(uint64_t b, uint64_t i = 0) { return Position{b, i}; }

Position Applied(const store::CheckpointRecord& cp) {
  return Position{cp.applied_block(), cp.applied_log_index()};
}

// Seed walkthrough 1: checkpoint C7 at applied position 105; fetching C7 returns 104
// (an overlap), 106 and 107, then C8. A crash after 106 leaves C7; the retry sees 104
// and 106 as complete, applies 107, and only then promotes C8.
TEST(SeedWalkthrough, CursorC7AppliedAt105) {
  HarnessOptions o;
  o.start_block = 104;
  Harness h(consumer::testing::TestDir("walk1"), o);
  h.Open();
  // Reach "cursor C7, applied 105": a first page with 104 and 105.
  Script s;
  s.cursors = {"104", "C7"};
  s.pages.push_back(MakePage(104, 105, {MakeRow(104), MakeRow(105)}, "C7"));
  s.pages.push_back(MakePage(104, 107, {MakeRow(104), MakeRow(106), MakeRow(107)}, "C8"));
  h.Load(s);
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  ASSERT_EQ(h.Checkpoint().resume_cursor(), "C7");
  ASSERT_EQ(Applied(h.Checkpoint()), P(105));

  // 104 is a replay, 106 commits, then the process dies before 107.
  FaultPoints::ArmNth("ingest.before_event_commit", 2);
  ASSERT_EQ(h.Step().kind, Kind::kCrashed);
  h.Crash();
  EXPECT_EQ(h.Checkpoint().resume_cursor(), "C7");
  EXPECT_EQ(Applied(h.Checkpoint()), P(106));
  EXPECT_EQ(h.Rows().count(P(107)), 0u);

  // The retry recognises 104 and 106, applies 107, then promotes C8.
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  EXPECT_EQ(h.Checkpoint().resume_cursor(), "C8");
  EXPECT_EQ(Applied(h.Checkpoint()), P(107));
  EXPECT_EQ(consumer::testing::CountingEffect::Count(*h.store(), h.id(), P(106)), 1);
  EXPECT_EQ(CheckInvariants(h, s), "");
}

TEST(SeedWalkthrough, C8NeverPromotedWhile107HasNoDurableOutcome) {
  HarnessOptions o = HarnessOptions{};
  o.external_sink = true;
  o.on_rejection = handoff::v1::REJECTION_POLICY_HOLD;
  o.start_block = 104;
  Harness h(consumer::testing::TestDir("walk1b"), o);
  h.Open();
  Script s;
  s.cursors = {"104"};
  s.pages.push_back(MakePage(104, 107, {MakeRow(104), MakeRow(106), MakeRow(107)}, "C8"));
  h.Load(s);
  h.sink().SetScript([](const std::string& key, int) {
    SinkAnswer a;
    a.kind = key.find(absl::StrFormat("%062x", 107)) != std::string::npos
                 ? SinkAnswer::Kind::kNeedsReview
                 : SinkAnswer::Kind::kApplied;
    return a;
  });
  EXPECT_EQ(h.Step().kind, Kind::kBlockedOnHold);
  EXPECT_EQ(h.Checkpoint().resume_cursor(), "104");
  EXPECT_EQ(Applied(h.Checkpoint()), P(106));
  h.Crash();
  EXPECT_EQ(h.Step().kind, Kind::kBlockedOnHold);
  EXPECT_EQ(h.Checkpoint().resume_cursor(), "104");
}

// Seed walkthrough 2: 210 and 212 durable, 211 quarantined only in memory: the prefix
// stops at 210 and the cursor stays pending; a durable quarantine receipt for 211 lets
// the prefix extend through 212 and the barrier proceed.
TEST(SeedWalkthrough, QuarantineBoundary210To212) {
  HarnessOptions o;
  o.external_sink = true;
  o.sink_batch = 3;
  o.on_rejection = handoff::v1::REJECTION_POLICY_QUARANTINE;
  o.start_block = 210;
  Harness h(consumer::testing::TestDir("walk2"), o);
  h.Open();
  Script s;
  s.cursors = {"210"};
  s.pages.push_back(MakePage(210, 212, {MakeRow(210), MakeRow(211), MakeRow(212)}, "N"));
  h.Load(s);
  auto reject_211 = [](const std::string& key, int) {
    SinkAnswer a;
    a.kind = key.find(absl::StrFormat("%062x", 211)) != std::string::npos
                 ? SinkAnswer::Kind::kRejected
                 : SinkAnswer::Kind::kApplied;
    return a;
  };
  h.sink().SetScript(reject_211);
  // The worker decided "quarantine 211" in memory; it dies before the receipt.
  FaultPoints::ArmNth("ingest.before_quarantine_commit", 1);
  ASSERT_EQ(h.Step().kind, Kind::kCrashed);
  h.Crash();
  store::CheckpointRecord cp = h.Checkpoint();
  EXPECT_EQ(Applied(cp), P(210)) << "an in-memory quarantine does not close the prefix";
  EXPECT_EQ(cp.resume_cursor(), "210");
  EXPECT_EQ(h.Rows().count(P(212)), 1u) << "212 is durable";
  EXPECT_EQ(h.Rows().count(P(211)), 0u);

  h.sink().SetScript(reject_211);
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  cp = h.Checkpoint();
  EXPECT_EQ(Applied(cp), P(212));
  EXPECT_EQ(cp.resume_cursor(), "N");
  EXPECT_EQ(cp.counters().quarantined(), 1u);
}

HarnessOptions ReviewSink() {
  HarnessOptions o;
  o.external_sink = true;
  o.on_rejection = handoff::v1::REJECTION_POLICY_HOLD;
  o.max_attempts = 2;
  return o;
}

// Operator review, transient dead-letter and a reversible hold each block the barrier;
// only a durable terminal receipt (QUARANTINE or IGNORE) unblocks it.
TEST(ReversibleHolds, EachKindBlocksUntilATerminalReceipt) {
  struct Case {
    const char* name;
    SinkAnswer::Kind answer;
    handoff::v1::HoldKind kind;
    handoff::v1::HoldDecision decision;
  };
  for (const Case& c : {
           Case{"review", SinkAnswer::Kind::kNeedsReview, handoff::v1::HOLD_KIND_OPERATOR_REVIEW,
                handoff::v1::HOLD_DECISION_IGNORE},
           Case{"rejected-hold", SinkAnswer::Kind::kRejected,
                handoff::v1::HOLD_KIND_OPERATOR_REVIEW, handoff::v1::HOLD_DECISION_QUARANTINE},
           Case{"dead-letter", SinkAnswer::Kind::kRetryLater,
                handoff::v1::HOLD_KIND_RETRYABLE_DEAD_LETTER,
                handoff::v1::HOLD_DECISION_QUARANTINE},
       }) {
    SCOPED_TRACE(c.name);
    Harness h(consumer::testing::TestDir(absl::StrCat("holds-", c.name)), ReviewSink());
    h.Open();
    Script s = LinearScript(100, 2);
    h.Load(s);
    const std::string held_hash = MakeRow(100, 1).block_hash();
    h.sink().SetScript([&](const std::string& key, int) {
      SinkAnswer a;
      a.kind = key == absl::StrCat(h.id(), "/", held_hash, "/1") ? c.answer
                                                                  : SinkAnswer::Kind::kApplied;
      a.message = "downstream says no";
      return a;
    });
    PageAttempt::Result r = h.RunUntilIdle();
    ASSERT_EQ(r.kind, Kind::kBlockedOnHold) << r.detail;
    EXPECT_EQ(h.Checkpoint().resume_cursor(), "100") << "the barrier is blocked";
    EXPECT_EQ(Applied(h.Checkpoint()), P(100, 0));
    std::vector<handoff::v1::Hold> holds = h.Holds();
    ASSERT_EQ(holds.size(), 1u);
    EXPECT_EQ(holds[0].kind(), c.kind);
    EXPECT_EQ(holds[0].event().log_index(), 1u);
    EXPECT_NE(holds[0].last_sink_answer().find("downstream says no"), std::string::npos);

    // A restart does not lose the hold, nor unblock the barrier.
    h.Crash();
    ASSERT_EQ(h.RunUntilIdle().kind, Kind::kBlockedOnHold);
    EXPECT_EQ(h.Checkpoint().resume_cursor(), "100");

    // A stale hold version is ABORTED and changes nothing.
    handoff::v1::ResolveHoldRequest stale;
    stale.set_source_id(h.id());
    stale.set_stage(handoff::v1::STAGE_INGEST);
    stale.set_block_number(100);
    stale.set_log_index(1);
    stale.set_decision(c.decision);
    stale.set_reason("late click");
    stale.set_hold_version(h.Holds()[0].version() + 7);
    EXPECT_EQ(h.manager()->ResolveHold(stale, "op").status().code(), absl::StatusCode::kAborted);
    EXPECT_EQ(h.Holds().size(), 1u);

    // The terminal decision unblocks the barrier; the worker continues from the hold.
    absl::StatusOr<handoff::v1::ResolveHoldResponse> res = h.Resolve(P(100, 1), c.decision);
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(res->record().actor(), "test-operator");
    EXPECT_EQ(res->record().from_hold_version(), holds[0].version() + 0 * 1);
    ASSERT_EQ(h.RunUntilIdle().kind, Kind::kNothingNew);
    EXPECT_EQ(CheckComplete(h, s), "");
    EXPECT_TRUE(h.Holds().empty());
  }
}

TEST(ReversibleHolds, RetryDecisionRedrivesTheEvent) {
  Harness h(consumer::testing::TestDir("holds-retry"), ReviewSink());
  h.Open();
  Script s = LinearScript(100, 1);
  h.Load(s);
  std::atomic<bool> sink_fixed{false};
  h.sink().SetScript([&](const std::string& key, int) {
    SinkAnswer a;
    a.kind = (!sink_fixed.load() && key.substr(key.size() - 2) == "/1")
                 ? SinkAnswer::Kind::kNeedsReview
                 : SinkAnswer::Kind::kApplied;
    return a;
  });
  ASSERT_EQ(h.RunUntilIdle().kind, Kind::kBlockedOnHold);
  sink_fixed = true;
  ASSERT_TRUE(h.Resolve(P(100, 1), handoff::v1::HOLD_DECISION_RETRY).ok());
  ASSERT_EQ(h.RunUntilIdle().kind, Kind::kNothingNew);
  EXPECT_EQ(CheckComplete(h, s), "");
  EXPECT_EQ(h.sink().effects(absl::StrCat(h.id(), "/", MakeRow(100, 1).block_hash(), "/1")), 1);
}

TEST(ReversibleHolds, RetryingAttemptsArePersistedAcrossRestarts) {
  HarnessOptions o = ReviewSink();
  o.max_attempts = 4;
  o.initial_backoff_ms = 60000;  // the next retry is never due within the test
  Harness h(consumer::testing::TestDir("holds-attempts"), o);
  h.Open();
  Script s = LinearScript(100, 1);
  h.Load(s);
  auto script = [](const std::string& key, int) {
    SinkAnswer a;
    a.kind = key.substr(key.size() - 2) == "/1" ? SinkAnswer::Kind::kRetryLater
                                               : SinkAnswer::Kind::kApplied;
    return a;
  };
  h.sink().SetScript(script);
  // Each restart re-drives the retrying event at once, with its persisted attempts.
  for (uint32_t attempt = 1; attempt < 4; ++attempt) {
    ASSERT_EQ(h.Step().kind, Kind::kRetryLater);
    std::vector<handoff::v1::Hold> holds = h.Holds();
    ASSERT_EQ(holds.size(), 1u);
    EXPECT_EQ(holds[0].attempts(), attempt);
    EXPECT_EQ(holds[0].kind(), handoff::v1::HOLD_KIND_RETRYING);
    EXPECT_EQ(h.Checkpoint().resume_cursor(), "100");
    h.Crash();
  }
  // The fourth attempt reaches max_attempts: a retryable dead letter, still blocking.
  PageAttempt::Result r = h.Step();
  ASSERT_EQ(r.kind, Kind::kBlockedOnHold) << r.detail;
  EXPECT_EQ(h.Holds()[0].kind(), handoff::v1::HOLD_KIND_RETRYABLE_DEAD_LETTER);
  EXPECT_EQ(h.Holds()[0].attempts(), 4u);
  EXPECT_EQ(h.Checkpoint().resume_cursor(), "100");
}

TEST(EmptyPages, AdvancingTokenPassesTheBarrierWithoutMovingAppliedPosition) {
  Harness h(consumer::testing::TestDir("empty-adv"), HarnessOptions{});
  h.Open();
  Script s;
  s.cursors = {"100", "E1", "E2"};
  s.pages.push_back(MakePage(100, 101, {MakeRow(100)}, "E1"));
  consumer::Page empty = MakePage(102, 150, {}, "E2");
  s.pages.push_back(std::move(empty));
  consumer::Page empty_null_through;
  empty_null_through.from = 151;
  empty_null_through.next = "E3";
  s.pages.push_back(std::move(empty_null_through));
  h.Load(s);
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  const store::CheckpointRecord before = h.Checkpoint();
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  store::CheckpointRecord after = h.Checkpoint();
  EXPECT_EQ(after.resume_cursor(), "E2");
  EXPECT_EQ(after.version(), before.version() + 1);
  EXPECT_EQ(Applied(after), Applied(before));
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  EXPECT_EQ(h.Checkpoint().resume_cursor(), "E3");
  EXPECT_EQ(Applied(h.Checkpoint()), Applied(before));
}

TEST(EmptyPages, NonAdvancingTokenNeverPassesTheBarrier) {
  Harness h(consumer::testing::TestDir("empty-same"), HarnessOptions{});
  h.Open();
  const store::CheckpointRecord before = h.Checkpoint();
  for (int i = 0; i < 5; ++i) {
    // FakeProvider answers unknown cursors with an empty page and the same next.
    EXPECT_EQ(h.Step().kind, Kind::kNothingNew);
  }
  const store::CheckpointRecord after = h.Checkpoint();
  EXPECT_EQ(after.resume_cursor(), before.resume_cursor());
  EXPECT_EQ(after.version(), before.version());
  EXPECT_EQ(after.step_seq(), before.step_seq()) << "nothing was written";
}

// An empty page that covers no block (null through) but moves the cursor keeps the
// committed range: a later non-correction page that rewrites committed history still
// halts. The range is open above it (the cursor moved past blocks the page did not
// name), so the next page may start further on; once a page names its blocks again, a
// gap after them halts again.
TEST(EmptyPages, NullThroughKeepsTheCommittedRangeChecked) {
  auto run = [](const std::string& dir, std::vector<consumer::Page> later) {
    auto h = std::make_unique<Harness>(consumer::testing::TestDir(dir), HarnessOptions{});
    h->Open();
    Script s;
    s.cursors = {"100", "N1"};
    s.pages.push_back(MakePage(100, 101, {MakeRow(100), MakeRow(101)}, "N1"));
    consumer::Page empty_null_through;
    empty_null_through.from = 102;
    empty_null_through.next = "N2";
    s.pages.push_back(std::move(empty_null_through));
    for (consumer::Page& p : later) {
      s.cursors.push_back(s.pages.back().next);
      s.pages.push_back(std::move(p));
    }
    h->Load(s);
    EXPECT_EQ(h->Step().kind, Kind::kPromoted);
    EXPECT_EQ(h->Step().kind, Kind::kPromoted);
    EXPECT_TRUE(h->Checkpoint().has_covered());
    EXPECT_EQ(h->Checkpoint().covered_through(), 101u);
    EXPECT_TRUE(h->Checkpoint().covered_open());
    return h;
  };
  {
    std::vector<consumer::Page> later;
    later.push_back(MakePage(101, 102, {MakeRow(101, 0, "b"), MakeRow(102)}, "N3"));
    std::unique_ptr<Harness> h = run("null-through-conflict", std::move(later));
    const PageAttempt::Result r = h->Step();
    EXPECT_EQ(r.kind, Kind::kViolation) << r.detail;
    EXPECT_NE(r.detail.find("conflicting identity"), std::string::npos) << r.detail;
    EXPECT_EQ(h->Rows().count(P(102)), 0u) << "nothing of the page was applied";
  }
  {
    std::vector<consumer::Page> later;
    later.push_back(MakePage(150, 151, {MakeRow(150)}, "N3"));
    later.push_back(MakePage(160, 161, {MakeRow(160)}, "N4"));
    std::unique_ptr<Harness> h = run("null-through-open", std::move(later));
    EXPECT_EQ(h->Step().kind, Kind::kPromoted) << "the range is open above block 101";
    EXPECT_FALSE(h->Checkpoint().covered_open());
    EXPECT_EQ(h->Checkpoint().covered_through(), 151u);
    const PageAttempt::Result r = h->Step();
    EXPECT_EQ(r.kind, Kind::kViolation) << r.detail;
    EXPECT_NE(r.detail.find("gap"), std::string::npos) << r.detail;
  }
}

// A correction that covers no block (null through): the chain now ends below `from`, so
// what was applied from there up was on the abandoned fork, and goes; the applied
// position and the committed range end below `from`. The new fork's blocks then come as
// ordinary pages.
TEST(Corrections, NullThroughReplacesEverythingFromItsStart) {
  Harness h(consumer::testing::TestDir("reorg-null-through"), HarnessOptions{});
  h.Open();
  Script s;
  s.cursors = {"100", "R1", "R2"};
  s.pages.push_back(MakePage(100, 105, {MakeRow(100), MakeRow(102), MakeRow(104), MakeRow(105)},
                             "R1"));
  consumer::Page shrink;
  shrink.from = 103;
  shrink.reorg = true;
  shrink.next = "R2";
  s.pages.push_back(std::move(shrink));
  s.pages.push_back(MakePage(103, 104, {MakeRow(103, 0, "b"), MakeRow(104, 1, "b")}, "R3"));
  h.Load(s);
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  PageAttempt::Result r = h.Step();
  ASSERT_EQ(r.kind, Kind::kPromoted) << r.detail;
  EXPECT_EQ(h.Rows(), ModelAfter(s, 2));
  EXPECT_EQ(h.Rows().count(P(104)), 0u) << "the abandoned fork's 104 survived";
  ASSERT_TRUE(h.Checkpoint().has_applied());
  EXPECT_LT(Applied(h.Checkpoint()), P(103)) << "applied stays below the replaced blocks";
  EXPECT_EQ(h.Checkpoint().covered_through(), 102u);
  EXPECT_EQ(CheckInvariants(h, s), "");
  r = h.Step();
  ASSERT_EQ(r.kind, Kind::kPromoted) << r.detail;
  EXPECT_EQ(CheckComplete(h, s), "");
}

TEST(Corrections, ReorgReplacesTheRangeEvenBelowTheStartBlock) {
  Harness h(consumer::testing::TestDir("reorg"), HarnessOptions{});
  h.Open();
  Script s;
  s.cursors = {"100", "R1", "R2"};
  s.pages.push_back(MakePage(100, 103, {MakeRow(100), MakeRow(101), MakeRow(102), MakeRow(103)},
                             "R1"));
  // Fork "b" replaces 98..102 (below the start block 100): 101 vanishes, 100/102 change.
  s.pages.push_back(MakePage(98, 102, {MakeRow(98, 0, "b"), MakeRow(100, 0, "b"),
                                       MakeRow(102, 0, "b")},
                             "R2", /*reorg=*/true));
  s.pages.push_back(MakePage(103, 104, {MakeRow(103, 0, "b"), MakeRow(104, 0, "b")}, "R3",
                             /*reorg=*/true));
  h.Load(s);
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  FaultPoints::ArmNth("ingest.after_event_commit", 1);  // crash mid-correction
  ASSERT_EQ(h.Step().kind, Kind::kCrashed);
  h.Crash();
  EXPECT_EQ(CheckInvariants(h, s), "");
  ASSERT_EQ(h.RunUntilIdle().kind, Kind::kNothingNew);
  EXPECT_EQ(CheckComplete(h, s), "");
  EXPECT_EQ(h.Rows().count(P(101)), 0u);
  EXPECT_EQ(h.Rows().count(P(98)), 1u) << "from is never clamped to the start block";
  EXPECT_EQ(h.Checkpoint().counters().corrections(), 2u);
}

// A correction with no items whose cursor stays where it was (a provider whose cursor is
// a block number has nothing else to send) still names blocks whose events are gone:
// they are deleted, the unchanged cursor committed. Served again, it replaces nothing
// and is the contract's "nothing new yet". Before: taken for nothing new at once, and the
// abandoned fork's 103 and 104 stayed among the rows for good.
TEST(Corrections, AnEmptyCorrectionWithAnUnchangedCursorStillDeletesItsOrphans) {
  Harness h(consumer::testing::TestDir("reorg-empty-same-cursor"), HarnessOptions{});
  h.Open();
  Script s;
  s.cursors = {"100", "N"};
  s.pages.push_back(MakePage(100, 105, {MakeRow(100), MakeRow(103), MakeRow(104)}, "N"));
  s.pages.push_back(MakePage(103, 105, {}, "N", /*reorg=*/true));
  h.Load(s);
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  const store::CheckpointRecord before = h.Checkpoint();
  const PageAttempt::Result r = h.Step();
  ASSERT_EQ(r.kind, Kind::kPromoted) << r.detail;
  EXPECT_EQ(h.Rows().count(P(103)), 0u) << "the abandoned fork's 103 survived";
  EXPECT_EQ(h.Rows().count(P(104)), 0u);
  EXPECT_EQ(h.Rows().count(P(100)), 1u);
  EXPECT_EQ(h.Checkpoint().resume_cursor(), "N");
  EXPECT_EQ(h.Checkpoint().version(), before.version() + 1);
  EXPECT_LT(Applied(h.Checkpoint()), P(103));
  EXPECT_EQ(h.Checkpoint().counters().corrections(), 1u);
  EXPECT_EQ(h.Step().kind, Kind::kNothingNew) << "nothing left to replace";
  EXPECT_EQ(h.Checkpoint().version(), before.version() + 1);
}

// A page that overlaps the committed range and ends inside it (allowed: overlap at or
// below what was applied is replayed) does not lower the range's end: what was
// committed above it stays checked, and a later non-correction page that rewrites it
// halts. Before: the end dropped to the overlap's, and block 108's applied event was
// replaced by another fork's without a halt.
TEST(UnsafeShortcuts, AnOverlappingPageNeverShrinksTheCommittedRange) {
  Harness h(consumer::testing::TestDir("overlap-shrink"), HarnessOptions{});
  h.Open();
  Script s;
  s.cursors = {"100", "N1", "N2"};
  s.pages.push_back(MakePage(100, 110, {MakeRow(100), MakeRow(108)}, "N1"));
  s.pages.push_back(MakePage(100, 104, {MakeRow(100)}, "N2"));
  s.pages.push_back(MakePage(105, 112, {MakeRow(108, 0, "b"), MakeRow(111)}, "N3"));
  h.Load(s);
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  PageAttempt::Result r = h.Step();
  ASSERT_EQ(r.kind, Kind::kPromoted) << r.detail;
  EXPECT_EQ(h.Checkpoint().covered_through(), 110u);
  EXPECT_EQ(h.Checkpoint().resume_cursor(), "N2");
  r = h.Step();
  EXPECT_EQ(r.kind, Kind::kViolation) << r.detail;
  EXPECT_NE(r.detail.find("conflicting identity"), std::string::npos) << r.detail;
  EXPECT_EQ(h.Rows().count(P(111)), 0u) << "nothing of the page was applied";
  EXPECT_EQ(h.Rows().at(P(108)), MakeRow(108).block_hash()) << "the applied 108 was replaced";
}

// A non-correction page that overlaps the committed range with a new event in a
// committed block, on another fork's block hash, is that fork's block replacing the
// applied one, which only a correction may do: the source halts before any effect.
// Before: the new event was applied beside the old fork's, block 105 held both.
TEST(UnsafeShortcuts, AnotherForksEventInACommittedBlockHaltsOutsideACorrection) {
  Harness h(consumer::testing::TestDir("overlap-other-fork"), HarnessOptions{});
  h.Open();
  Script s;
  s.cursors = {"100", "N1"};
  s.pages.push_back(MakePage(100, 105, {MakeRow(105, 0, "a")}, "N1"));
  s.pages.push_back(MakePage(105, 106, {MakeRow(105, 1, "b"), MakeRow(106, 0, "b")}, "N2"));
  h.Load(s);
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  const PageAttempt::Result r = h.Step();
  EXPECT_EQ(r.kind, Kind::kViolation) << r.detail;
  EXPECT_NE(r.detail.find("conflicting identity in committed block 105"), std::string::npos)
      << r.detail;
  EXPECT_EQ(h.Rows().count(P(105, 1)), 0u) << "another fork's event was applied";
  EXPECT_EQ(h.Rows().count(P(106)), 0u);
  EXPECT_EQ(h.Checkpoint().resume_cursor(), "N1");
}

TEST(UnsafeShortcuts, AppliedWatermarkIsNeverTheLargestPositionInThePage) {
  HarnessOptions o = ReviewSink();
  o.sink_batch = 3;
  Harness h(consumer::testing::TestDir("watermark"), o);
  h.Open();
  Script s = LinearScript(100, 1);  // 100:0, 100:1, 101:0
  h.Load(s);
  h.sink().SetScript([](const std::string& key, int) {
    SinkAnswer a;
    a.kind = key.substr(key.size() - 2) == "/1" ? SinkAnswer::Kind::kNeedsReview
                                               : SinkAnswer::Kind::kApplied;
    return a;
  });
  ASSERT_EQ(h.Step().kind, Kind::kBlockedOnHold);
  EXPECT_EQ(Applied(h.Checkpoint()), P(100, 0)) << "101:0 is durable but 100:1 is not";
  EXPECT_EQ(h.Rows().count(P(101, 0)), 1u);
}

TEST(UnsafeShortcuts, OpaqueTokensAreNeverComparedOrIncremented) {
  Harness h(consumer::testing::TestDir("opaque"), HarnessOptions{});
  h.Open();
  Script s;
  // Tokens that decrease as text and as numbers: only equality is ever used.
  s.cursors = {"100", "zz-9", "5"};
  s.pages.push_back(MakePage(100, 100, {MakeRow(100)}, "zz-9"));
  s.pages.push_back(MakePage(101, 101, {MakeRow(101)}, "5"));
  s.pages.push_back(MakePage(102, 102, {MakeRow(102)}, "0"));
  h.Load(s);
  ASSERT_EQ(h.RunUntilIdle().kind, Kind::kNothingNew);
  EXPECT_EQ(CheckComplete(h, s), "");
}

TEST(UnsafeShortcuts, LateRetryCannotOverwriteANewerCheckpoint) {
  Harness h(consumer::testing::TestDir("late-retry"), HarnessOptions{});
  h.Open();
  Script s = LinearScript(100, 2);
  h.Load(s);
  const store::CheckpointRecord stale = h.Checkpoint();
  ASSERT_EQ(h.RunUntilIdle().kind, Kind::kNothingNew);
  const store::CheckpointRecord newest = h.Checkpoint();
  absl::StatusOr<store::CheckpointRecord> r = h.store()->CompareAndSwap(
      h.id(), store::Stage::kIngest, stale.resume_cursor(), stale.version(), "c1");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  // The version alone fences too: a late retry that names the current cursor (a provider
  // whose cursors repeat) with the version it read is refused.
  ASSERT_NE(stale.version(), newest.version());
  r = h.store()->CompareAndSwap(h.id(), store::Stage::kIngest, newest.resume_cursor(),
                                stale.version(), "c1");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(h.Checkpoint().resume_cursor(), newest.resume_cursor());
  EXPECT_EQ(h.Checkpoint().version(), newest.version());
}

TEST(UnsafeShortcuts, NoWatermarkTrustWhenTheProviderBackfills) {
  Harness h(consumer::testing::TestDir("backfill"), HarnessOptions{});
  h.Open();
  Script s;
  s.cursors = {"100", "B1"};
  s.pages.push_back(MakePage(100, 102, {MakeRow(100), MakeRow(102)}, "B1"));
  // A non-correction page sneaks in 101:0 below the applied position.
  s.pages.push_back(MakePage(100, 103, {MakeRow(100), MakeRow(101), MakeRow(102), MakeRow(103)},
                             "B2"));
  h.Load(s);
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  PageAttempt::Result r = h.Step();
  EXPECT_EQ(r.kind, Kind::kViolation);
  EXPECT_NE(r.detail.find("101:0"), std::string::npos) << r.detail;
  EXPECT_EQ(h.Checkpoint().resume_cursor(), "B1");
  EXPECT_EQ(h.Rows().count(P(103)), 0u) << "nothing of the bad page was applied";
}

TEST(Validation, ContractBreakingPagesHaltBeforeAnyEffect) {
  struct Case {
    const char* name;
    consumer::Page page;
    const char* needle;
  };
  Case cases[] = {
      {"order", MakePage(100, 101, {MakeRow(101), MakeRow(100)}, "X"), "out of order"},
      {"range", MakePage(100, 101, {MakeRow(100), MakeRow(105)}, "X"), "outside"},
      {"gap", MakePage(150, 151, {MakeRow(150)}, "X"), "gap"},
      {"stuck", MakePage(100, 101, {MakeRow(100)}, "100"), "did not advance"},
  };
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    Harness h(consumer::testing::TestDir(absl::StrCat("validate-", c.name)), HarnessOptions{});
    h.Open();
    h.provider().SetPage("100", consumer::CopyOfPage(c.page));
    PageAttempt::Result r = h.Step();
    EXPECT_EQ(r.kind, Kind::kViolation);
    EXPECT_NE(r.detail.find(c.needle), std::string::npos) << r.detail;
    EXPECT_TRUE(h.Rows().empty());
    EXPECT_EQ(h.Checkpoint().resume_cursor(), "100");
  }
}

// Two attempts on the same source, each on its own thread, both loaded from the same
// checkpoint (a late retry of a stale worker): at most one promotes, and no event is
// applied twice.
TEST(StaleConcurrentRetries, OnlyOneAttemptPromotesWithRealThreads) {
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE(round);
    Harness h(consumer::testing::TestDir(absl::StrCat("race-", round)), HarnessOptions{});
    h.Open();
    Script s = LinearScript(100, 1);
    h.Load(s);
    const store::CheckpointRecord cp = h.Checkpoint();
    consumer::FetchResult f = h.provider().Fetch(cp.resume_cursor());
    consumer::testing::CountingEffect effect(h.store());
    consumer::WorkerOptions wo;
    wo.max_events_per_step = 1;
    wo.fuse_barrier = false;
    consumer::AttemptConfig config = consumer::MakeAttemptConfig(
        h.spec(), store::Stage::kIngest, h.store(), nullptr, &effect, nullptr, wo, nullptr);
    PageAttempt a(config, cp, consumer::CopyOfPage(*f.page)), b(config, cp, *std::move(f.page));
    absl::Notification go;
    PageAttempt::Result ra, rb;
    std::thread ta([&] {
      go.WaitForNotification();
      ra = a.Run();
    });
    std::thread tb([&] {
      go.WaitForNotification();
      rb = b.Run();
    });
    go.Notify();
    ta.join();
    tb.join();
    const int promoted = (ra.kind == Kind::kPromoted) + (rb.kind == Kind::kPromoted);
    EXPECT_LE(promoted, 1);
    for (const PageAttempt::Result& r : {ra, rb}) {
      EXPECT_TRUE(r.kind == Kind::kPromoted || r.kind == Kind::kLostRace) << r.detail;
    }
    // The loser rereads state and finishes the page.
    ASSERT_EQ(h.RunUntilIdle().kind, Kind::kNothingNew);
    EXPECT_EQ(CheckComplete(h, s), "");
    EXPECT_EQ(h.Checkpoint().version(), cp.version() + 1);
  }
}

}  // namespace
}  // namespace handoff::tests
