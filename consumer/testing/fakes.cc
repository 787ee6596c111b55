#include "consumer/testing/fakes.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "base/thread_name.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace handoff::consumer::testing {

std::string TestDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
}

FetchResult ForwardingProvider::Fetch(const std::string& committed_cursor) {
  if (cancelled_.load()) {
    Refusal r;
    r.kind = RefusalKind::kCancelled;
    return FetchResult::Refused(r);
  }
  return target_->Fetch(committed_cursor);
}

handoff::v1::EventRow MakeRow(uint64_t block, uint64_t log_index, const std::string& fork) {
  handoff::v1::EventRow row;
  row.set_block_number(block);
  row.set_log_index(log_index);
  row.set_block_hash(absl::StrFormat("0x%s%062x", fork.substr(0, 2), block));
  row.set_address("0x00000000000000000000000000000000000000aa");
  row.add_topics(absl::StrFormat("0x%064x", log_index));
  row.set_data(absl::StrCat("0x", fork == "a" ? "" : "ff", "01"));
  row.set_transaction_hash(absl::StrFormat("0x%064x", block * 1000 + log_index));
  row.set_transaction_index(log_index);
  return row;
}

Page MakePage(uint64_t from, uint64_t through, std::vector<handoff::v1::EventRow> items,
              std::string next, bool reorg) {
  Page p;
  p.from = from;
  p.through = BlockMarkValue{through, absl::StrFormat("0x%064x", through)};
  p.items = std::move(items);
  p.next = std::move(next);
  p.reorg = reorg;
  p.tip = through + 10;
  return p;
}

void FakeProvider::SetPage(const std::string& cursor, Page page) {
  absl::MutexLock lock(&mu_);
  pages_[cursor] = std::move(page);
}

void FakeProvider::SetRefusal(const std::string& cursor, Refusal refusal, int times) {
  absl::MutexLock lock(&mu_);
  refusals_[cursor] = {std::move(refusal), times};
}

FetchResult FakeProvider::Fetch(const std::string& cursor) {
  if (cancelled_.load()) {
    Refusal r;
    r.kind = RefusalKind::kCancelled;
    return FetchResult::Refused(r);
  }
  absl::MutexLock lock(&mu_);
  requested_.push_back(cursor);
  fetch_threads_.push_back(CurrentThreadName());
  auto rit = refusals_.find(cursor);
  if (rit != refusals_.end() && rit->second.second > 0) {
    --rit->second.second;
    return FetchResult::Refused(rit->second.first);
  }
  auto it = pages_.find(cursor);
  if (it == pages_.end()) {
    Page empty;
    empty.next = cursor;
    return FetchResult::Of(std::move(empty));
  }
  Page page = CopyOfPage(it->second);
  if (budget_ != nullptr) {
    if (std::optional<PageSlot> slot = budget_->TryAcquire()) page.slot = *std::move(slot);
  }
  return FetchResult::Of(std::move(page));
}

void FakeProvider::set_page_budget(std::shared_ptr<PageBudget> budget) {
  absl::MutexLock lock(&mu_);
  budget_ = std::move(budget);
}

int FakeProvider::fetches() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(requested_.size());
}

std::vector<std::string> FakeProvider::requested() const {
  absl::MutexLock lock(&mu_);
  return requested_;
}

std::vector<std::string> FakeProvider::fetch_threads() const {
  absl::MutexLock lock(&mu_);
  return fetch_threads_;
}

void FakeSink::SetScript(Script script) {
  absl::MutexLock lock(&mu_);
  script_ = std::move(script);
}

std::vector<SinkAnswer> FakeSink::Deliver(absl::string_view,
                                          absl::Span<const Delivery> deliveries) {
  absl::MutexLock lock(&mu_);
  ++calls_;
  std::vector<SinkAnswer> out;
  for (const Delivery& d : deliveries) {
    int attempt = ++attempts_[d.idempotency_key];
    keys_[{d.row->block_number(), d.row->log_index()}].push_back(d.idempotency_key);
    SinkAnswer a;
    a.kind = SinkAnswer::Kind::kApplied;
    if (script_) a = script_(d.idempotency_key, attempt);
    if (a.kind == SinkAnswer::Kind::kApplied) {
      int& n = effects_[d.idempotency_key];
      if (n > 0) a.kind = SinkAnswer::Kind::kAlreadyApplied;  // the sink's own dedupe
      else n = 1;
    }
    out.push_back(a);
  }
  return out;
}

int FakeSink::effects(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = effects_.find(key);
  return it == effects_.end() ? 0 : it->second;
}

int FakeSink::attempts(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = attempts_.find(key);
  return it == attempts_.end() ? 0 : it->second;
}

std::vector<std::string> FakeSink::keys_for(uint64_t block, uint64_t log_index) const {
  absl::MutexLock lock(&mu_);
  auto it = keys_.find({block, log_index});
  return it == keys_.end() ? std::vector<std::string>() : it->second;
}

size_t FakeSink::applied_keys() const {
  absl::MutexLock lock(&mu_);
  return effects_.size();
}

int FakeSink::total_calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

namespace {
// Value: "<block hash> <count>"; a reorged event at the same position starts again.
std::pair<std::string, int> ReadCount(const store::Store& store, absl::string_view source_id,
                                      Position pos) {
  std::pair<std::string, int> out{"", 0};
  store.ScanOutbox(source_id, pos, pos, [&](Position, absl::string_view value) {
         size_t space = value.find(' ');
         if (space == absl::string_view::npos) return false;
         out.first = std::string(value.substr(0, space));
         if (!absl::SimpleAtoi(value.substr(space + 1), &out.second)) out.second = 0;
         return false;
       })
      .IgnoreError();
  return out;
}
}  // namespace

int CountingEffect::Count(const store::Store& store, absl::string_view source_id,
                          Position pos) {
  return ReadCount(store, source_id, pos).second;
}

absl::Status CountingEffect::Stage(absl::string_view source_id,
                                   const handoff::v1::EventRow& row, store::StepBatch* step) {
  Position pos{row.block_number(), row.log_index()};
  // Read-modify-write: a second application of the same event makes it 2.
  std::pair<std::string, int> old = ReadCount(*store_, source_id, pos);
  int n = old.first == row.block_hash() ? old.second + 1 : 1;
  step->PutOutbox(pos, absl::StrCat(row.block_hash(), " ", n));
  return absl::OkStatus();
}

}  // namespace handoff::consumer::testing
