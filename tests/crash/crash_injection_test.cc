// The crash-injection suite (issue 3): a "crash" abandons the attempt in flight at a
// named fault point, cuts the power (every file loses what was not synced) and reopens
// the database from disk in a fresh engine, which then runs to completion. After each crash and at the end the durable state is
// checked: no event skipped, each transactional effect applied once, each external
// effect once per idempotency key with the same key on every replay, the cursor never
// past a non-terminal event, applied_position never past the durable prefix.
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
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
using Kind = PageAttempt::Result::Kind;

// For external sinks: every applied row was delivered once per key, with one key.
void ExpectSinkExactlyOnce(Harness& h) {
  for (const auto& [pos, hash] : h.Rows()) {
    std::vector<std::string> keys = h.sink().keys_for(pos.block, pos.log_index);
    ASSERT_FALSE(keys.empty()) << pos.DebugString() << " never delivered";
    const std::string expected = absl::StrCat(h.id(), "/", hash, "/", pos.log_index);
    for (const std::string& k : keys) {
      if (k.find(hash) != std::string::npos) {
        EXPECT_EQ(k, expected);
      }
    }
    EXPECT_EQ(h.sink().effects(expected), 1) << pos.DebugString();
  }
}

// The sink attempts so far of every event whose outcome is durable (a row, or a durable
// quarantine record), by idempotency key.
std::map<std::string, int> DurableAttempts(Harness& h) {
  std::map<std::string, int> out;
  for (const auto& [pos, hash] : h.Rows()) {
    const std::string key = absl::StrCat(h.id(), "/", hash, "/", pos.log_index);
    out[key] = h.sink().attempts(key);
  }
  handoff::v1::ListQuarantineRequest req;
  req.set_source_id(h.id());
  absl::StatusOr<handoff::v1::ListQuarantineResponse> q = h.manager()->ListQuarantine(req);
  EXPECT_TRUE(q.ok()) << q.status();
  if (q.ok()) {
    for (const auto& rec : q->records()) {
      const std::string key =
          absl::StrCat(h.id(), "/", rec.event().block_hash(), "/", rec.event().log_index());
      out[key] = h.sink().attempts(key);
    }
  }
  return out;
}

// Invariant 4: an event whose outcome was durable at the crash is a replay afterwards,
// never sent to the sink again. (FakeSink dedupes like a good downstream, so its effect
// count alone could not show a second delivery; its attempt count does.)
void ExpectNoneResent(Harness& h, const std::map<std::string, int>& durable_at_crash) {
  for (const auto& [key, attempts] : durable_at_crash) {
    EXPECT_EQ(h.sink().attempts(key), attempts) << key << " had a durable outcome, sent again";
  }
}

int CountHits(const HarnessOptions& options, const Script& script, const std::string& point,
              const std::string& dir) {
  Harness h(dir, options);
  h.Open();
  h.Load(script);
  FaultPoints::CountHits(true);
  PageAttempt::Result r = h.RunUntilIdle();
  int hits = FaultPoints::Hits(point);
  FaultPoints::DisarmAll();
  EXPECT_EQ(r.kind, Kind::kNothingNew) << r.detail;
  EXPECT_EQ(CheckComplete(h, script), "");
  return hits;
}

// Crashes at every hit of `point`, one run per hit, and checks the invariants after
// the crash and after recovery.
void CrashAtEveryHit(const std::string& name, const HarnessOptions& options,
                     const Script& script, const std::string& point) {
  const int hits = CountHits(options, script, point, consumer::testing::TestDir(name + "-count"));
  ASSERT_GT(hits, 0) << point << " never reached";
  for (int k = 1; k <= hits; ++k) {
    SCOPED_TRACE(absl::StrCat(point, " hit ", k, " of ", hits));
    Harness h(consumer::testing::TestDir(absl::StrCat(name, "-", k)), options);
    h.Open();
    h.Load(script);
    FaultPoints::ArmNth(point, k);
    PageAttempt::Result r = h.RunUntilIdle();
    ASSERT_EQ(r.kind, Kind::kCrashed) << r.detail;
    h.Crash();  // abandon in-flight state, reopen from disk
    EXPECT_EQ(CheckInvariants(h, script), "") << "right after the crash";
    const std::map<std::string, int> durable = DurableAttempts(h);
    r = h.RunUntilIdle();
    ASSERT_EQ(r.kind, Kind::kNothingNew) << r.detail;
    EXPECT_EQ(CheckComplete(h, script), "");
    if (options.external_sink) {
      ExpectSinkExactlyOnce(h);
      ExpectNoneResent(h, durable);
    }
  }
}

