// Issue 6: downstream deliveries through the real gRPC EventSink client to the sample
// sink (a durable, deduping EventSink on loopback), run by the real SourceManager and
// its worker threads: FINALIZED gating across reorgs, crashes at every delivery step,
// the documented hold or quarantine for each refusal, and a slow sink that backs off
// without spinning or blocking other sources.
#include <atomic>
#include <functional>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "consumer/fault_points.h"
#include "consumer/sinks/grpc_event_sink.h"
#include "consumer/source_manager.h"
#include "consumer/source_manager_impl.h"
#include "consumer/testing/fakes.h"
#include "gtest/gtest.h"
#include "sim/sample_sink/sample_sink.h"
#include "store/store.h"

namespace handoff::tests {
namespace {

using consumer::FaultPoints;
using consumer::testing::FakeProvider;
using consumer::testing::MakePage;
using consumer::testing::MakeRow;

// The "process": a store and a SourceManager whose workers really run. The provider
// and the sample sink live outside it and survive Restart().
class Rig {
 public:
  // `max_events_per_step` 0: the default. `before_background_sync`: the store's hook
  // (StoreOptions), may be empty.
  explicit Rig(std::string dir, int max_events_per_step = 0,
               std::function<void()> before_background_sync = nullptr)
      : dir_(std::move(dir)),
        max_events_per_step_(max_events_per_step),
        before_background_sync_(std::move(before_background_sync)) {
    sim::SampleSink::Options so;
    so.core.db_path = dir_ + "-sink";
    absl::StatusOr<std::unique_ptr<sim::SampleSink>> sink = sim::SampleSink::Start(so);
    EXPECT_TRUE(sink.ok()) << sink.status();
    sink_ = *std::move(sink);
    Open();
  }
  ~Rig() {
    manager_.reset();
    store_.reset();
    FaultPoints::DisarmAll();
  }

  void Open() {
    store::StoreOptions so;
    so.path = dir_;
    so.before_background_sync = before_background_sync_;
    absl::StatusOr<std::unique_ptr<store::Store>> s = store::Store::Open(so);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
    consumer::SourceManagerOptions mo;
    mo.store = store_.get();
    // At the test's own priority: niced workers can starve for minutes under the
    // suite's load (source_manager_test).
    mo.worker.thread_nice = 0;
    mo.worker.fetch_backoff.initial = absl::Milliseconds(5);
    mo.worker.fetch_backoff.max = absl::Milliseconds(20);
    mo.worker.idle_backoff = mo.worker.fetch_backoff;
    mo.worker.delivery_idle_recheck = absl::Milliseconds(50);
    // Runs of 3 outbox entries: every chain takes several delivery attempts, so the
    // lookahead (the next run's first call sent during this run's commit) is exercised,
    // including by the crash at every delivery step.
    mo.worker.delivery_run = 3;
    if (max_events_per_step_ > 0) mo.max_events_per_step = max_events_per_step_;
    mo.factories.provider = [this](const handoff::v1::SourceSpec& spec)
        -> absl::StatusOr<std::unique_ptr<consumer::Provider>> {
      return std::unique_ptr<consumer::Provider>(new consumer::testing::ForwardingProvider(&providers_[spec.id()]));
    };
    mo.factories.external_sink = [](const handoff::v1::SourceSpec& spec) {
      return consumer::MakeExternalSink(spec);
    };
    absl::StatusOr<std::unique_ptr<consumer::SourceManager>> m =
        consumer::SourceManager::Create(std::move(mo));
    ASSERT_TRUE(m.ok());
    manager_ = *std::move(m);
    ASSERT_TRUE(manager_->Recover().ok());
  }

  // A crash: workers abandoned where they stand (a fault point already stopped the one
  // that matters), the database closed and reopened from disk, sources recovered.
  void Restart() {
    Close();
    Open();
  }
  // The first half of Restart(): the process gone, its fault points disarmed.
  void Close() {
    FaultPoints::DisarmAll();
    manager_.reset();
    store_.reset();
  }

  handoff::v1::SourceSpec Spec(const std::string& id, handoff::v1::DeliveryGate gate,
                               bool batch = true) {
    handoff::v1::SourceSpec spec;
    spec.set_id(id);
    spec.set_provider_url("http://provider.invalid");
    spec.set_chain("testnet");
    spec.set_source("logs");
    spec.set_filter("all");
    spec.set_transport(handoff::v1::TRANSPORT_POLL);
    spec.mutable_start()->set_block(100);
    spec.mutable_sink()->mutable_downstream()->set_target(sink_->target());
    spec.mutable_sink()->mutable_downstream()->set_batch(batch);
    spec.mutable_sink()->mutable_downstream()->set_deadline_ms(2000);
    spec.mutable_sink()->set_gate(gate);
    spec.mutable_failure_policy()->set_initial_backoff_ms(5);
    spec.mutable_failure_policy()->set_max_backoff_ms(20);
    spec.mutable_failure_policy()->set_max_attempts(3);
    return spec;
  }

  void Create(const handoff::v1::SourceSpec& spec) {
    handoff::v1::CreateSourceRequest req;
    *req.mutable_spec() = spec;
    req.set_start(true);
    absl::StatusOr<handoff::v1::Source> s = manager_->CreateSource(req);
    ASSERT_TRUE(s.ok()) << s.status();
  }

  // Waits (on progress changes, no polling sleeps) until `done` holds.
  bool WaitFor(const std::string& id, const std::function<bool(const handoff::v1::Progress&)>& done,
               absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time deadline = absl::Now() + timeout;
    uint64_t generation = 0;
    while (absl::Now() < deadline) {
      absl::StatusOr<handoff::v1::Progress> p =
          manager_->WaitProgress(id, &generation, std::min(deadline, absl::Now() + absl::Milliseconds(100)));
      if (p.ok() && done(*p)) return true;
    }
    return false;
  }

  std::map<std::string, sim::SinkRecord> Records() {
    absl::StatusOr<std::map<std::string, sim::SinkRecord>> r = sink_->Records();
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : std::map<std::string, sim::SinkRecord>{};
  }

  consumer::SourceManager* manager() { return manager_.get(); }
  consumer::SourceManagerImpl* impl() {
    return static_cast<consumer::SourceManagerImpl*>(manager_.get());
  }
  sim::SampleSink* sink() { return sink_.get(); }
  FakeProvider& provider(const std::string& id) { return providers_[id]; }
  // The block hash of the delivery receipt at `pos` (empty when there is none).
  std::string DeliveredHash(const std::string& id, Position pos) {
    absl::StatusOr<std::optional<std::string>> v = store_->GetStaged(
        store::StagedFamily::kReceipts, id, store::Stage::kDelivery, pos);
    EXPECT_TRUE(v.ok()) << v.status();
    store::ReceiptRecord receipt;
    if (!v.ok() || !v->has_value() || !receipt.ParseFromString(**v)) return "";
    return receipt.block_hash();
  }
  // The cursor of the stored ingest checkpoint (which may be ahead of the published one).
  std::string StoredCursor(const std::string& id) {
    absl::StatusOr<store::CheckpointRecord> cp =
        store_->LoadCheckpoint(id, store::Stage::kIngest);
    EXPECT_TRUE(cp.ok()) << cp.status();
    return cp.ok() ? cp->resume_cursor() : "";
  }
  // The positions that have a delivery-stage receipt (the engine's own record of a
  // delivered event), in order.
  std::vector<Position> DeliveryReceipts(const std::string& id) {
    std::vector<Position> out;
    absl::Status st = store_->ScanStaged(
        store::StagedFamily::kReceipts, id, store::Stage::kDelivery, Position{0, 0},
        Position{std::numeric_limits<uint64_t>::max(), std::numeric_limits<uint64_t>::max()}, [&](Position pos, absl::string_view) {
          out.push_back(pos);
          return true;
        });
    EXPECT_TRUE(st.ok()) << st;
    return out;
  }
  // The positions of the source's outbox entries (awaiting delivery), in order.
  std::vector<Position> OutboxEntries(const std::string& id) {
    std::vector<Position> out;
    absl::Status st = store_->ScanOutbox(
        id, Position{0, 0},
        Position{std::numeric_limits<uint64_t>::max(), std::numeric_limits<uint64_t>::max()},
        [&](Position pos, absl::string_view) {
          out.push_back(pos);
          return true;
        });
    EXPECT_TRUE(st.ok()) << st;
    return out;
  }

