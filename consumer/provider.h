// Provider: the consumer's side of the event provider contract.
//
// A Provider fetches one complete page for a committed cursor, or reports a classified
// refusal. It never decides what is committed: the engine passes the committed resume
// cursor on every Fetch, and a streaming provider that is positioned elsewhere (it
// received frames beyond what was committed) reconnects from the cursor it was given,
// never from an id it merely received.
//
// Thread-compatible: one worker thread calls Fetch; Cancel and Close may be called from
// any thread to unblock it.
#ifndef HANDOFF_CONSUMER_PROVIDER_H_
#define HANDOFF_CONSUMER_PROVIDER_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "consumer/page.h"

namespace handoff::consumer {

// How the consumer must react to a failed fetch (provider-contract.md, "Refusals").
enum class RefusalKind {
  // 503 chain_unavailable (retry_after) or 429 rate_limited (Retry-After): wait the
  // given delay (up to an hour, BackoffPolicy::max_requested), then retry from the
  // committed cursor.
  kRetryAfter,
  // Other 5xx, timeouts, resets, truncated bodies or frames, SSE silence: capped
  // exponential backoff with jitter, then retry from the committed cursor.
  kTransient,
  // A complete 200 response that is not a valid page (bad JSON, a missing or mistyped
  // field): retried with backoff, and halts as PROTOCOL_VIOLATION if it persists.
  kMalformedPage,
  // 409 resync_required: halt; an operator rebuilds from a numeric block.
  kResyncRequired,
  // 409 cursor_mismatch, 400 invalid_request, an unreadable API key: halt.
  kConfigInvalid,
  // 401, 403: halt.
  kAuthFailed,
  // 402 payment_required / insufficient_credit: halt, keep the funding action.
  kFundingRequired,
  // Cancel() was called.
  kCancelled,
};

struct Refusal {
  RefusalKind kind = RefusalKind::kTransient;
  int http_status = 0;       // 0 for network failures and SSE controls without status
  std::string code;          // the provider's error code, e.g. "chain_unavailable"
  std::string message;       // human readable; never contains a secret
  std::optional<absl::Duration> retry_after;
  // For kFundingRequired: {"next_action":…, "challenges":…, "credit":…} as JSON. Kept
  // for operators, never logged.
  std::string funding_action_json;
};

// Exactly one of `page` and `refusal` is set.
struct FetchResult {
  std::optional<Page> page;
  std::optional<Refusal> refusal;

  static FetchResult Of(Page p) {
    FetchResult r;
    r.page = std::move(p);
    return r;
  }
  static FetchResult Refused(Refusal f) {
    FetchResult r;
    r.refusal = std::move(f);
    return r;
  }
};

// The cursor of a source started at the provider's head. It names a newer page each time
// it is asked for: the worker pins a first page fetched with it to the page's own start
// block before applying anything of it (SourceWorker::IngestLoop).
inline constexpr char kLatestCursor[] = "latest";

class Provider {
 public:
  virtual ~Provider() = default;

  // Fetches the page that follows `committed_cursor` (an opaque cursor from an earlier
  // page's `next`, or the decimal start block, or "latest" for a first fetch).
  // Blocks until a complete page, a refusal, or Cancel().
  virtual FetchResult Fetch(const std::string& committed_cursor) = 0;

  // True when Fetch(committed_cursor) would not wait for news upstream: its page (or
  // refusal) is here, or its request (out already, or a poll sent now) answers within
  // one exchange. The worker publishes its last page before a Fetch that could wait
  // longer (an SSE stream at the head waits for the next block); before one that would
  // not, the page's sync overlaps the fetch. False when unsure.
  virtual bool Ready(const std::string& committed_cursor) { return false; }

  // Unblocks a Fetch in progress (it returns kCancelled) and makes later Fetches return
  // kCancelled at once. Safe from any thread, idempotent.
  virtual void Cancel() = 0;

  // Drops any open connection (after a storage failure, or before reconnecting).
  // The next Fetch reconnects from the cursor it is given.
  virtual void Close() = 0;

  // Discards the pages fetched ahead of the engine (a prefetch, SSE-buffered pages) and
  // stops fetching ahead until the next Fetch: the worker is about to wait a long time
  // (an operator's hold, a retry), and those pages would hold PageBudget slots that
  // other sources need. Called on the Fetch thread. The next Fetch asks again.
  virtual void DropReadAhead() {}

  // True when each Fetch asks the provider anew (polling), so that any thread may make a
  // caught-up source's next Fetch while its worker waits (IdlePoller); false for a
  // stream, whose next page arrives on a connection it holds open.
  virtual bool PolledPerFetch() const { return false; }
};

// Forwards every call to the provider it owns: the base of a decorator that watches or
// changes a few calls (it overrides those, calling inner() for the rest of the work), so
// that a call added to Provider is forwarded in one place.
class ProviderDecorator : public Provider {
 public:
  explicit ProviderDecorator(std::unique_ptr<Provider> inner) : inner_(std::move(inner)) {}

  FetchResult Fetch(const std::string& committed_cursor) override {
    return inner_->Fetch(committed_cursor);
  }
  bool Ready(const std::string& committed_cursor) override {
    return inner_->Ready(committed_cursor);
  }
  void Cancel() override { inner_->Cancel(); }
  void Close() override { inner_->Close(); }
  void DropReadAhead() override { inner_->DropReadAhead(); }
  bool PolledPerFetch() const override { return inner_->PolledPerFetch(); }

 protected:
  Provider& inner() { return *inner_; }

 private:
  const std::unique_ptr<Provider> inner_;
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_PROVIDER_H_
