// Regression test (found by tests/torture): a page attempt abandoned mid-page by a crash
// leaves durable receipts and an applied position beyond the committed range. If the
// chain reorganises those blocks before the restart, the provider (which never learned
// of the abandoned attempt: the cursor did not move) rightly serves a NON-correction
// page at the same cursor with new identities there. The engine used to halt the source
// as PROTOCOL_VIOLATION ("conflicting identity at applied position ... on a
// non-correction page") forever; it must replace the abandoned attempt's receipts and
// rows like a correction's orphans and proceed.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "consumer/fault_points.h"
#include "gtest/gtest.h"
#include "tests/crash/harness.h"

namespace handoff::tests {
namespace {

using consumer::FaultPoints;
using consumer::PageAttempt;
using consumer::testing::MakePage;
using consumer::testing::MakeRow;
using Kind = PageAttempt::Result::Kind;

std::string TempDir(const std::string& name) {
  const char* base = getenv("TEST_TMPDIR");
  return absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
}

// Blocks 100-101 committed at cursor "100" (next C1), then the page 102-104 at C1 on
// fork "a", which the tests' attempts abandon part-way.
Script BeforeTheReorg() {
  Script s;
  s.cursors = {"100", "C1"};
  s.pages.push_back(MakePage(100, 101, {MakeRow(100), MakeRow(101)}, "C1"));
  s.pages.push_back(MakePage(102, 104, {MakeRow(102), MakeRow(103), MakeRow(104)}, "C2"));
  return s;
}

// Commits blocks 100-101 (cursor C1), then a page 102-104 at C1 (fork "a") of which 102
// and 103 commit before the process dies (no barrier: the cursor stays C1). Meanwhile
// the chain reorganised: the provider serves the same cursor's page, not a correction
// (the client never committed past C1), with `refetched` as its items. The page must
// replace what the abandoned attempt wrote and pass its barrier.
void RunScenario(const std::string& dir, bool external_sink,
                 std::vector<handoff::v1::EventRow> refetched) {
  HarnessOptions o;
  o.start_block = 100;
  o.external_sink = external_sink;
  Harness h(TempDir(dir), o);
  h.Open();
  const Script before = BeforeTheReorg();
  h.Load(before);
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  FaultPoints::ArmNth("ingest.before_event_commit", 3);
  ASSERT_EQ(h.Step().kind, Kind::kCrashed);
  h.Crash();
  ASSERT_EQ(h.Checkpoint().resume_cursor(), "C1");
  ASSERT_EQ(h.Checkpoint().applied_block(), 103u);

  Script after;
  after.cursors = {"100", "C1"};
  after.pages.push_back(consumer::CopyOfPage(before.pages[0]));
  after.pages.push_back(MakePage(102, 104, std::move(refetched), "C2"));
  h.Load(after);
  PageAttempt::Result r = h.Step();
  ASSERT_EQ(r.kind, Kind::kPromoted) << r.detail;
  EXPECT_EQ(h.Checkpoint().resume_cursor(), "C2");
  EXPECT_EQ(h.Checkpoint().applied_block(), 104u);
  EXPECT_EQ(h.Rows(), ModelAfter(after, 2));
  EXPECT_EQ(CheckComplete(h, after), "");
}

// Blocks 103-104 get new identities (fork "b").
std::vector<handoff::v1::EventRow> Changed() {
  return {MakeRow(102), MakeRow(103, 0, "b"), MakeRow(104, 0, "b")};
}
// The new fork leaves 103's event out instead of changing it: no item conflicts with
// an outcome, and the old fork's 103 must still not survive beside the new 104.
std::vector<handoff::v1::EventRow> Omitted() { return {MakeRow(102), MakeRow(104, 0, "b")}; }

TEST(AbandonedAttemptReorg, NonCorrectionPageReplacesUncommittedReceipts) {
  RunScenario("abandoned-rows", false, Changed());
}

TEST(AbandonedAttemptReorg, WithAnImmediateSink) { RunScenario("abandoned-sink", true, Changed()); }

TEST(AbandonedAttemptReorg, OmittedEventIsReplaced) { RunScenario("omitted-rows", false, Omitted()); }

TEST(AbandonedAttemptReorg, OmittedEventIsReplacedWithAnImmediateSink) {
  RunScenario("omitted-sink", true, Omitted());
}

// The first page of a deep correction is split by the page limit: the correction covers
// 102-103, and the non-correction page after it, 104-106, carries the new fork's events
// at other positions than the old fork's. The old fork's rows above the correction
// (now above the committed range) must go too.
TEST(AbandonedAttemptReorg, DeepCorrectionSplitAcrossPagesReplacesTheOldFork) {
  HarnessOptions o;
  o.start_block = 100;
  Harness h(TempDir("split-correction"), o);
  h.Open();
  Script s;
  s.cursors = {"100", "C1", "C2", "C3"};
  s.pages.push_back(MakePage(100, 106, {MakeRow(100), MakeRow(102), MakeRow(104),
                                        MakeRow(105, 1), MakeRow(106)},
                             "C1"));
  s.pages.push_back(MakePage(102, 103, {MakeRow(102, 0, "b"), MakeRow(103, 2, "b")}, "C2",
                             /*reorg=*/true));
  s.pages.push_back(MakePage(104, 106, {MakeRow(104, 3, "b"), MakeRow(105, 0, "b")}, "C3"));
  h.Load(s);
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  PageAttempt::Result r = h.Step();
  ASSERT_EQ(r.kind, Kind::kPromoted) << r.detail;
  EXPECT_EQ(h.Checkpoint().resume_cursor(), "C3");
  EXPECT_EQ(h.Rows(), ModelAfter(s, 3));
  EXPECT_EQ(CheckComplete(h, s), "");
}

// A review hold written by the abandoned attempt for the old fork's event: the page at
// the same cursor has the new fork's event at that position, and no row conflicts. The
// hold is for an event that no longer exists: it must not survive to block nothing, be
// listed to operators forever, or later be resolved over the new event's row.
TEST(AbandonedAttemptReorg, HoldForTheOldForkIsReplaced) {
  HarnessOptions o;
  o.start_block = 100;
  o.external_sink = true;
  o.on_rejection = handoff::v1::REJECTION_POLICY_HOLD;
  Harness h(TempDir("abandoned-hold"), o);
  h.Open();
  const Script before = BeforeTheReorg();
  h.Load(before);
  const std::string old_103 = absl::StrFormat("0xa%062x", 103);
  h.sink().SetScript([old_103](const std::string& key, int) {
    consumer::SinkAnswer a;
    a.kind = key.find(old_103) != std::string::npos ? consumer::SinkAnswer::Kind::kNeedsReview
                                                    : consumer::SinkAnswer::Kind::kApplied;
    return a;
  });
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  ASSERT_EQ(h.Step().kind, Kind::kBlockedOnHold);
  ASSERT_EQ(h.Holds().size(), 1u);
  h.Crash();

  Script after;
  after.cursors = {"100", "C1"};
  after.pages.push_back(consumer::CopyOfPage(before.pages[0]));
  after.pages.push_back(MakePage(
      102, 104, {MakeRow(102), MakeRow(103, 0, "b"), MakeRow(104, 0, "b")}, "C2"));
  h.Load(after);
  PageAttempt::Result r = h.Step();
  ASSERT_EQ(r.kind, Kind::kPromoted) << r.detail;
  EXPECT_EQ(h.Checkpoint().resume_cursor(), "C2");
  EXPECT_TRUE(h.Holds().empty()) << "the old fork's hold survived: "
                                 << h.Holds().front().ShortDebugString();
  EXPECT_EQ(CheckComplete(h, after), "");
}

// A conflict inside the committed range is still a contract violation.
TEST(AbandonedAttemptReorg, ConflictBelowTheCommittedRangeStillHalts) {
  HarnessOptions o;
  o.start_block = 100;
  Harness h(TempDir("abandoned-committed"), o);
  h.Open();
  Script s;
  s.cursors = {"100", "C1"};
  s.pages.push_back(MakePage(100, 101, {MakeRow(100), MakeRow(101)}, "C1"));
  // An overlapping non-correction page that changes committed block 101.
  s.pages.push_back(MakePage(101, 102, {MakeRow(101, 0, "b"), MakeRow(102)}, "C2"));
  h.Load(s);
  ASSERT_EQ(h.Step().kind, Kind::kPromoted);
  PageAttempt::Result r = h.Step();
  EXPECT_EQ(r.kind, Kind::kViolation);
  EXPECT_NE(r.detail.find("conflicting identity"), std::string::npos) << r.detail;
}

}  // namespace
}  // namespace handoff::tests