 private:
  const std::string dir_;
  const int max_events_per_step_;
  const std::function<void()> before_background_sync_;
  std::map<std::string, FakeProvider> providers_;
  std::unique_ptr<sim::SampleSink> sink_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<consumer::SourceManager> manager_;
};

consumer::Page WithMarks(consumer::Page p, uint64_t finalized, uint64_t safe) {
  p.finalized = consumer::BlockMarkValue{finalized, absl::StrFormat("0x%064x", finalized)};
  p.safe = consumer::BlockMarkValue{safe, absl::StrFormat("0x%064x", safe)};
  return p;
}

// Events 0 and 1 of every block in [from, to] of `fork`.
std::vector<handoff::v1::EventRow> TwoEventsPerBlock(uint64_t from, uint64_t to,
                                                     const std::string& fork) {
  std::vector<handoff::v1::EventRow> rows;
  for (uint64_t b = from; b <= to; ++b) {
    rows.push_back(MakeRow(b, 0, fork));
    rows.push_back(MakeRow(b, 1, fork));
  }
  return rows;
}

// A chain 100..111 (two events a block); block 106..109 are reorged to fork "b" before
// they finalize. Finality then advances to 111.
//
// With `finalized_at_once`, the first three pages finalize nothing (99) and only the last
// one finalizes, so the FINALIZED delivery stage finds all 24 final events at once
// whenever it first runs: its runs are then the same in every run of a test, instead of
// depending on how far ingest got before delivery started.
void LoadReorgingChain(FakeProvider& p, bool finalized_at_once = false) {
  auto finalized = [&](uint64_t block) -> uint64_t { return finalized_at_once ? 99 : block; };
  p.SetPage("100", WithMarks(MakePage(100, 103, TwoEventsPerBlock(100, 103, "a"), "c1"),
                             finalized(101), 102));
  p.SetPage("c1", WithMarks(MakePage(104, 109, TwoEventsPerBlock(104, 109, "a"), "c2"),
                            finalized(103), 105));
  p.SetPage("c2",
            WithMarks(MakePage(106, 109, TwoEventsPerBlock(106, 109, "b"), "c3", /*reorg=*/true),
                      finalized(105), 107));
  p.SetPage("c3", WithMarks(MakePage(110, 111, TwoEventsPerBlock(110, 111, "b"), "c4"), 111, 111));
}

std::string KeyOf(const std::string& id, uint64_t block, uint64_t index, const std::string& fork) {
  return absl::StrCat(id, "/", MakeRow(block, index, fork).block_hash(), "/", index);
}

void ExpectFinalChainDeliveredOnce(Rig& rig, const std::string& id) {
  std::map<std::string, sim::SinkRecord> records = rig.Records();
  int mine = 0;
  for (const auto& [key, rec] : records) {
    if (key.rfind(id + "/", 0) != 0) continue;
    ++mine;
    EXPECT_EQ(rec.request.finality(), handoff::v1::FINALITY_FINALIZED) << key;
  }
  for (uint64_t b = 100; b <= 111; ++b) {
    const std::string fork = b >= 106 ? "b" : "a";
    for (uint64_t i = 0; i < 2; ++i) {
      EXPECT_EQ(records.count(KeyOf(id, b, i, fork)), 1u) << b << ":" << i;
    }
    if (b >= 106 && b <= 109) {
      for (uint64_t i = 0; i < 2; ++i) {
        EXPECT_EQ(records.count(KeyOf(id, b, i, "a")), 0u) << "reorged " << b << ":" << i;
      }
    }
  }
  EXPECT_EQ(mine, 24);
}

// Operator "alice" decides on `hold`, fenced by the hold's version.
absl::Status Resolve(Rig& rig, const std::string& id, const handoff::v1::Hold& hold,
                     handoff::v1::HoldDecision decision, const std::string& reason) {
  handoff::v1::ResolveHoldRequest r;
  r.set_source_id(id);
  r.set_stage(hold.stage());
  r.set_block_number(hold.event().block_number());
  r.set_log_index(hold.event().log_index());
  r.set_decision(decision);
  r.set_reason(reason);
  r.set_hold_version(hold.version());
  return rig.manager()->ResolveHold(r, "alice").status();
}

bool DeliveredThrough(const handoff::v1::Progress& p, uint64_t block, uint64_t index) {
  const handoff::v1::Checkpoint& d = p.delivery_checkpoint();
  return d.has_applied() && (d.applied_block() > block ||
                             (d.applied_block() == block && d.applied_log_index() >= index));
}

// Waits until `id` has exactly one open hold, and returns it.
std::optional<handoff::v1::Hold> TheOnlyHold(Rig& rig, const std::string& id) {
  handoff::v1::ListHoldsRequest lh;
  lh.set_source_id(id);
  std::optional<handoff::v1::Hold> hold;
  rig.WaitFor(id, [&](const handoff::v1::Progress&) {
    absl::StatusOr<handoff::v1::ListHoldsResponse> h = rig.manager()->ListHolds(lh);
    if (h.ok() && h->holds_size() == 1) hold = h->holds(0);
    return hold.has_value();
  });
  return hold;
}

// The sink fixed, `hold` released for a retry: delivery reaches the end of the chain of
// LoadReorgingChain, each of its final events delivered once.
void RetryAndDeliverTheChain(Rig& rig, const std::string& id, const handoff::v1::Hold& hold) {
  rig.sink()->SetFaults(handoff::sim::v1::FaultConfig());
  ASSERT_TRUE(Resolve(rig, id, hold, handoff::v1::HOLD_DECISION_RETRY, "sink fixed").ok());
  ASSERT_TRUE(rig.WaitFor(id, [](const handoff::v1::Progress& p) {
    return DeliveredThrough(p, 111, 1);
  })) << "delivery never reached 111:1";
  ExpectFinalChainDeliveredOnce(rig, id);
}

// The delivery stage's crash points, in the order one run passes them.
constexpr const char* kDeliveryCrashPoints[] = {
    "delivery.after_deliver", "delivery.before_event_commit", "delivery.after_event_commit",
    "delivery.before_barrier", "delivery.after_barrier"};

// Arms `point` to abandon the worker at its `nth` hit; the flag says it fired.
std::shared_ptr<std::atomic<bool>> CrashAtNthHit(const char* point, int nth) {
  auto fired = std::make_shared<std::atomic<bool>>(false);
  auto count = std::make_shared<std::atomic<int>>(0);
  FaultPoints::Arm(point, [fired, count, nth] {
    if (count->fetch_add(1) + 1 != nth) return false;
    fired->store(true);
    return true;
  });
  return fired;
}

// Arms "delivery.after_deliver" so that the first delivery call, once answered, is held
// before its answers are recorded: `sent` is notified, and the call waits for `release`.
void HoldTheFirstDeliveryCall(absl::Notification* sent, absl::Notification* release) {
  auto hits = std::make_shared<std::atomic<int>>(0);
  FaultPoints::Arm("delivery.after_deliver", [sent, release, hits] {
    if (hits->fetch_add(1) == 0) {
      sent->Notify();
      release->WaitForNotificationWithTimeout(absl::Seconds(60));
    }
    return false;
  });
}

// Blocks [from, to] of two events each, fork "a" below `fork_block` and "b" from it:
// each event reached the sink once, and the engine recorded the one it delivered.
void ExpectEachDeliveredOnce(Rig& rig, const std::string& id, uint64_t from, uint64_t to,
                             uint64_t fork_block) {
  std::map<std::string, sim::SinkRecord> records = rig.Records();
  for (uint64_t b = from; b <= to; ++b) {
    for (uint64_t i = 0; i < 2; ++i) {
      const std::string fork = b >= fork_block ? "b" : "a";
      EXPECT_EQ(records.count(KeyOf(id, b, i, fork)), 1u) << b << ":" << i;
      EXPECT_EQ(rig.DeliveredHash(id, Position{b, i}), MakeRow(b, i, fork).block_hash())
          << b << ":" << i;
    }
  }
}

TEST(Effects, FinalizedGateNeverDeliversReorgedEvents) {
  FaultPoints::CountHits(true);
  Rig rig(consumer::testing::TestDir("finalized"));
  LoadReorgingChain(rig.provider("fin"));
  rig.Create(rig.Spec("fin", handoff::v1::DELIVERY_GATE_FINALIZED));
  ASSERT_TRUE(rig.WaitFor("fin", [](const handoff::v1::Progress& p) {
    return DeliveredThrough(p, 111, 1);
  })) << "delivery never reached 111:1";
  ExpectFinalChainDeliveredOnce(rig, "fin");
  absl::StatusOr<handoff::v1::Progress> p = rig.manager()->GetProgress("fin");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->highest_finalized().number(), 111u);
  EXPECT_EQ(p->counters().corrections(), 1u);
  // The lookahead ran: later runs' first calls were answered during the previous run's
  // commit, and still every key was delivered once (above).
  EXPECT_GT(FaultPoints::Hits("delivery.early_answers_used"), 0);
  // And each later run's rows were read while the run before it was delivered.
  EXPECT_GT(FaultPoints::Hits("delivery.read_ahead_used"), 0);
  FaultPoints::CountHits(false);
}

// A correction that replaces a finalized event the sink has already applied breaks the
// provider contract ("finalized blocks never reorg"): the source halts and says so, and
// the replaced event stays recorded as delivered.
TEST(Effects, ACorrectionReplacingADeliveredFinalizedEventHalts) {
  Rig rig(consumer::testing::TestDir("finalized-replaced"));
  FakeProvider& provider = rig.provider("fr");
  provider.SetPage("100", WithMarks(MakePage(100, 103, TwoEventsPerBlock(100, 103, "a"), "c1"),
                                    103, 103));
  rig.Create(rig.Spec("fr", handoff::v1::DELIVERY_GATE_FINALIZED));
  ASSERT_TRUE(rig.WaitFor("fr", [](const handoff::v1::Progress& p) {
    return DeliveredThrough(p, 103, 1);
  })) << "delivery never reached 103:1";
  provider.SetPage("c1", WithMarks(MakePage(102, 103, TwoEventsPerBlock(102, 103, "b"), "c2",
                                            /*reorg=*/true),
                                   103, 103));
  ASSERT_TRUE(rig.WaitFor("fr", [](const handoff::v1::Progress& p) {
    return p.state() == handoff::v1::SOURCE_STATE_PROTOCOL_VIOLATION;
  })) << "the correction of delivered finalized events was applied";
  absl::StatusOr<handoff::v1::Progress> p = rig.manager()->GetProgress("fr");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(absl::StrContains(p->reason(), "replaces event 102:0")) << p->reason();
  EXPECT_EQ(p->checkpoint().resume_cursor(), "c1");
  EXPECT_EQ(rig.DeliveredHash("fr", Position{102, 0}), MakeRow(102, 0, "a").block_hash());
  EXPECT_EQ(rig.Records().count(KeyOf("fr", 102, 0, "b")), 0u);
}

// The same correction while the sink call that carries the replaced event is in flight
// (sent, its answer not yet recorded): the sink may have applied it, so the source halts
// as it does for a recorded delivery. The correction checks the sent events and commits
// under one lock, under which a delivery registers what it sends only while no
// correction has fenced its read. Before: only recorded deliveries were checked, the
// correction committed, and the sink was then sent the other fork's event at the same
// position, as FINALIZED too.
TEST(Effects, ACorrectionReplacingAFinalizedEventInFlightToTheSinkHalts) {
  Rig rig(consumer::testing::TestDir("finalized-in-flight"));
  FakeProvider& provider = rig.provider("ff");
  provider.SetPage("100", WithMarks(MakePage(100, 103, TwoEventsPerBlock(100, 103, "a"), "c1"),
                                    103, 103));
  // The first delivery call (the run 100:0-101:0) is answered, then held before its
  // answers are recorded.
  absl::Notification sent, release;
  HoldTheFirstDeliveryCall(&sent, &release);
  rig.Create(rig.Spec("ff", handoff::v1::DELIVERY_GATE_FINALIZED));
  ASSERT_TRUE(sent.WaitForNotificationWithTimeout(absl::Seconds(20)));
  provider.SetPage("c1", WithMarks(MakePage(100, 103, TwoEventsPerBlock(100, 103, "b"), "c2",
                                            /*reorg=*/true),
                                   103, 103));
  const bool settled = rig.WaitFor("ff", [](const handoff::v1::Progress& p) {
    return p.state() == handoff::v1::SOURCE_STATE_PROTOCOL_VIOLATION ||
           p.checkpoint().resume_cursor() == "c2";
  });
  release.Notify();
  ASSERT_TRUE(settled) << "the correction was neither refused nor applied";
  absl::StatusOr<handoff::v1::Progress> p = rig.manager()->GetProgress("ff");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->state(), handoff::v1::SOURCE_STATE_PROTOCOL_VIOLATION)
      << "the correction replaced events in flight to the sink: " << p->ShortDebugString();
  EXPECT_TRUE(absl::StrContains(p->reason(), "replaces event 100:0")) << p->reason();
  EXPECT_EQ(p->checkpoint().resume_cursor(), "c1");
  EXPECT_EQ(rig.Records().count(KeyOf("ff", 100, 0, "b")), 0u);
}