HarnessOptions Local() { return HarnessOptions{}; }

HarnessOptions External(int batch = 1) {
  HarnessOptions o;
  o.external_sink = true;
  o.sink_batch = batch;
  return o;
}

TEST(CrashInjection, CrashBeforeEachEventCommit) {
  CrashAtEveryHit("before-event-local", Local(), LinearScript(100, 3),
                  "ingest.before_event_commit");
  CrashAtEveryHit("before-event-ext", External(), LinearScript(100, 3),
                  "ingest.before_event_commit");
}

TEST(CrashInjection, CrashAfterEachEventCommit) {
  CrashAtEveryHit("after-event-local", Local(), LinearScript(100, 3),
                  "ingest.after_event_commit");
  CrashAtEveryHit("after-event-ext", External(2), LinearScript(100, 3),
                  "ingest.after_event_commit");
}

TEST(CrashInjection, CrashAfterSinkAnsweredBeforeReceipt) {
  // "Recording success before a non-idempotent external effect is durably known" is
  // impossible: the receipt is written only after the answer; a crash in between
  // replays the delivery with the same idempotency key and the sink dedupes it.
  CrashAtEveryHit("after-deliver", External(), LinearScript(100, 2), "ingest.after_deliver");

  // The sink's first answer is a failure, and the process dies right after it: had the
  // receipt been written before the sink's answer was known, the event would be
  // recorded as done and never applied. It is delivered again and applied once.
  const Script script = LinearScript(100, 2);
  Harness h(consumer::testing::TestDir("after-failed-deliver"), External());
  h.Open();
  h.Load(script);
  auto fail_first = [](const std::string&, int attempt) {
    SinkAnswer a;
    a.kind = attempt == 1 ? SinkAnswer::Kind::kTransportError : SinkAnswer::Kind::kApplied;
    return a;
  };
  h.sink().SetScript(fail_first);
  FaultPoints::ArmNth("ingest.after_deliver", 1);
  ASSERT_EQ(h.RunUntilIdle().kind, Kind::kCrashed);
  h.Crash();
  h.sink().SetScript(fail_first);
  EXPECT_EQ(CheckInvariants(h, script), "");
  EXPECT_TRUE(h.Rows().empty()) << "no outcome is durable: the only answer was a failure";
  ASSERT_EQ(h.RunUntilIdle().kind, Kind::kNothingNew);
  EXPECT_EQ(CheckComplete(h, script), "");
  ExpectSinkExactlyOnce(h);
}

HarnessOptions QuarantineOdd() {
  HarnessOptions o = External(3);
  o.on_rejection = handoff::v1::REJECTION_POLICY_QUARANTINE;
  return o;
}

void RejectLogIndexOne(Harness& h) {
  h.sink().SetScript([](const std::string& key, int) {
    SinkAnswer a;
    a.kind = key.substr(key.size() - 2) == "/1" ? SinkAnswer::Kind::kRejected
                                               : SinkAnswer::Kind::kApplied;
    a.message = "bad event";
    return a;
  });
}

