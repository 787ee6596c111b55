#include "sim/sample_sink/sink_core.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace handoff::sim {
namespace {

using handoff::sim::v1::EventPredicate;
using handoff::sim::v1::FaultConfig;
using handoff::v1::ApplyRequest;
using handoff::v1::ApplyResponse;

bool Matches(const EventPredicate& p, const ApplyRequest& request) {
  if (p.log_index_modulo() > 0 && request.event().log_index() % p.log_index_modulo() == 0) {
    return true;
  }
  for (uint64_t block : p.blocks()) {
    if (request.event().block_number() == block) return true;
  }
  for (const std::string& key : p.idempotency_keys()) {
    if (request.idempotency_key() == key) return true;
  }
  return false;
}

ApplyResponse Answer(handoff::v1::ApplyOutcome outcome, std::string message,
                     uint32_t retry_after_ms = 0) {
  ApplyResponse response;
  response.set_outcome(outcome);
  response.set_message(std::move(message));
  response.set_retry_after_ms(retry_after_ms);
  return response;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SinkCore>> SinkCore::Open(Options options) {
  if (options.db_path.empty()) return absl::InvalidArgumentError("sample sink: no db_path");
  absl::StatusOr<std::unique_ptr<RecordStore>> store =
      RecordStore::Open(options.db_path, options.sync);
  if (!store.ok()) return store.status();
  return std::unique_ptr<SinkCore>(new SinkCore(std::move(options), *std::move(store)));
}

SinkCore::SinkCore(Options options, std::unique_ptr<RecordStore> store)
    : crash_hook_(std::move(options.crash_hook)), store_(std::move(store)) {
  faults_ = std::move(options.faults);
}

SinkCore::~SinkCore() = default;

absl::StatusOr<std::vector<ApplyResponse>> SinkCore::Apply(
    absl::Span<const ApplyRequest* const> requests, bool batch) {
  FaultConfig faults;
  {
    absl::MutexLock lock(&mu_);
    stats_.set_calls(stats_.calls() + 1);
    if (batch) stats_.set_batch_calls(stats_.batch_calls() + 1);
    if (crashed_ || shutdown_) {
      stats_.set_failed_calls(stats_.failed_calls() + 1);
      return absl::UnavailableError(crashed_ ? "sample sink crashed" : "sample sink stopping");
    }
    faults = faults_;
    if (faults.delay_ms() > 0) {
      // The slow-sink feature: this wait IS the behaviour, and Shutdown() cuts it short.
      mu_.AwaitWithTimeout(absl::Condition(&shutdown_), absl::Milliseconds(faults.delay_ms()));
      if (shutdown_) {
        stats_.set_failed_calls(stats_.failed_calls() + 1);
        return absl::UnavailableError("sample sink stopping");
      }
    }
    if (batch && faults.batch_unimplemented()) {
      stats_.set_failed_calls(stats_.failed_calls() + 1);
      return absl::UnimplementedError("sample sink: ApplyBatch disabled by fault knob");
    }
    if (faults_.fail_next_calls() > 0) {
      faults_.set_fail_next_calls(faults_.fail_next_calls() - 1);
      if (faults.fail_mode() == handoff::sim::v1::FAIL_MODE_UNAVAILABLE) {
        stats_.set_failed_calls(stats_.failed_calls() + 1);
        return absl::UnavailableError("sample sink: failing call by fault knob");
      }
      stats_.set_retry_later(stats_.retry_later() + requests.size());
      std::vector<ApplyResponse> out;
      out.reserve(requests.size());
      for (size_t i = 0; i < requests.size(); ++i) {
        out.push_back(Answer(handoff::v1::APPLY_OUTCOME_RETRY_LATER, "fault knob: retry later",
                             faults.retry_after_ms()));
      }
      return out;
    }
  }
  size_t n = requests.size();
  if (batch && faults.batch_answer_limit() > 0) {
    n = std::min<size_t>(n, faults.batch_answer_limit());
  }
  absl::MutexLock write_lock(&write_mu_);
  absl::StatusOr<std::vector<ApplyResponse>> out = ApplyEvents(requests.subspan(0, n), faults);
  if (!out.ok()) {
    absl::MutexLock lock(&mu_);
    stats_.set_failed_calls(stats_.failed_calls() + 1);
  }
  return out;
}

absl::StatusOr<std::vector<ApplyResponse>> SinkCore::ApplyEvents(
    absl::Span<const ApplyRequest* const> requests, const FaultConfig& faults) {
  std::vector<ApplyResponse> out;
  out.reserve(requests.size());
  std::vector<std::pair<std::string, SinkRecord>> writes;
  absl::flat_hash_map<std::string, size_t> pending;  // key -> index in writes
  uint64_t new_keys = 0;
  handoff::sim::v1::Stats delta;
  for (const ApplyRequest* request : requests) {
    if (Matches(faults.reject(), *request)) {
      delta.set_rejected(delta.rejected() + 1);
      out.push_back(Answer(handoff::v1::APPLY_OUTCOME_REJECTED, "fault knob: rejected"));
      continue;
    }
    if (Matches(faults.review(), *request)) {
      delta.set_needs_review(delta.needs_review() + 1);
      out.push_back(Answer(handoff::v1::APPLY_OUTCOME_NEEDS_REVIEW, "fault knob: review"));
      continue;
    }
    if (Matches(faults.ignore(), *request)) {
      delta.set_ignored(delta.ignored() + 1);
      out.push_back(Answer(handoff::v1::APPLY_OUTCOME_IGNORED, "fault knob: ignored"));
      continue;
    }
    const std::string& key = request->idempotency_key();
    if (key.empty()) {
      delta.set_rejected(delta.rejected() + 1);
      out.push_back(Answer(handoff::v1::APPLY_OUTCOME_REJECTED, "no idempotency key"));
      continue;
    }
    if (auto it = pending.find(key); it != pending.end()) {
      ++writes[it->second].second.attempts;
      delta.set_already_applied(delta.already_applied() + 1);
      out.push_back(Answer(handoff::v1::APPLY_OUTCOME_ALREADY_APPLIED, "duplicate in batch"));
      continue;
    }
    absl::StatusOr<std::optional<SinkRecord>> existing = store_->Get(key);
    if (!existing.ok()) return existing.status();
    if (existing->has_value()) {
      SinkRecord record = **std::move(existing);
      ++record.attempts;
      pending.emplace(key, writes.size());
      writes.emplace_back(key, std::move(record));
      delta.set_already_applied(delta.already_applied() + 1);
      out.push_back(Answer(handoff::v1::APPLY_OUTCOME_ALREADY_APPLIED, "already applied"));
      continue;
    }
    const uint64_t nth = new_records_ + new_keys + 1;
    if (faults.die_before_records() > 0 && nth == faults.die_before_records()) {
      absl::Status s = Commit(writes, new_keys);
      if (!s.ok()) return s;
      Crash();
      return absl::UnavailableError("sample sink crashed (die_before_records)");
    }
    SinkRecord record;
    record.request = *request;
    record.attempts = 1;
    pending.emplace(key, writes.size());
    writes.emplace_back(key, std::move(record));
    ++new_keys;
    delta.set_applied(delta.applied() + 1);
    out.push_back(Answer(handoff::v1::APPLY_OUTCOME_APPLIED, ""));
    if (faults.die_after_records() > 0 && nth == faults.die_after_records()) {
      absl::Status s = Commit(writes, new_keys);
      if (!s.ok()) return s;
      Crash();
      return absl::UnavailableError("sample sink crashed (die_after_records)");
    }
  }
  absl::Status s = Commit(writes, new_keys);
  if (!s.ok()) return s;
  absl::MutexLock lock(&mu_);
  stats_.set_applied(stats_.applied() + delta.applied());
  stats_.set_already_applied(stats_.already_applied() + delta.already_applied());
  stats_.set_rejected(stats_.rejected() + delta.rejected());
  stats_.set_needs_review(stats_.needs_review() + delta.needs_review());
  stats_.set_ignored(stats_.ignored() + delta.ignored());
  return out;
}

absl::Status SinkCore::Commit(const std::vector<std::pair<std::string, SinkRecord>>& writes,
                              uint64_t new_keys) {
  absl::Status s = store_->Write(writes, new_keys);
  if (s.ok()) new_records_ += new_keys;
  return s;
}

void SinkCore::Crash() {
  if (!crash_hook_) std::abort();
  crash_hook_();
  absl::MutexLock lock(&mu_);
  crashed_ = true;
}

void SinkCore::SetFaults(const FaultConfig& faults) {
  absl::MutexLock lock(&mu_);
  faults_ = faults;
}

FaultConfig SinkCore::faults() const {
  absl::MutexLock lock(&mu_);
  return faults_;
}

handoff::sim::v1::Stats SinkCore::stats() const {
  absl::MutexLock lock(&mu_);
  handoff::sim::v1::Stats out = stats_;
  out.set_records(store_->size());
  return out;
}

absl::StatusOr<std::map<std::string, SinkRecord>> SinkCore::Records() const {
  return store_->All();
}

bool SinkCore::WaitForCalls(uint64_t n, absl::Duration timeout) const {
  struct Arg {
    const SinkCore* core;
    uint64_t n;
  } arg{this, n};
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](Arg* a) {
                                    a->core->mu_.AssertReaderHeld();
                                    return a->core->stats_.calls() >= a->n;
                                  },
                                  &arg),
                              timeout);
}

void SinkCore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

}  // namespace handoff::sim