// A source started from "latest" whose first page waits on a hold: "latest" names a
// newer page by the time the page is asked for again (the operator's decision moves the
// checkpoint, and the attempt rereads it). The first page is pinned to its own start
// block before anything of it is applied, so the retry asks for that page, and its held
// event is delivered. Before: the retry asked for "latest", got the newer page, and the
// held event (and its hold) were left behind for good.
TEST(Effects, AFirstPageFromLatestIsAskedForAgainByItsStartBlock) {
  Rig rig(consumer::testing::TestDir("latest-pinned"));
  FakeProvider& provider = rig.provider("lt");
  const consumer::Page first =
      WithMarks(MakePage(1000, 1009, {MakeRow(1000, 0), MakeRow(1000, 1)}, "c1"), 1009, 1009);
  provider.SetPage("latest", consumer::CopyOfPage(first));
  provider.SetPage("1000", consumer::CopyOfPage(first));
  handoff::sim::v1::FaultConfig faults;
  faults.mutable_reject()->add_idempotency_keys(KeyOf("lt", 1000, 1, "a"));
  rig.sink()->SetFaults(faults);
  handoff::v1::SourceSpec spec = rig.Spec("lt", handoff::v1::DELIVERY_GATE_IMMEDIATE,
                                          /*batch=*/false);
  spec.mutable_start()->set_latest(true);
  spec.mutable_failure_policy()->set_on_rejection(handoff::v1::REJECTION_POLICY_HOLD);
  rig.Create(spec);
  const std::optional<handoff::v1::Hold> hold = TheOnlyHold(rig, "lt");
  ASSERT_TRUE(hold.has_value());
  EXPECT_EQ(hold->event().block_number(), 1000u);
  EXPECT_EQ(hold->event().log_index(), 1u);
  // The head moves on.
  provider.SetPage("latest",
                   WithMarks(MakePage(1015, 1020, {MakeRow(1015, 0)}, "c9"), 1020, 1020));
  rig.sink()->SetFaults(handoff::sim::v1::FaultConfig());
  ASSERT_TRUE(Resolve(rig, "lt", *hold, handoff::v1::HOLD_DECISION_RETRY, "sink fixed").ok());
  ASSERT_TRUE(rig.WaitFor("lt", [](const handoff::v1::Progress& p) {
    return p.checkpoint().resume_cursor() != "latest" &&
           p.checkpoint().resume_cursor() != "1000";
  })) << "the first page never passed its barrier";
  absl::StatusOr<handoff::v1::Progress> p = rig.manager()->GetProgress("lt");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->checkpoint().resume_cursor(), "c1");
  std::map<std::string, sim::SinkRecord> records = rig.Records();
  EXPECT_EQ(records.count(KeyOf("lt", 1000, 0, "a")), 1u);
  EXPECT_EQ(records.count(KeyOf("lt", 1000, 1, "a")), 1u) << "the held event was left behind";
  EXPECT_EQ(records.count(KeyOf("lt", 1015, 0, "a")), 0u);
  handoff::v1::ListHoldsRequest lh;
  lh.set_source_id("lt");
  absl::StatusOr<handoff::v1::ListHoldsResponse> holds = rig.manager()->ListHolds(lh);
  ASSERT_TRUE(holds.ok()) << holds.status();
  EXPECT_EQ(holds->holds_size(), 0) << holds->ShortDebugString();
}

