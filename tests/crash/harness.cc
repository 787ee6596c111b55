#include "tests/crash/harness.h"

#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "consumer/fault_points.h"
#include "consumer/source_manager.h"
#include "store/row_codec.h"

namespace handoff::tests {

using consumer::PageAttempt;

Harness::Harness(std::string dir, HarnessOptions options)
    : dir_(std::move(dir)),
      options_(options),
      provider_(std::make_unique<consumer::testing::FakeProvider>()),
      sink_(std::make_unique<consumer::testing::FakeSink>(options.sink_batch)),
      fs_(std::make_shared<store::FaultInjectionFs>()),
      env_(rocksdb::NewCompositeEnv(fs_)) {
  spec_.set_id("crash-src");
  spec_.set_provider_url("http://provider.invalid");
  spec_.set_chain("testnet");
  spec_.set_source("logs");
  spec_.set_filter("all");
  spec_.set_transport(handoff::v1::TRANSPORT_POLL);
  spec_.mutable_start()->set_block(options.start_block);
  if (options.external_sink) {
    spec_.mutable_sink()->mutable_downstream()->set_target("sink.invalid:1");
    spec_.mutable_sink()->set_gate(handoff::v1::DELIVERY_GATE_IMMEDIATE);
  }
  spec_.mutable_failure_policy()->set_max_attempts(options.max_attempts);
  spec_.mutable_failure_policy()->set_initial_backoff_ms(options.initial_backoff_ms);
  spec_.mutable_failure_policy()->set_max_backoff_ms(2 * options.initial_backoff_ms);
  spec_.mutable_failure_policy()->set_on_rejection(options.on_rejection);
}

Harness::~Harness() {
  blocked_.reset();
  manager_.reset();
  store_.reset();
  consumer::FaultPoints::DisarmAll();
}

void Harness::Open() {
  store::StoreOptions so;
  so.path = dir_;
  so.env = env_.get();
  absl::StatusOr<std::unique_ptr<store::Store>> s = store::Store::Open(so);
  if (!s.ok()) abort();
  store_ = *std::move(s);
  effect_ = std::make_unique<consumer::testing::CountingEffect>(store_.get());
  consumer::SourceManagerOptions mo;
  mo.store = store_.get();
  mo.factories.provider = [](const handoff::v1::SourceSpec&) {
    return absl::StatusOr<std::unique_ptr<consumer::Provider>>(
        absl::UnimplementedError("the crash suite drives attempts itself"));
  };
  absl::StatusOr<std::unique_ptr<consumer::SourceManager>> m =
      consumer::SourceManager::Create(std::move(mo));
  if (!m.ok()) abort();
  manager_ = *std::move(m);
  if (!store_->GetSource(spec_.id()).ok()) {
    handoff::v1::CreateSourceRequest req;
    *req.mutable_spec() = spec_;
    if (!manager_->CreateSource(req).ok()) abort();
  }
}

void Harness::Crash() {
  consumer::FaultPoints::DisarmAll();
  const store::CheckpointRecord before = Checkpoint();
  fs_->Deactivate();  // the power goes: nothing more reaches the disk
  blocked_.reset();   // in-memory attempt state is lost
  manager_.reset();
  store_.reset();
  if (!fs_->DropUnsyncedData().ok()) abort();
  fs_->Reactivate();
  Open();
  const store::CheckpointRecord after = Checkpoint();
  lost_on_crash_.clear();
  if (after.version() != before.version() || after.step_seq() != before.step_seq()) {
    lost_on_crash_ = absl::StrCat("the power loss took back committed steps: checkpoint v",
                                  before.version(), " seq ", before.step_seq(), " came back as v",
                                  after.version(), " seq ", after.step_seq());
  }
}

void Harness::Load(const Script& script) {
  for (size_t i = 0; i < script.pages.size(); ++i) {
    provider_->SetPage(script.cursors[i], consumer::CopyOfPage(script.pages[i]));
  }
}

PageAttempt::Result Harness::Step() {
  if (blocked_ != nullptr) {
    PageAttempt::Result r = blocked_->Run();
    if (r.kind != PageAttempt::Result::Kind::kBlockedOnHold &&
        r.kind != PageAttempt::Result::Kind::kRetryLater) {
      blocked_.reset();
    }
    return r;
  }
  absl::StatusOr<store::CheckpointRecord> cp =
      store_->LoadCheckpoint(spec_.id(), store::Stage::kIngest);
  if (!cp.ok()) abort();
  consumer::FetchResult f = provider_->Fetch(cp->resume_cursor());
  if (!f.page.has_value()) {
    PageAttempt::Result r;
    r.kind = PageAttempt::Result::Kind::kCancelled;
    r.detail = "refused";
    return r;
  }
  if (consumer::FaultPoints::Hit("ingest.after_fetch")) {
    PageAttempt::Result r;
    r.kind = PageAttempt::Result::Kind::kCrashed;
    return r;
  }
  consumer::WorkerOptions wo;
  wo.max_events_per_step = options_.events_per_step;
  wo.fuse_barrier = options_.fuse_barrier;
  consumer::AttemptConfig config = consumer::MakeAttemptConfig(
      spec_, store::Stage::kIngest, store_.get(), options_.external_sink ? sink_.get() : nullptr,
      options_.external_sink ? nullptr : effect_.get(), nullptr, wo, &cancelled_);
  auto attempt = std::make_unique<PageAttempt>(config, *std::move(cp), *std::move(f.page));
  PageAttempt::Result r = attempt->Run();
  if (r.kind == PageAttempt::Result::Kind::kBlockedOnHold ||
      r.kind == PageAttempt::Result::Kind::kRetryLater) {
    blocked_ = std::move(attempt);
  }
  return r;
}

PageAttempt::Result Harness::RunUntilIdle(int max_steps) {
  PageAttempt::Result r;
  for (int i = 0; i < max_steps; ++i) {
    r = Step();
    switch (r.kind) {
      case PageAttempt::Result::Kind::kPromoted:
      case PageAttempt::Result::Kind::kLostRace:
        continue;
      case PageAttempt::Result::Kind::kRetryLater:
        // Retry delays are 1-2 ms in the harness policy; wait for the due time.
        absl::SleepFor(std::max(absl::ZeroDuration(), r.retry_at - absl::Now()));
        continue;
      default:
        return r;
    }
  }
  return r;
}

store::CheckpointRecord Harness::Checkpoint() {
  absl::StatusOr<store::CheckpointRecord> cp =
      store_->LoadCheckpoint(spec_.id(), store::Stage::kIngest);
  if (!cp.ok()) abort();
  return *cp;
}

std::map<Position, std::string> Harness::Rows() {
  std::map<Position, std::string> rows;
  const uint64_t kMax = std::numeric_limits<uint64_t>::max();
  store_
      ->ScanRows(spec_.id(), Position{0, 0}, Position{kMax, kMax},
                 [&](Position pos, absl::string_view value) {
                   handoff::v1::EventRow row;
                   // An unreadable row shows as an empty hash, which no check accepts.
                   store::DecodeRow(value, &row).IgnoreError();
                   rows[pos] = row.block_hash();
                   return true;
                 })
      .IgnoreError();
  return rows;
}

std::vector<handoff::v1::Hold> Harness::Holds() {
  handoff::v1::ListHoldsRequest req;
  req.set_source_id(spec_.id());
  absl::StatusOr<handoff::v1::ListHoldsResponse> r = manager_->ListHolds(req);
  if (!r.ok()) return {};
  return {r->holds().begin(), r->holds().end()};
}

absl::StatusOr<handoff::v1::ResolveHoldResponse> Harness::Resolve(
    Position pos, handoff::v1::HoldDecision decision) {
  handoff::v1::GetHoldRequest get;
  get.set_source_id(spec_.id());
  get.set_stage(handoff::v1::STAGE_INGEST);
  get.set_block_number(pos.block);
  get.set_log_index(pos.log_index);
  absl::StatusOr<handoff::v1::Hold> hold = manager_->GetHold(get);
  if (!hold.ok()) return hold.status();
  handoff::v1::ResolveHoldRequest req;
  req.set_source_id(spec_.id());
  req.set_stage(handoff::v1::STAGE_INGEST);
  req.set_block_number(pos.block);
  req.set_log_index(pos.log_index);
  req.set_decision(decision);
  req.set_reason("test decision");
  req.set_hold_version(hold->version());
  return manager_->ResolveHold(req, "test-operator");
}

namespace {

// The blocks whose rows a page replaces (the contract's delete-and-insert rule): [from,
// through]; from `from` up for a correction that covers no block; none for any other
// page that covers no block.
std::optional<std::pair<uint64_t, uint64_t>> ReplacedBlocks(const consumer::Page& p) {
  if (p.through.has_value()) return std::make_pair(p.from, p.through->number);
  if (p.reorg) return std::make_pair(p.from, std::numeric_limits<uint64_t>::max());
  return std::nullopt;
}

}  // namespace

std::map<Position, std::string> ModelAfter(const Script& script, size_t k) {
  std::map<Position, std::string> model;
  const uint64_t kMax = std::numeric_limits<uint64_t>::max();
  for (size_t i = 0; i < k && i < script.pages.size(); ++i) {
    const consumer::Page& p = script.pages[i];
    if (const auto blocks = ReplacedBlocks(p); blocks.has_value()) {
      model.erase(model.lower_bound(Position{blocks->first, 0}),
                  model.upper_bound(Position{blocks->second, kMax}));
    }
    for (const handoff::v1::EventRow& row : p.items) {
      model[Position{row.block_number(), row.log_index()}] = row.block_hash();
    }
  }
  return model;
}

std::string CheckInvariants(Harness& h, const Script& script) {
  if (!h.lost_on_crash().empty()) return h.lost_on_crash();
  store::CheckpointRecord cp = h.Checkpoint();
  size_t k = script.pages.size();
  for (size_t i = 0; i < script.cursors.size(); ++i) {
    if (script.cursors[i] == cp.resume_cursor()) k = i;
  }
  std::map<Position, std::string> rows = h.Rows();
  std::map<Position, std::string> model = ModelAfter(script, k);
  const consumer::Page* current = k < script.pages.size() ? &script.pages[k] : nullptr;
  // The blocks a correction in flight is replacing.
  const std::optional<std::pair<uint64_t, uint64_t>> replacing =
      current != nullptr && current->reorg ? ReplacedBlocks(*current) : std::nullopt;
  auto being_replaced = [&replacing](Position pos) {
    return replacing.has_value() && pos.block >= replacing->first &&
           pos.block <= replacing->second;
  };
  // 1. The cursor never moved past a non-terminal event: every event of the committed
  //    pages is durable (except what the page in flight is replacing).
  for (const auto& [pos, hash] : model) {
    if (being_replaced(pos)) continue;
    auto it = rows.find(pos);
    if (it == rows.end() || it->second != hash) {
      return absl::StrCat("cursor ", cp.resume_cursor(), " is past event ", pos.DebugString(),
                          " which has no durable outcome");
    }
  }
  // 2. applied_position never exceeds the durable prefix: every event at or below it
  //    has a durable outcome. With a correction in flight, the replaced range counts
  //    only once the correction has started (its first item is durable).
  if (cp.has_applied()) {
    Position applied{cp.applied_block(), cp.applied_log_index()};
    auto require = [&](Position pos) -> std::string {
      if (pos > applied || rows.count(pos) > 0) return "";
      return absl::StrCat("applied position ", applied.DebugString(),
                          " exceeds the durable prefix: ", pos.DebugString(), " is missing");
    };
    const bool correcting = replacing.has_value();
    for (const auto& [pos, hash] : model) {
      if (being_replaced(pos)) continue;
      if (std::string e = require(pos); !e.empty()) return e;
    }
    if (current != nullptr) {
      bool started = !correcting;
      if (correcting && !current->items.empty()) {
        const handoff::v1::EventRow& first = current->items.front();
        auto it = rows.find(Position{first.block_number(), first.log_index()});
        started = it != rows.end() && it->second == first.block_hash();
      }
      if (started) {
        for (const handoff::v1::EventRow& row : current->items) {
          if (std::string e = require(Position{row.block_number(), row.log_index()}); !e.empty()) {
            return e;
          }
        }
      }
    }
  }
  // 3. The transactional effect was applied at most once per event.
  for (const auto& [pos, hash] : rows) {
    int n = consumer::testing::CountingEffect::Count(*h.store(), h.id(), pos);
    if (n > 1) return absl::StrCat("effect applied ", n, " times at ", pos.DebugString());
  }
  return "";
}

std::string CheckComplete(Harness& h, const Script& script) {
  store::CheckpointRecord cp = h.Checkpoint();
  const std::string& last_next = script.pages.back().next;
  if (cp.resume_cursor() != last_next) {
    return absl::StrCat("resume cursor is ", cp.resume_cursor(), ", expected ", last_next);
  }
  std::map<Position, std::string> rows = h.Rows();
  std::map<Position, std::string> model = ModelAfter(script, script.pages.size());
  if (rows != model) {
    return absl::StrCat("rows differ from the model: ", rows.size(), " rows, ", model.size(),
                        " expected");
  }
  return CheckInvariants(h, script);
}

}  // namespace handoff::tests
