// Test doubles of the consumer's interfaces (testonly): a scripted provider, a
// programmable external sink with its own dedupe, and a non-idempotent transactional
// effect whose count lives in the same batch as the receipt.
#ifndef HANDOFF_CONSUMER_TESTING_FAKES_H_
#define HANDOFF_CONSUMER_TESTING_FAKES_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "consumer/page.h"
#include "consumer/page_budget.h"
#include "consumer/provider.h"
#include "consumer/sink.h"
#include "store/store.h"

namespace handoff::consumer::testing {

// A fresh directory path under $TEST_TMPDIR (or /tmp) for a test's database.
std::string TestDir(const std::string& name);

// Builds an EventRow for tests.
handoff::v1::EventRow MakeRow(uint64_t block, uint64_t log_index = 0, const std::string& fork = "a");
// A page covering [from, through] with `items` and the given next cursor.
Page MakePage(uint64_t from, uint64_t through, std::vector<handoff::v1::EventRow> items,
              std::string next, bool reorg = false);

// Serves pages by request cursor. Unknown cursors answer an empty page with the same
// cursor (nothing new). Thread-safe.
class FakeProvider : public Provider {
 public:
  void SetPage(const std::string& cursor, Page page) ABSL_LOCKS_EXCLUDED(mu_);
  void SetRefusal(const std::string& cursor, Refusal refusal, int times = 1)
      ABSL_LOCKS_EXCLUDED(mu_);
  FetchResult Fetch(const std::string& committed_cursor) override ABSL_LOCKS_EXCLUDED(mu_);
  void Cancel() override { cancelled_.store(true); }
  void Close() override {}
  void DropReadAhead() override { read_ahead_drops_.fetch_add(1); }
  // Each Fetch is answered anew, as a polled provider's: a caught-up source's polls go
  // through the manager's IdlePoller.
  bool PolledPerFetch() const override { return true; }
  // What Ready() answers (false by default: the worker then publishes its unsynced pages
  // before each Fetch). True lets pages be committed while earlier ones await their sync.
  bool Ready(const std::string&) override { return ready_.load(); }
  void set_ready(bool ready) { ready_.store(ready); }
  int read_ahead_drops() const { return read_ahead_drops_.load(); }
  int fetches() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::string> requested() const ABSL_LOCKS_EXCLUDED(mu_);
  // The name of the thread that made each Fetch, in order (base/thread_name.h).
  std::vector<std::string> fetch_threads() const ABSL_LOCKS_EXCLUDED(mu_);
  // Pages fetched from now on carry a slot of `budget` when one is free (as the
  // production adapter's do; it would wait for one).
  void set_page_budget(std::shared_ptr<PageBudget> budget) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::shared_ptr<PageBudget> budget_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Page> pages_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::pair<Refusal, int>> refusals_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> requested_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> fetch_threads_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> ready_{false};
  std::atomic<int> read_ahead_drops_{0};
};

// Forwards to a provider that outlives a simulated process restart (the upstream
// provider does); Cancel and Close belong to this instance, as they would to a
// connection of the process. Thread-safe.
class ForwardingProvider : public Provider {
 public:
  explicit ForwardingProvider(Provider* target) : target_(target) {}
  FetchResult Fetch(const std::string& committed_cursor) override;
  bool Ready(const std::string& committed_cursor) override {
    return cancelled_.load() || target_->Ready(committed_cursor);
  }
  void Cancel() override { cancelled_.store(true); }
  void Close() override {}
  void DropReadAhead() override { target_->DropReadAhead(); }
  bool PolledPerFetch() const override { return target_->PolledPerFetch(); }

 private:
  Provider* const target_;
  std::atomic<bool> cancelled_{false};
};

// An external sink that dedupes on the idempotency key like a well-behaved downstream
// service, and records every call. `script` chooses the answer for (key, attempt number
// of that key); default APPLIED. Thread-safe.
class FakeSink : public ExternalSink {
 public:
  using Script = std::function<SinkAnswer(const std::string& key, int attempt)>;
  explicit FakeSink(int max_batch = 1) : max_batch_(max_batch) {}

  void SetScript(Script script) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<SinkAnswer> Deliver(absl::string_view source_id,
                                  absl::Span<const Delivery> deliveries) override
      ABSL_LOCKS_EXCLUDED(mu_);
  int max_batch() const override { return max_batch_; }
  void Cancel() override {}

  // Effects performed (first APPLIED per key): what a non-idempotent downstream would
  // have done once.
  int effects(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  int attempts(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // Keys delivered for a position ("block:index"), in order: a replay must reuse one.
  std::vector<std::string> keys_for(uint64_t block, uint64_t log_index) const
      ABSL_LOCKS_EXCLUDED(mu_);
  size_t applied_keys() const ABSL_LOCKS_EXCLUDED(mu_);
  int total_calls() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int max_batch_;
  mutable absl::Mutex mu_;
  Script script_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> effects_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> attempts_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<uint64_t, uint64_t>, std::vector<std::string>> keys_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

// A deliberately non-idempotent transactional effect: each Stage increments a durable
// counter for the event's position (kept in the outbox column family, unused by
// ungated sources), in the same batch as the receipt. Exactly-once means every counter
// ends at 1.
class CountingEffect : public TransactionalEffect {
 public:
  explicit CountingEffect(store::Store* store) : store_(store) {}
  absl::Status Stage(absl::string_view source_id, const handoff::v1::EventRow& row,
                     store::StepBatch* step) override;
  // Durable count of applications at `pos`.
  static int Count(const store::Store& store, absl::string_view source_id, Position pos);

 private:
  store::Store* const store_;
};

}  // namespace handoff::consumer::testing

#endif  // HANDOFF_CONSUMER_TESTING_FAKES_H_