// "Keep the highest finalized mark across lower or null marks and process restarts when
// gating outbox effects": pages finalizing 101, then none (null), then only 99, with a
// restart between them. Every event up to 101 is delivered and nothing above it: a mark
// taken from the last page (or lost in the restart) would deliver nothing.
TEST(Effects, TheFinalizedGateKeepsTheHighestMarkAcrossLowerNullAndRestarts) {
  Rig rig(consumer::testing::TestDir("highest-mark"));
  FakeProvider& p = rig.provider("hm");
  // The sink fails every call at first (UNAVAILABLE: no attempt used), so nothing is
  // delivered before the restart.
  sim::v1::FaultConfig down;
  down.set_fail_next_calls(1000000);
  down.set_fail_mode(sim::v1::FAIL_MODE_UNAVAILABLE);
  rig.sink()->SetFaults(down);
  p.SetPage("100", WithMarks(MakePage(100, 103, TwoEventsPerBlock(100, 103, "a"), "c1"), 101, 102));
  p.SetPage("c1", MakePage(104, 105, TwoEventsPerBlock(104, 105, "a"), "c2"));  // null marks
  rig.Create(rig.Spec("hm", handoff::v1::DELIVERY_GATE_FINALIZED));
  ASSERT_TRUE(rig.WaitFor("hm", [](const handoff::v1::Progress& pr) {
    return pr.checkpoint().resume_cursor() == "c2";
  }));
  rig.Restart();
  EXPECT_TRUE(rig.DeliveryReceipts("hm").empty());
  p.SetPage("c2", WithMarks(MakePage(106, 107, TwoEventsPerBlock(106, 107, "a"), "c3"), 99, 99));
  rig.sink()->SetFaults(sim::v1::FaultConfig());
  ASSERT_TRUE(rig.WaitFor("hm", [](const handoff::v1::Progress& pr) {
    return pr.checkpoint().resume_cursor() == "c3" && DeliveredThrough(pr, 101, 1);
  })) << "the events up to the highest mark (101) were not all delivered";
  absl::StatusOr<handoff::v1::Progress> pr = rig.manager()->GetProgress("hm");
  ASSERT_TRUE(pr.ok());
  EXPECT_EQ(pr->highest_finalized().number(), 101u);
  const std::vector<Position> delivered = rig.DeliveryReceipts("hm");
  ASSERT_EQ(delivered.size(), 4u);
  EXPECT_EQ(delivered.back(), (Position{101, 1}));
  for (const auto& [key, rec] : rig.Records()) {
    EXPECT_LE(rec.request.event().block_number(), 101u) << key;
  }
}

// A hold in the middle of a run, resolved by an operator while the next run's rows are
// read ahead: every key is delivered once and has its receipt. (When the resolution
// wins the race with the attempt's commit, the next attempt starts inside the run and
// must drop the rows read ahead; that interleaving is timing-dependent here.)
TEST(Effects, AHoldResolvedMidRunStillDeliversAndRecordsEveryEvent) {
  Rig rig(consumer::testing::TestDir("read-ahead-dropped"));
  LoadReorgingChain(rig.provider("fin"));
  handoff::sim::v1::FaultConfig faults;
  faults.mutable_reject()->add_blocks(105);  // the middle of the 4th run of 3
  rig.sink()->SetFaults(faults);
  // Single calls: the first refused event ends the run's group, so it alone is held.
  handoff::v1::SourceSpec spec =
      rig.Spec("fin", handoff::v1::DELIVERY_GATE_FINALIZED, /*batch=*/false);
  spec.mutable_failure_policy()->set_on_rejection(handoff::v1::REJECTION_POLICY_HOLD);
  rig.Create(spec);
  const std::optional<handoff::v1::Hold> hold = TheOnlyHold(rig, "fin");
  ASSERT_TRUE(hold.has_value());
  EXPECT_EQ(hold->event().block_number(), 105u);
  // Released for a retry: the sink takes it now.
  RetryAndDeliverTheChain(rig, "fin", *hold);
  // And the engine recorded each of them: rows read ahead for a later run, taken by a
  // run that starts earlier, would deliver that run's events without their receipts.
  const std::vector<Position> receipts = rig.DeliveryReceipts("fin");
  ASSERT_EQ(receipts.size(), 24u);
  for (size_t i = 0; i < receipts.size(); ++i) {
    EXPECT_EQ(receipts[i], (Position{100 + i / 2, i % 2})) << i;
  }
}

// A delivered run leaves the outbox as one range deletion per stretch of consecutive
// delivered entries (PageAttempt::StageOutboxRemovals): an entry held in the middle of a
// batch stays, its neighbours on both sides go, and once it is delivered nothing is left.
TEST(Effects, AHoldInTheMiddleOfABatchKeepsOnlyItsOutboxEntry) {
  Rig rig(consumer::testing::TestDir("hold-mid-batch"));
  // Finalized at once: with the chain's marks finalizing page by page, a delivery stage
  // that ran before ingest reached c3 cut its runs at the marks ([104:0, 104:1, 105:0],
  // then [105:1]), and 105:1 was not in the refused call (2 runs in 100 on two busy cores;
  // 0 in 200 since).
  LoadReorgingChain(rig.provider("mid"), /*finalized_at_once=*/true);
  handoff::sim::v1::FaultConfig faults;
  // The run of 3 entries [104:1, 105:0, 105:1] goes in one ApplyBatch call.
  faults.mutable_reject()->add_idempotency_keys(KeyOf("mid", 105, 0, "a"));
  rig.sink()->SetFaults(faults);
  handoff::v1::SourceSpec spec = rig.Spec("mid", handoff::v1::DELIVERY_GATE_FINALIZED);
  spec.mutable_failure_policy()->set_on_rejection(handoff::v1::REJECTION_POLICY_HOLD);
  rig.Create(spec);
  const std::optional<handoff::v1::Hold> hold = TheOnlyHold(rig, "mid");
  ASSERT_TRUE(hold.has_value());
  EXPECT_EQ(hold->event().block_number(), 105u);
  EXPECT_EQ(hold->event().log_index(), 0u);
  EXPECT_EQ(rig.DeliveredHash("mid", Position{105, 1}), MakeRow(105, 1, "a").block_hash());
  std::vector<Position> pending = rig.OutboxEntries("mid");
  ASSERT_FALSE(pending.empty());
  EXPECT_EQ(pending[0], (Position{105, 0}));
  for (const Position& p : pending) {
    EXPECT_FALSE(p == (Position{104, 1}) || p == (Position{105, 1})) << p.DebugString();
  }
  RetryAndDeliverTheChain(rig, "mid", *hold);
  EXPECT_EQ(rig.DeliveryReceipts("mid").size(), 24u);
  for (const Position& p : rig.OutboxEntries("mid")) {
    EXPECT_GT(p, (Position{111, 1})) << "delivered but still pending: " << p.DebugString();
  }
}

// SAFE delivers below the safe mark, which a deep reorg may still reach: the events that
// replace already delivered ones sit at positions the delivery stage has passed, and
// must still be delivered (the replaced ones were, as documented for SAFE).
TEST(Effects, SafeGateDeliversTheEventsOfAReorgBelowWhatWasDelivered) {
  Rig rig(consumer::testing::TestDir("safe-deep-reorg"));
  FakeProvider& provider = rig.provider("safe");
  provider.SetPage("100",
                   WithMarks(MakePage(100, 103, TwoEventsPerBlock(100, 103, "a"), "c1"), 100, 103));
  rig.Create(rig.Spec("safe", handoff::v1::DELIVERY_GATE_SAFE));
  ASSERT_TRUE(rig.WaitFor("safe", [](const handoff::v1::Progress& p) {
    return DeliveredThrough(p, 103, 1);
  })) << "delivery never reached 103:1";
  // Blocks 102 and 103 were delivered as safe; a reorg replaces them (and adds 104).
  provider.SetPage(
      "c1", WithMarks(MakePage(102, 104, TwoEventsPerBlock(102, 104, "b"), "c2", /*reorg=*/true),
                      101, 104));
  ASSERT_TRUE(rig.WaitFor("safe", [](const handoff::v1::Progress& p) {
    return DeliveredThrough(p, 104, 1) && p.counters().corrections() == 1;
  })) << "delivery never reached 104:1 after the correction";
  ASSERT_TRUE(rig.WaitFor("safe", [&](const handoff::v1::Progress&) {
    return rig.Records().count(KeyOf("safe", 103, 1, "b")) == 1;
  })) << "the replacing events were never delivered";
  std::map<std::string, sim::SinkRecord> records = rig.Records();
  for (uint64_t b = 100; b <= 104; ++b) {
    for (uint64_t i = 0; i < 2; ++i) {
      const std::string key = KeyOf("safe", b, i, b >= 102 ? "b" : "a");
      ASSERT_EQ(records.count(key), 1u) << key;
      EXPECT_EQ(records.at(key).request.finality(), handoff::v1::FINALITY_SAFE) << key;
    }
  }
  // The engine's own record: one delivery receipt per position, of the replacing event.
  const std::vector<Position> receipts = rig.DeliveryReceipts("safe");
  ASSERT_EQ(receipts.size(), 10u);
  for (size_t i = 0; i < receipts.size(); ++i) {
    EXPECT_EQ(receipts[i], (Position{100 + i / 2, i % 2})) << i;
    const std::string fork = receipts[i].block >= 102 ? "b" : "a";
    EXPECT_EQ(rig.DeliveredHash("safe", receipts[i]),
              MakeRow(receipts[i].block, receipts[i].log_index, fork).block_hash())
        << i;
  }
}