void CrashAtQuarantinePoint(const std::string& point) {
  const Script script = LinearScript(100, 3);
  Harness counter(consumer::testing::TestDir("q-count-" + point), QuarantineOdd());
  counter.Open();
  counter.Load(script);
  RejectLogIndexOne(counter);
  FaultPoints::CountHits(true);
  ASSERT_EQ(counter.RunUntilIdle().kind, Kind::kNothingNew);
  const int hits = FaultPoints::Hits(point);
  FaultPoints::DisarmAll();
  ASSERT_EQ(hits, 3);
  for (int k = 1; k <= hits; ++k) {
    Harness h(consumer::testing::TestDir(absl::StrCat("q-", point, "-", k)), QuarantineOdd());
    h.Open();
    h.Load(script);
    RejectLogIndexOne(h);
    FaultPoints::ArmNth(point, k);
    ASSERT_EQ(h.RunUntilIdle().kind, Kind::kCrashed);
    h.Crash();
    RejectLogIndexOne(h);
    EXPECT_EQ(CheckInvariants(h, script), "");
    const std::map<std::string, int> durable = DurableAttempts(h);
    ASSERT_EQ(h.RunUntilIdle().kind, Kind::kNothingNew);
    EXPECT_EQ(CheckComplete(h, script), "");
    ExpectNoneResent(h, durable);
    // Records are keyed by position: a second quarantine of one event would overwrite
    // its record, but count twice.
    EXPECT_EQ(h.Checkpoint().counters().quarantined(), 3u);
    // Each rejected event has exactly one durable quarantine record.
    handoff::v1::ListQuarantineRequest req;
    req.set_source_id(h.id());
    absl::StatusOr<handoff::v1::ListQuarantineResponse> q = h.manager()->ListQuarantine(req);
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(q->records_size(), 3);
    for (const auto& rec : q->records()) {
      EXPECT_EQ(rec.disposition(), handoff::v1::DISPOSITION_QUARANTINED);
      EXPECT_EQ(rec.actor(), "policy");
    }
  }
}

TEST(CrashInjection, CrashBeforeDurableQuarantineReceipt) {
  CrashAtQuarantinePoint("ingest.before_quarantine_commit");
}

TEST(CrashInjection, CrashAfterDurableQuarantineReceipt) {
  CrashAtQuarantinePoint("ingest.after_quarantine_commit");
}

TEST(CrashInjection, CrashBeforePageBarrier) {
  CrashAtEveryHit("before-barrier", Local(), LinearScript(100, 3), "ingest.before_barrier");
  HarnessOptions fused = Local();
  fused.fuse_barrier = true;
  fused.events_per_step = 1000;
  CrashAtEveryHit("before-fused-barrier", fused, LinearScript(100, 3), "ingest.before_barrier");
}

TEST(CrashInjection, CrashAfterPageBarrier) {
  CrashAtEveryHit("after-barrier", Local(), LinearScript(100, 3), "ingest.after_barrier");
  CrashAtEveryHit("after-barrier-ext", External(2), LinearScript(100, 3),
                  "ingest.after_barrier");
}

TEST(CrashInjection, PersistingTheTokenRightAfterFetchIsImpossible) {
  // Crash once the second page is fetched and validated, before anything of it commits:
  // the resume cursor is still the request's (an engine that persisted the fetched
  // page's `next` on arrival would show c2). The worker's own crash right after a fetch
  // is ManagerTest.AWorkerKilledRightAfterAFetchResumesAtTheRequestCursor.
  const Script script = LinearScript(100, 2);
  Harness h(consumer::testing::TestDir("after-fetch"), Local());
  h.Open();
  h.Load(script);
  FaultPoints::ArmNth("ingest.before_event_commit", 4);  // three events a page, one a step
  ASSERT_EQ(h.RunUntilIdle().kind, Kind::kCrashed);
  h.Crash();
  EXPECT_EQ(h.Checkpoint().resume_cursor(), "c1");
  ASSERT_EQ(h.RunUntilIdle().kind, Kind::kNothingNew);
  EXPECT_EQ(CheckComplete(h, script), "");
}

TEST(CrashInjection, OverlappingPages) {
  const Script script = LinearScript(100, 4, /*overlap=*/true);
  CrashAtEveryHit("overlap-before", Local(), script, "ingest.before_event_commit");
  CrashAtEveryHit("overlap-after", External(), script, "ingest.after_event_commit");
  Harness h(consumer::testing::TestDir("overlap-counters"), Local());
  h.Open();
  h.Load(script);
  ASSERT_EQ(h.RunUntilIdle().kind, Kind::kNothingNew);
  // Three overlapping items were recognised as replays by their receipts.
  EXPECT_EQ(h.Checkpoint().counters().replayed(), 3u);
  EXPECT_EQ(h.Checkpoint().counters().applied(), 12u);
}

}  // namespace
}  // namespace handoff::tests