// A correction that only inserts (the old fork had no event in block 104, so nothing is
// orphaned) while a delivery waits to retry a run read before it (100:0, 103:0, 106:0):
// the delivery is fenced and rereads, so the new 104:0 is delivered. Before: the retried
// run committed as read, its range deletion (100:0-106:0) took 104:0's outbox entry with
// it, and 104:0 was never delivered.
TEST(Effects, AnInsertOnlyCorrectionFencesADeliveryWaitingToRetry) {
  Rig rig(consumer::testing::TestDir("insert-only-correction"));
  FakeProvider& provider = rig.provider("ins");
  provider.SetPage("100", WithMarks(MakePage(100, 106, {MakeRow(100), MakeRow(103), MakeRow(106)},
                                             "c1"),
                                    100, 106));
  // The first call is answered RETRY_LATER, to be retried 10 s later: time enough for
  // the correction below to commit meanwhile (a page, well under a second).
  handoff::sim::v1::FaultConfig faults;
  faults.set_fail_next_calls(1);
  faults.set_retry_after_ms(10000);
  rig.sink()->SetFaults(faults);
  rig.Create(rig.Spec("ins", handoff::v1::DELIVERY_GATE_SAFE));
  ASSERT_TRUE(rig.WaitFor("ins", [&](const handoff::v1::Progress& p) {
    return p.checkpoint().resume_cursor() == "c1" && rig.sink()->stats().retry_later() >= 1;
  })) << "the delivery never met its RETRY_LATER";
  provider.SetPage("c1", WithMarks(MakePage(104, 104, {MakeRow(104, 0, "b")}, "c2",
                                            /*reorg=*/true),
                                   100, 106));
  // Then the chain goes on past 106 (the correction rewound the applied position to
  // below block 104; 106:0 is replayed and applied again above it).
  provider.SetPage("c2", WithMarks(MakePage(105, 107, {MakeRow(106), MakeRow(107, 0, "b")}, "c3"),
                                   100, 107));
  ASSERT_TRUE(rig.WaitFor("ins", [](const handoff::v1::Progress& p) {
    return p.checkpoint().resume_cursor() == "c3";
  }));
  ASSERT_TRUE(rig.WaitFor("ins", [&](const handoff::v1::Progress&) {
    return rig.Records().count(KeyOf("ins", 104, 0, "b")) == 1;
  }, absl::Seconds(60))) << "the correction's new event was never delivered";
  ASSERT_TRUE(rig.WaitFor("ins", [](const handoff::v1::Progress& p) {
    return DeliveredThrough(p, 107, 0);
  }));
  std::map<std::string, sim::SinkRecord> records = rig.Records();
  for (const std::string& key : {KeyOf("ins", 100, 0, "a"), KeyOf("ins", 103, 0, "a"),
                                 KeyOf("ins", 104, 0, "b"), KeyOf("ins", 106, 0, "a"),
                                 KeyOf("ins", 107, 0, "b")}) {
    EXPECT_EQ(records.count(key), 1u) << key;
  }
  EXPECT_EQ(rig.DeliveryReceipts("ins").size(), 5u);
}

// An attempt abandoned before its barrier (a crash) left events 102:0 and 105:0 applied;
// asked again, the page carries a new event between them (103:0: the provider split or
// rewrote the blocks it had not confirmed), which the validator accepts as a replacement
// of the abandoned attempt's work. Meanwhile the delivery stage has read the run
// 102:0-105:0 and sent it. The page's step fences the delivery stage, whose commit then
// rereads instead of removing the run's range from the outbox. Before: that range
// deletion took the new 103:0 entry with it, and 103:0 was never delivered.
TEST(Effects, AnEventInsertedBehindAnAbandonedAttemptFencesTheDeliveryInFlight) {
  Rig rig(consumer::testing::TestDir("backfill-abandoned"), /*max_events_per_step=*/1);
  FakeProvider& provider = rig.provider("bf");
  // Safe through 106 from the first page on (the gate is open for what is applied).
  provider.SetPage("100", WithMarks(MakePage(100, 101, {MakeRow(100)}, "c1"), 106, 106));
  provider.SetPage("c1", WithMarks(MakePage(102, 106, {MakeRow(102), MakeRow(105), MakeRow(106)},
                                            "c2"),
                                   106, 106));
  // No delivery before the crash (the sink refuses without using an attempt).
  handoff::sim::v1::FaultConfig unavailable;
  unavailable.set_fail_next_calls(1000000);
  rig.sink()->SetFaults(unavailable);
  std::shared_ptr<std::atomic<bool>> crashed = CrashAtNthHit("ingest.before_barrier", 2);
  rig.Create(rig.Spec("bf", handoff::v1::DELIVERY_GATE_SAFE));
  ASSERT_TRUE(rig.WaitFor("bf", [&](const handoff::v1::Progress&) { return crashed->load(); }));
  ASSERT_EQ(rig.OutboxEntries("bf").size(), 3u);  // 100:0, and 102:0 and 105:0 abandoned
  rig.Close();
  // Restarted, the ingest stage gets nothing until the delivery stage has sent its run.
  consumer::Refusal unavailable_upstream;
  unavailable_upstream.kind = consumer::RefusalKind::kTransient;
  provider.SetRefusal("c1", unavailable_upstream, 1000000);
  absl::Notification sent, release;
  HoldTheFirstDeliveryCall(&sent, &release);
  rig.sink()->SetFaults(handoff::sim::v1::FaultConfig());
  rig.Open();
  ASSERT_TRUE(sent.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(rig.Records().count(KeyOf("bf", 105, 0, "a")), 1u);
  provider.SetPage("c1", WithMarks(MakePage(102, 106, {MakeRow(102), MakeRow(103), MakeRow(105),
                                                       MakeRow(106)},
                                            "c2"),
                                   106, 106));
  provider.SetRefusal("c1", unavailable_upstream, 0);
  const bool committed = rig.WaitFor("bf", [](const handoff::v1::Progress& p) {
    return p.checkpoint().resume_cursor() == "c2";
  });
  release.Notify();
  ASSERT_TRUE(committed) << "the page was never committed";
  ASSERT_TRUE(rig.WaitFor("bf", [](const handoff::v1::Progress& p) {
    return DeliveredThrough(p, 106, 0);
  })) << "delivery never reached 106:0";
  std::map<std::string, sim::SinkRecord> records = rig.Records();
  for (uint64_t b : {100, 102, 103, 105, 106}) {
    EXPECT_EQ(records.count(KeyOf("bf", b, 0, "a")), 1u) << b;
  }
  EXPECT_EQ(rig.DeliveryReceipts("bf").size(), 5u);
  EXPECT_TRUE(rig.OutboxEntries("bf").empty());
}

// A correction committed while an earlier page's fsync is in flight stays unpublished
// until that sync; the page after it, deferred too, writes outbox entries below the
// published applied position (the correction rewound it). The delivery gate reads up
// to the published position, so it would send that page's events before they are
// durable. The pages that write below the gate are noted before they commit, and the
// delivery reads strictly below them until they are published
// (consumer/unpublished_writes.h). Before: 180:0 of fork "b" reached the SAFE sink while
// its page awaited its fsync.
TEST(Effects, AGatedSinkIsNotSentAPageWrittenBelowTheGateBeforeItIsDurable) {
  // The background syncs of deferred pages can be held (from page B on).
  std::atomic<bool> hold_syncs{false};
  absl::Notification release_syncs;
  Rig rig(consumer::testing::TestDir("below-gate"), 0, [&hold_syncs, &release_syncs] {
    if (hold_syncs.load()) release_syncs.WaitForNotificationWithTimeout(absl::Seconds(25));
  });
  FakeProvider& provider = rig.provider("bg");
  provider.set_ready(true);
  provider.SetPage("100", WithMarks(MakePage(100, 200, {MakeRow(199)}, "c1"), 300, 300));
  rig.Create(rig.Spec("bg", handoff::v1::DELIVERY_GATE_SAFE));
  ASSERT_TRUE(rig.WaitFor("bg", [](const handoff::v1::Progress& p) {
    return DeliveredThrough(p, 199, 0);
  })) << "the first page was never delivered";
  hold_syncs.store(true);
  // Page B (its sync held), then a correction of 150-170 that only inserts (one that
  // replaces an event also changes operator records, and is committed and published
  // before the next page), then page D above it; served last to first, so that the
  // worker never finds nothing new (which publishes, waiting for the syncs) between them.
  provider.SetPage("c3", WithMarks(MakePage(171, 195, {MakeRow(180, 0, "b")}, "c4"), 300, 300));
  provider.SetPage("c2", WithMarks(MakePage(150, 170, {MakeRow(150, 0, "b"), MakeRow(160, 0, "b")},
                                            "c3", /*reorg=*/true),
                                   300, 300));
  provider.SetPage("c1", WithMarks(MakePage(201, 210, {MakeRow(205)}, "c2"), 300, 300));
  ASSERT_TRUE(rig.WaitFor("bg", [&](const handoff::v1::Progress&) {
    return rig.StoredCursor("bg") == "c4";
  })) << "page D was never committed";
  // While page D is unpublished, its event must not reach the sink (the published
  // cursor is read after the sink's records: a record seen with D unpublished was sent
  // before D was durable).
  // The correction's own events are synced (written synced), the gate still at page A's.
  EXPECT_FALSE(rig.WaitFor("bg", [&](const handoff::v1::Progress&) {
    return rig.Records().count(KeyOf("bg", 180, 0, "b")) == 1;
  }, absl::Seconds(2))) << "a SAFE sink was sent an event of an unsynced page";
  absl::StatusOr<handoff::v1::Progress> held = rig.manager()->GetProgress("bg");
  ASSERT_TRUE(held.ok());
  EXPECT_NE(held->checkpoint().resume_cursor(), "c4") << "page D was published unsynced";
  release_syncs.Notify();
  // Once published, it is delivered.
  ASSERT_TRUE(rig.WaitFor("bg", [](const handoff::v1::Progress& p) {
    return DeliveredThrough(p, 180, 0);
  })) << "delivery never reached 180:0";
  EXPECT_EQ(rig.Records().count(KeyOf("bg", 180, 0, "b")), 1u);
}

// Starts SAFE source `id` over blocks 100..`through` (two events each, fork "a", all
// safe), whose sink rejects the event at `rejected`: it is held for an operator
// (REJECTION_POLICY_HOLD), and delivery waits there.
void StartHoldingARejectedEvent(Rig* rig, const std::string& id, uint64_t through,
                                Position rejected) {
  rig->provider(id).SetPage(
      "100", WithMarks(MakePage(100, through, TwoEventsPerBlock(100, through, "a"), "c1"), 100,
                       through));
  handoff::sim::v1::FaultConfig faults;
  faults.mutable_reject()->add_idempotency_keys(
      KeyOf(id, rejected.block, rejected.log_index, "a"));
  rig->sink()->SetFaults(faults);
  handoff::v1::SourceSpec spec = rig->Spec(id, handoff::v1::DELIVERY_GATE_SAFE);
  spec.mutable_failure_policy()->set_on_rejection(handoff::v1::REJECTION_POLICY_HOLD);
  rig->Create(spec);
}

// A delivery waiting on an operator's hold is not woken by every page the ingest stage
// publishes meanwhile (each wake reread the checkpoint and the run's receipts and
// republished progress, waking every watcher): only pages that rewrite the outbox (a
// correction), or the operator's decision, wake it. Before: one wake per page.
TEST(Effects, ADeliveryHeldForAnOperatorSleepsThroughPlainPages) {
  FaultPoints::CountHits(true);
  Rig rig(consumer::testing::TestDir("held-asleep"));
  FakeProvider& provider = rig.provider("hs");
  StartHoldingARejectedEvent(&rig, "hs", 101, Position{100, 1});
  ASSERT_TRUE(TheOnlyHold(rig, "hs").has_value());
  const int before = FaultPoints::Hits("delivery.woken");
  constexpr int kPages = 30;
  for (int i = kPages; i >= 1; --i) {  // last to first: served back to back
    const uint64_t b = 101 + static_cast<uint64_t>(i);
    provider.SetPage(absl::StrCat("c", i),
                     WithMarks(MakePage(b, b, {MakeRow(b)}, absl::StrCat("c", i + 1)), 100, b));
  }
  ASSERT_TRUE(rig.WaitFor("hs", [](const handoff::v1::Progress& p) {
    return p.checkpoint().resume_cursor() == absl::StrCat("c", kPages + 1);
  })) << "ingest never went past the hold's page";
  EXPECT_LT(FaultPoints::Hits("delivery.woken") - before, 3)
      << "the held delivery was woken by plain pages";
  // The operator's decision still wakes it at once.
  const std::optional<handoff::v1::Hold> hold = TheOnlyHold(rig, "hs");
  ASSERT_TRUE(hold.has_value());
  rig.sink()->SetFaults(handoff::sim::v1::FaultConfig());
  ASSERT_TRUE(Resolve(rig, "hs", *hold, handoff::v1::HOLD_DECISION_RETRY, "sink fixed").ok());
  ASSERT_TRUE(rig.WaitFor("hs", [](const handoff::v1::Progress& p) {
    return DeliveredThrough(p, 101 + kPages, 0);
  })) << "delivery never caught up after the decision";
  FaultPoints::CountHits(false);
}

// A delivery held for an operator whose event a correction then replaces: the hold goes
// with the orphaned event, and the held event is never sent again (nobody decided to
// retry it); the replacing events are delivered.
TEST(Effects, AHeldEventThatACorrectionReplacesIsNeverSentAgain) {
  Rig rig(consumer::testing::TestDir("held-then-reorged"));
  FakeProvider& provider = rig.provider("held");
  StartHoldingARejectedEvent(&rig, "held", 103, Position{103, 0});
  const std::optional<handoff::v1::Hold> hold = TheOnlyHold(rig, "held");
  ASSERT_TRUE(hold.has_value());
  EXPECT_EQ(hold->event().block_number(), 103u);
  ASSERT_EQ(rig.sink()->stats().rejected(), 1u);
  // Blocks 102-104 reorganise (fork "b"); the sink would still refuse the old 103:0.
  provider.SetPage(
      "c1", WithMarks(MakePage(102, 104, TwoEventsPerBlock(102, 104, "b"), "c2", /*reorg=*/true),
                      101, 104));
  ASSERT_TRUE(rig.WaitFor("held", [](const handoff::v1::Progress& p) {
    return DeliveredThrough(p, 104, 1) && p.counters().corrections() == 1;
  })) << "delivery never reached 104:1 after the correction";
  EXPECT_EQ(rig.sink()->stats().rejected(), 1u)
      << "the held event, replaced by the correction, was sent to the sink again";
  handoff::v1::ListHoldsRequest lh;
  lh.set_source_id("held");
  absl::StatusOr<handoff::v1::ListHoldsResponse> holds = rig.manager()->ListHolds(lh);
  ASSERT_TRUE(holds.ok()) << holds.status();
  EXPECT_EQ(holds->holds_size(), 0) << holds->ShortDebugString();
  std::map<std::string, sim::SinkRecord> records = rig.Records();
  EXPECT_EQ(records.count(KeyOf("held", 103, 0, "b")), 1u);
  EXPECT_EQ(records.count(KeyOf("held", 103, 0, "a")), 0u);
}

// A correction that rewinds delivery below a held event without replacing it leaves the
// hold in a later run: the next run's first call, sent early during this run's commit,
// stops before it (nobody decided to retry it). Before: the held event was sent again
// and rejected a second time.
TEST(Effects, TheNextRunSentEarlyStopsBeforeAHeldEvent) {
  Rig rig(consumer::testing::TestDir("early-send-hold"));
  FakeProvider& provider = rig.provider("eh");
  StartHoldingARejectedEvent(&rig, "eh", 105, Position{104, 0});
  ASSERT_TRUE(TheOnlyHold(rig, "eh").has_value());  // delivery waits at 104:0
  ASSERT_EQ(rig.sink()->stats().rejected(), 1u);
  // Block 102 reorganises into three events (the page repeats 103-105 as they were):
  // delivery goes back below 102:0, reads the run 102:0-102:2, and sends the next one's
  // first call (from 104:0, the held event) while it commits.
  std::vector<handoff::v1::EventRow> items = {MakeRow(102, 0, "b"), MakeRow(102, 1, "b"),
                                              MakeRow(102, 2, "b")};
  for (handoff::v1::EventRow& row : TwoEventsPerBlock(103, 105, "a")) items.push_back(row);
  provider.SetPage("c1", WithMarks(MakePage(102, 105, std::move(items), "c2", /*reorg=*/true),
                                   100, 105));
  ASSERT_TRUE(rig.WaitFor("eh", [&](const handoff::v1::Progress&) {
    return rig.Records().count(KeyOf("eh", 102, 2, "b")) == 1;
  })) << "the correction's events were never delivered";
  // An early call would follow within milliseconds: none comes (nobody decided to send
  // the held event again).
  EXPECT_FALSE(rig.WaitFor("eh", [&](const handoff::v1::Progress&) {
    return rig.sink()->stats().rejected() > 1;
  }, absl::Seconds(3))) << "the held event was sent again";
  EXPECT_TRUE(TheOnlyHold(rig, "eh").has_value());
}

// Gated deliveries see a page only once it is published (synced, SourceWorker): a
// finalized mark far ahead of a catching-up ingest does not make a stored page whose
// barrier is not yet published deliverable.
TEST(Effects, AGatedDeliveryWaitsForItsPageToBePublished) {
  Rig rig(consumer::testing::TestDir("gated-published"));
  FakeProvider& provider = rig.provider("pub");
  provider.SetPage("100",
                   WithMarks(MakePage(100, 101, TwoEventsPerBlock(100, 101, "a"), "c1"), 200, 200));
  provider.SetPage("c1",
                   WithMarks(MakePage(102, 103, TwoEventsPerBlock(102, 103, "a"), "c2"), 200, 200));
  // The ingest thread stops after the second page's commit, before publishing it.
  struct Gate {
    absl::Mutex mu;
    int settled ABSL_GUARDED_BY(mu) = 0;
    int idle ABSL_GUARDED_BY(mu) = 0;  // the delivery loop found nothing to deliver
    bool released ABSL_GUARDED_BY(mu) = false;
  };
  auto gate = std::make_shared<Gate>();
  FaultPoints::Arm("ingest.after_barrier", [gate] {
    absl::MutexLock lock(&gate->mu);
    if (++gate->settled == 2) gate->mu.Await(absl::Condition(&gate->released));
    return false;
  });
  FaultPoints::Arm("delivery.idle", [gate] {
    absl::MutexLock lock(&gate->mu);
    ++gate->idle;
    return false;
  });
  // Whatever the test's outcome, the ingest thread is let go before the rig goes.
  struct Release {
    std::shared_ptr<Gate> gate;
    ~Release() {
      absl::MutexLock lock(&gate->mu);
      gate->released = true;
    }
  } release{gate};
  rig.Create(rig.Spec("pub", handoff::v1::DELIVERY_GATE_FINALIZED));
  {
    absl::MutexLock lock(&gate->mu);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    auto stored = [&gate]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gate->mu) { return gate->settled >= 2; };
    ASSERT_TRUE(gate->mu.AwaitWithDeadline(absl::Condition(&stored), deadline));
    // Three times since, the delivery loop found nothing more to deliver.
    const int target = gate->idle + 3;
    auto idled = [&gate, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gate->mu) {
      return gate->idle >= target;
    };
    ASSERT_TRUE(gate->mu.AwaitWithDeadline(absl::Condition(&idled), deadline))
        << "the delivery loop never went idle";
  }
  std::map<std::string, sim::SinkRecord> records = rig.Records();
  EXPECT_EQ(records.count(KeyOf("pub", 101, 1, "a")), 1u) << "the published page was delivered";
  EXPECT_EQ(records.count(KeyOf("pub", 102, 0, "a")), 0u)
      << "an event of a page not yet published was delivered";
  // Nor does the progress show the unpublished page's attempt (as if fully done).
  absl::StatusOr<handoff::v1::Progress> progress = rig.manager()->GetProgress("pub");
  ASSERT_TRUE(progress.ok()) << progress.status();
  EXPECT_NE(progress->attempt().request_cursor(), "c1") << progress->DebugString();
  EXPECT_NE(progress->checkpoint().resume_cursor(), "c2") << progress->DebugString();
  {
    absl::MutexLock lock(&gate->mu);
    gate->released = true;
  }
  ASSERT_TRUE(rig.WaitFor("pub", [](const handoff::v1::Progress& p) {
    return DeliveredThrough(p, 103, 1);
  })) << "delivery never reached 103:1";
}

// The deep SAFE reorg again, with the process crashing at each delivery step of the
// delivery that follows the correction (the one that starts below what was delivered):
// after the restart every replacing event is delivered, with its receipt.
TEST(Effects, SafeGateDeepReorgSurvivesACrashAtEveryDeliveryStep) {
  for (const char* point : kDeliveryCrashPoints) {
    for (int nth : {1, 2}) {
      SCOPED_TRACE(absl::StrCat(point, " #", nth));
      Rig rig(consumer::testing::TestDir(absl::StrCat("safe-crash-", point, "-", nth)));
      FakeProvider& provider = rig.provider("safe");
      provider.SetPage(
          "100", WithMarks(MakePage(100, 105, TwoEventsPerBlock(100, 105, "a"), "c1"), 100, 105));
      rig.Create(rig.Spec("safe", handoff::v1::DELIVERY_GATE_SAFE, /*batch=*/nth == 1));
      ASSERT_TRUE(rig.WaitFor("safe", [](const handoff::v1::Progress& p) {
        return DeliveredThrough(p, 105, 1);
      })) << "delivery never reached 105:1";
      std::shared_ptr<std::atomic<bool>> fired = CrashAtNthHit(point, nth);
      provider.SetPage("c1", WithMarks(MakePage(103, 106, TwoEventsPerBlock(103, 106, "b"), "c2",
                                                /*reorg=*/true),
                                       100, 106));
      ASSERT_TRUE(rig.WaitFor("safe", [&](const handoff::v1::Progress&) {
        return fired->load() && rig.impl()->WorkerForTest("safe")->crashed();
      })) << "fault point never fired";
      rig.Restart();
      ASSERT_TRUE(rig.WaitFor("safe", [](const handoff::v1::Progress& p) {
        return DeliveredThrough(p, 106, 1) && p.counters().corrections() == 1;
      })) << "delivery never reached 106:1 after the restart";
      ExpectEachDeliveredOnce(rig, "safe", 100, 106, /*fork_block=*/103);
      EXPECT_EQ(rig.DeliveryReceipts("safe").size(), 14u);
    }
  }
}

// A correction below the finalized mark (a breach of the provider's contract) of events
// not yet delivered, committed while the next run's rows were already read ahead: the
// rows read before it are dropped, and the replacing events are delivered and recorded.
// (Single calls: the next run's first call, sent early, carries only 101:1, which the
// correction leaves; one that carried a replaced event would halt the source, as
// ACorrectionReplacingAFinalizedEventInFlightToTheSinkHalts shows.)
TEST(Effects, RowsReadAheadBeforeACorrectionAreNotDelivered) {
  FaultPoints::CountHits(true);
  Rig rig(consumer::testing::TestDir("read-ahead-epoch"));
  FakeProvider& provider = rig.provider("fin");
  provider.SetPage("100",
                   WithMarks(MakePage(100, 105, TwoEventsPerBlock(100, 105, "a"), "c1"), 105, 105));
  // The first run (100:0..101:0, runs of 3) commits while the second one's rows
  // (101:1..102:1) are read ahead and its first call (101:1) is sent; its delivery
  // thread then waits for the correction.
  absl::Notification first_run_done, corrected;
  auto runs = std::make_shared<std::atomic<int>>(0);
  FaultPoints::Arm("delivery.after_barrier", [&first_run_done, &corrected, runs] {
    if (runs->fetch_add(1) == 0) {
      first_run_done.Notify();
      corrected.WaitForNotification();
    }
    return false;
  });
  rig.Create(rig.Spec("fin", handoff::v1::DELIVERY_GATE_FINALIZED, /*batch=*/false));
  first_run_done.WaitForNotification();
  provider.SetPage(
      "c1", WithMarks(MakePage(102, 105, TwoEventsPerBlock(102, 105, "b"), "c2", /*reorg=*/true),
                      105, 105));
  EXPECT_TRUE(rig.WaitFor("fin", [](const handoff::v1::Progress& p) {
    return p.counters().corrections() == 1;
  })) << "the correction never committed";
  corrected.Notify();
  ASSERT_TRUE(rig.WaitFor("fin", [](const handoff::v1::Progress& p) {
    return DeliveredThrough(p, 105, 1);
  })) << "delivery never reached 105:1";
  EXPECT_GT(FaultPoints::Hits("delivery.read_ahead_dropped"), 0);
  ExpectEachDeliveredOnce(rig, "fin", 100, 105, /*fork_block=*/102);
  std::map<std::string, sim::SinkRecord> records = rig.Records();
  for (uint64_t b = 102; b <= 105; ++b) {
    for (uint64_t i = 0; i < 2; ++i) {
      EXPECT_EQ(records.count(KeyOf("fin", b, i, "a")), 0u) << "replaced " << b << ":" << i;
    }
  }
  FaultPoints::CountHits(false);
}

TEST(Effects, CrashAtEveryDeliveryStepDeliversEachKeyOnce) {
  for (const char* point : kDeliveryCrashPoints) {
    for (int nth : {1, 2}) {
      SCOPED_TRACE(absl::StrCat(point, " #", nth));
      Rig rig(consumer::testing::TestDir(absl::StrCat("crash-", point, "-", nth)));
      LoadReorgingChain(rig.provider("fin"));
      std::shared_ptr<std::atomic<bool>> fired = CrashAtNthHit(point, nth);
      rig.Create(rig.Spec("fin", handoff::v1::DELIVERY_GATE_FINALIZED, /*batch=*/nth == 1));
      // Wait until the fault fired and the worker is abandoned, then "crash".
      ASSERT_TRUE(rig.WaitFor("fin", [&](const handoff::v1::Progress&) {
        return fired->load() && rig.impl()->WorkerForTest("fin")->crashed();
      })) << "fault point never fired";
      rig.Restart();
      ASSERT_TRUE(rig.WaitFor("fin", [](const handoff::v1::Progress& p) {
        return DeliveredThrough(p, 111, 1);
      }));
      ExpectFinalChainDeliveredOnce(rig, "fin");
    }
  }
}

TEST(Effects, RefusalsBecomeTheDocumentedHoldOrQuarantine) {
  struct Case {
    const char* name;
    handoff::v1::RejectionPolicy policy;
    std::function<void(handoff::sim::v1::FaultConfig*)> fault;
    handoff::v1::HoldKind hold;  // HOLD_KIND_UNSPECIFIED: quarantined, no hold
  };
  const std::vector<Case> cases = {
      {"rejected-quarantine", handoff::v1::REJECTION_POLICY_QUARANTINE,
       [](handoff::sim::v1::FaultConfig* f) { f->mutable_reject()->add_blocks(101); },
       handoff::v1::HOLD_KIND_UNSPECIFIED},
      {"rejected-hold", handoff::v1::REJECTION_POLICY_HOLD,
       [](handoff::sim::v1::FaultConfig* f) { f->mutable_reject()->add_blocks(101); },
       handoff::v1::HOLD_KIND_OPERATOR_REVIEW},
      {"needs-review", handoff::v1::REJECTION_POLICY_QUARANTINE,
       [](handoff::sim::v1::FaultConfig* f) { f->mutable_review()->add_blocks(101); },
       handoff::v1::HOLD_KIND_OPERATOR_REVIEW},
      {"retry-exhausted", handoff::v1::REJECTION_POLICY_HOLD,
       [](handoff::sim::v1::FaultConfig* f) {
         f->set_fail_next_calls(1000);
         f->set_fail_mode(handoff::sim::v1::FAIL_MODE_RETRY_LATER);
         f->set_retry_after_ms(1);
       },
       handoff::v1::HOLD_KIND_RETRYABLE_DEAD_LETTER},
  };
  for (const handoff::v1::DeliveryGate gate :
       {handoff::v1::DELIVERY_GATE_IMMEDIATE, handoff::v1::DELIVERY_GATE_FINALIZED}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(c.name, " gate ", gate));
      Rig rig(consumer::testing::TestDir(absl::StrCat("refusal-", c.name, "-", gate)));
      rig.provider("src").SetPage(
          "100", WithMarks(MakePage(100, 102, {MakeRow(100), MakeRow(101), MakeRow(102)}, "c1"),
                           102, 102));
      handoff::sim::v1::FaultConfig faults;
      c.fault(&faults);
      rig.sink()->SetFaults(faults);
      handoff::v1::SourceSpec spec = rig.Spec("src", gate, /*batch=*/false);
      spec.mutable_failure_policy()->set_on_rejection(c.policy);
      rig.Create(spec);
      const bool delivery = gate != handoff::v1::DELIVERY_GATE_IMMEDIATE;
      auto through = [&](const handoff::v1::Progress& p, uint64_t block) {
        if (delivery) return DeliveredThrough(p, block, 0);
        return p.checkpoint().has_applied() && p.checkpoint().applied_block() >= block &&
               p.checkpoint().resume_cursor() == "c1";
      };
      if (c.hold == handoff::v1::HOLD_KIND_UNSPECIFIED) {
        ASSERT_TRUE(rig.WaitFor("src", [&](const handoff::v1::Progress& p) { return through(p, 102); }));
        handoff::v1::ListQuarantineRequest q;
        q.set_source_id("src");
        absl::StatusOr<handoff::v1::ListQuarantineResponse> list = rig.manager()->ListQuarantine(q);
        ASSERT_TRUE(list.ok());
        ASSERT_EQ(list->records_size(), 1);
        EXPECT_EQ(list->records(0).event().block_number(), 101u);
        EXPECT_EQ(list->records(0).disposition(), handoff::v1::DISPOSITION_QUARANTINED);
        continue;
      }
      // The hold blocks the right barrier (a retrying event becomes a dead letter only
      // after max_attempts).
      handoff::v1::ListHoldsRequest lh;
      lh.set_source_id("src");
      ASSERT_TRUE(rig.WaitFor("src", [&](const handoff::v1::Progress&) {
        absl::StatusOr<handoff::v1::ListHoldsResponse> h = rig.manager()->ListHolds(lh);
        return h.ok() && h->holds_size() == 1 && h->holds(0).kind() == c.hold;
      }));
      absl::StatusOr<handoff::v1::ListHoldsResponse> holds = rig.manager()->ListHolds(lh);
      ASSERT_TRUE(holds.ok());
      ASSERT_EQ(holds->holds_size(), 1);
      const handoff::v1::Hold hold = holds->holds(0);
      EXPECT_EQ(hold.kind(), c.hold);
      EXPECT_EQ(hold.stage(), delivery ? handoff::v1::STAGE_DELIVERY : handoff::v1::STAGE_INGEST);
      absl::StatusOr<handoff::v1::Progress> before = rig.manager()->GetProgress("src");
      ASSERT_TRUE(before.ok());
      EXPECT_FALSE(through(*before, 102));
      // Resolving it moves that barrier.
      rig.sink()->SetFaults(handoff::sim::v1::FaultConfig());
      ASSERT_TRUE(
          Resolve(rig, "src", hold, handoff::v1::HOLD_DECISION_IGNORE, "known bad event").ok());
      ASSERT_TRUE(rig.WaitFor("src", [&](const handoff::v1::Progress& p) { return through(p, 102); }));
    }
  }
}

TEST(Effects, UnavailableSinkBacksOffWithoutSpinningOrBlockingOthers) {
  Rig rig(consumer::testing::TestDir("slow"));
  rig.provider("down").SetPage("100", MakePage(100, 100, {MakeRow(100)}, "c1"));
  rig.provider("local").SetPage("100", MakePage(100, 100, {MakeRow(100)}, "c1"));
  handoff::sim::v1::FaultConfig faults;
  faults.set_fail_next_calls(1000000);
  faults.set_fail_mode(handoff::sim::v1::FAIL_MODE_UNAVAILABLE);
  rig.sink()->SetFaults(faults);
  handoff::v1::SourceSpec down = rig.Spec("down", handoff::v1::DELIVERY_GATE_IMMEDIATE, false);
  down.mutable_failure_policy()->set_initial_backoff_ms(100);
  down.mutable_failure_policy()->set_max_backoff_ms(400);
  rig.Create(down);
  handoff::v1::SourceSpec local = rig.Spec("local", handoff::v1::DELIVERY_GATE_IMMEDIATE);
  local.mutable_sink()->mutable_local_rows();
  rig.Create(local);
  // The other source is not blocked.
  ASSERT_TRUE(rig.WaitFor("local", [](const handoff::v1::Progress& p) {
    return p.checkpoint().resume_cursor() == "c1";
  }));
  // The failing one backs off: over 1.5 s, with backoff >= 50 ms (half the initial
  // delay) the sink sees at most ~30 calls, where a spinning loop would make thousands.
  const uint64_t calls_before = rig.sink()->stats().calls();
  ASSERT_TRUE(rig.WaitFor("down", [](const handoff::v1::Progress& p) {
    return p.state() == handoff::v1::SOURCE_STATE_BACKING_OFF;
  }));
  absl::Time until = absl::Now() + absl::Milliseconds(1500);
  rig.WaitFor("down", [&](const handoff::v1::Progress&) { return absl::Now() >= until; },
              absl::Seconds(3));
  const uint64_t calls = rig.sink()->stats().calls() - calls_before;
  EXPECT_LE(calls, 32u);
  EXPECT_GE(calls, 1u);
  absl::StatusOr<handoff::v1::Progress> p = rig.manager()->GetProgress("down");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->checkpoint().resume_cursor(), "100") << "nothing promoted while the sink is down";
  EXPECT_EQ(p->counters().open_holds(), 1u) << "the retrying event's attempts are persisted";
}

}  // namespace
}  // namespace handoff::tests
