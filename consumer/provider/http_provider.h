// HttpProvider: the consumer::Provider that speaks provider-contract.md over libcurl.
//
// Polling (TRANSPORT_POLL): every Fetch(c) is one GET {base}/v1/pages?...&from=c, parsed
// on the calling thread, over a CurlSession leased from a CurlSessionPool for that one
// request (curl_session.h): the polls of the sources sharing a pool share a few warm
// connections, and no source holds one between its polls, not even one catching up
// (64 sources catching up held 64 connections, each kept alive by the provider, where
// about a third of them have a request in flight at a time: bench/HISTORY.md item 61).
// Prefetch (poll_prefetch): when Fetch(c) returns a page whose `next` N differs from c,
// a helper thread at once requests and parses the page for N, then the one after it,
// keeping at most kPrefetchDepth (2) pages fetched ahead of the engine, each under a
// page slot taken only when one is free; so fetching and parsing overlap the engine's
// commits, and the provider renders a page while the one before it is parsed. A
// speculative page is only handed out by a later Fetch(N), that is, once the engine has
// durably committed N as its resume cursor (the barrier); any other Fetch(c') (a failed
// or lost commit rereads an older cursor) or a Close() discards the chain, and so does
// age (a prefetched page older than `max_prefetch_age` is fetched again). A refusal ends
// the chain and is the answer to its request: Fetch(N) returns it as a Fetch of its own
// would have (it is not asked again at once, whatever its age). Nothing of a
// speculative page is published or applied before its cursor is committed, so "the next
// request only after the page is committed" still holds for everything the engine acts
// on; the provider merely sees the read earlier.
// SSE (TRANSPORT_SSE): a reader thread holds GET {base}/v1/stream open, parses frames
// and pages as they arrive, and buffers at most `sse_buffered_pages` pages ahead (then
// stops reading the socket), so fetching and parsing overlap the engine's commit.
//
// Invariants:
//  - A page is only returned whole: a truncated body, an incomplete frame or a dropped
//    stream is discarded and reported as a kTransient refusal.
//  - The stream is only trusted while it continues from the committed cursor: Fetch(c)
//    with c different from the `next` of the last page it returned (or the cursor the
//    stream was opened from) drops the connection and reconnects from c. After any
//    refusal the next Fetch reconnects. "latest" is sent as from=latest without a
//    Last-Event-ID header; any other cursor as both from= and Last-Event-ID.
//  - The API key only ever goes into the Authorization header: it is never logged and
//    is scrubbed from every Refusal, also in its JSON spelling and before a provider's
//    message is cut (no part of it is left at the cut).
//  - A body or frame larger than max_page_bytes is refused as kMalformedPage (code
//    "page_too_large": the same cursor would get the same page, so this must not be
//    retried forever like a transient failure) and its transfer is aborted at once
//    (a Content-Length above the limit aborts before any body byte is read).
//  - A refused status (3xx-5xx) whose headers arrived is the provider's answer even when
//    its body is then cut, stalls or is capped: it is classified by its status and
//    Retry-After header (ClassifyRefusal's `body_cut`), never retried as a network failure.
//  - Refusal mapping (the contract's table): 503 chain_unavailable and 429 => kRetryAfter
//    (retry_after from the body, or the Retry-After header); other 5xx, 408, timeouts,
//    resets, truncation, SSE silence => kTransient; 409 resync_required =>
//    kResyncRequired; 409 cursor_mismatch, 400 and other 4xx => kConfigInvalid; 401/403
//    => kAuthFailed; 402 => kFundingRequired with funding_action_json = {"next_action",
//    "challenges","credit"}. SSE `event: error` controls map by their code likewise.
//
// Thread-compatible per the Provider contract: one thread calls Fetch; Cancel and Close
// may be called from any thread and unblock it promptly (curl_multi_wakeup and a
// condition; a waiting Fetch or reader sleeps in poll()/a condition, using no CPU).
#ifndef HANDOFF_CONSUMER_PROVIDER_HTTP_PROVIDER_H_
#define HANDOFF_CONSUMER_PROVIDER_HTTP_PROVIDER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "consumer/page_budget.h"
#include "consumer/provider.h"
#include "consumer/provider/page_parser.h"
#include "consumer/reusable_thread.h"
#include "handoff/v1/source.pb.h"

namespace handoff::consumer {

class CurlSessionPool;  // curl_session.h

struct HttpProviderOptions {
  std::string base_url;  // "http://127.0.0.1:8545" (a trailing '/' is ignored)
  std::string chain;
  std::string source;
  std::string filter;
  uint32_t page_limit = 1000;  // 1..1000
  handoff::v1::Transport transport = handoff::v1::TRANSPORT_POLL;
  // The resolved API key; empty: no Authorization header.
  std::string api_key;
  absl::Duration connect_timeout = absl::Seconds(10);
  // Polling: longest wait for a response's headers (from the request, however many header
  // lines trickle in) and longest quiet time between body bytes.
  absl::Duration read_timeout = absl::Seconds(30);
  // Polling: longest time for one whole response, so that a body trickled a byte at a
  // time (slow loris) cannot hold the worker forever. kTransient "timeout" beyond it.
  absl::Duration response_timeout = absl::Minutes(5);
  size_t max_page_bytes = 64u << 20;
  // An open stream that completes no frame for this long is dropped (kTransient), even
  // if bytes keep trickling in (a frame that never ends); also the longest wait for the
  // stream's headers, which a provider may send with its first frame.
  absl::Duration sse_silence_timeout = absl::Seconds(60);
  // Pages the SSE reader may hold ahead of Fetch (at least 1).
  size_t sse_buffered_pages = 2;
  // Polling: prefetch the next page while the current one commits (see above).
  bool poll_prefetch = true;
  // Polling: a prefetched page older than this is fetched again, and the chain stops
  // waiting this long for room to fetch the next.
  absl::Duration max_prefetch_age = absl::Seconds(5);
  // Where polled requests lease their sessions, shared by the providers that should
  // share warm connections (handoffd: all of them). nullptr: a pool of one session of
  // this provider's own, closed with it.
  std::shared_ptr<CurlSessionPool> session_pool;
  // The process-wide cap on pages held (consumer/page_budget.h), shared by the providers
  // of every source (handoffd: all of them). Every page is fetched under a slot of it
  // and carries the slot until destroyed; receive buffers come with the slots. A Fetch
  // with no prefetched page waits (first come, first served) for a slot; a prefetch or
  // an SSE page is only started or queued under one, the prefetch only if one is free
  // at once. nullptr: an uncapped budget of this provider's own (buffers reused, no cap).
  std::shared_ptr<PageBudget> page_budget;
  std::string user_agent = "handoff/1";
};

// The adapter options a source spec implies: base URL, chain, source, filter, page
// limit and transport (the API key is resolved by the caller, timeouts keep defaults).
HttpProviderOptions OptionsForSpec(const handoff::v1::SourceSpec& spec);

// HttpProvider::Create, as the Provider a SourceManager factory returns.
absl::StatusOr<std::unique_ptr<Provider>> MakeHttpProvider(HttpProviderOptions options);

// Maps a refused HTTP response (status != 200) or, with http_status 0, an SSE
// `event: error` control's data to a Refusal. Exposed for tests. `secret` (the API key;
// empty: none) is redacted from the provider's text, as is and in its JSON spelling,
// before that text is cut to its 300 bytes, and no start of it is left at the cut. The
// provider's code is kept to 64 bytes of [A-Za-z0-9_.:-] (others become '_').
// `body_cut`: only the start of the body arrived (the transfer failed, stalled or was
// capped after the status and headers): the code it began with counts, else the status's
// default code (400 invalid_request, 401 unauthorized, 402 payment_required, 403
// forbidden, 409 resync_required, 429 rate_limited, 503 chain_unavailable).
Refusal ClassifyRefusal(int http_status, absl::string_view body,
                        std::optional<absl::Duration> retry_after_header,
                        std::optional<int64_t> sse_retry_ms, absl::string_view secret = {},
                        bool body_cut = false);

class CurlSession;

class HttpProvider : public Provider {
 public:
  // Validates the options (kInvalidArgument) and sets up libcurl.
  static absl::StatusOr<std::unique_ptr<HttpProvider>> Create(HttpProviderOptions options);
  ~HttpProvider() override;

  FetchResult Fetch(const std::string& committed_cursor) override;
  // Polling: no prefetch runs (Fetch polls now: one exchange, bounded by the request
  // timeouts, after a page slot's wait), or the prefetch of `committed_cursor` has
  // finished or is in flight. SSE: the stream continues from it and a page or refusal
  // is buffered. Called on the Fetch thread.
  bool Ready(const std::string& committed_cursor) override;
  void Cancel() override;
  void Close() override;
  // Polling: ends a prefetch in flight and drops its page. SSE: closes the stream and
  // drops the buffered pages (the next Fetch reconnects from its cursor).
  void DropReadAhead() override;
  bool PolledPerFetch() const override {
    return options_.transport != handoff::v1::TRANSPORT_SSE;
  }

 private:
  struct StreamItem {
    std::optional<Page> page;
    std::optional<Refusal> refusal;
  };

  explicit HttpProvider(HttpProviderOptions options);

  // base_url + path + the source's query up to "&from=" (only the cursor varies).
  std::string UrlPrefix(absl::string_view path) const;
  FetchResult FetchPoll(const std::string& cursor);
  // One polled request and its parse. Runs on the Fetch thread or the prefetch thread,
  // never both at once (FetchPoll joins the prefetch first).
  // Leases the session (the held one, else one from the pool) and gives it back after.
  // The page, if any, carries `slot`; its receive buffer is the slot's, given back once
  // the body is parsed.
  FetchResult PollOnce(const std::string& cursor, const std::atomic<bool>* stop,
                       PageSlot slot);
  FetchResult PollWith(CurlSession* session, const std::string& cursor,
                       const std::atomic<bool>* stop, PageSlot slot);
  // Interrupts the polled request in flight, if any, and the stream's transfer.
  void WakeTransfers() ABSL_LOCKS_EXCLUDED(poll_mu_);
  // The chain's result for `cursor`, if it is the chain's next and still usable (waited
  // for while in flight): a page, or the refusal its request got; otherwise nullopt, and
  // the chain is stopped and its pages dropped, and the Fetch thread polls itself.
  // Called on the Fetch thread only.
  std::optional<FetchResult> TakePrefetch(const std::string& cursor);
  // Starts the prefetch chain at `cursor` (its first page under `slot`).
  // REQUIRES: no chain running (!prefetch_.busy()).
  void StartPrefetch(const std::string& cursor, PageSlot slot);
  // The chain (on the prefetch thread): fetches `cursor`, then each page's next while
  // fewer than kPrefetchDepth pages wait and a slot is free.
  void RunPrefetchChain(std::string cursor, PageSlot slot) ABSL_LOCKS_EXCLUDED(prefetch_mu_);
  // Ends the chain, if any, and drops its pages. Fetch thread.
  void StopPrefetch() ABSL_LOCKS_EXCLUDED(prefetch_mu_);
  FetchResult FetchStream(const std::string& cursor);
  void ReaderMain(std::string cursor, uint64_t stream_id);
  // The reader must stop: Close or a reconnect asked it to, or the provider is cancelled.
  bool ReaderStopped() const { return stop_reader_.load() || cancelled_.load(); }
  // The reader's two steps for a frame of data: wait for room in the queue and a page
  // slot (nullopt once the reader must stop), then, the frame parsed under that slot,
  // queue the page (false once the reader must stop).
  std::optional<PageSlot> ReserveForPage(uint64_t stream_id) ABSL_LOCKS_EXCLUDED(mu_);
  bool PushPage(Page page, uint64_t stream_id) ABSL_LOCKS_EXCLUDED(mu_);
  void PushTerminal(Refusal refusal, uint64_t stream_id) ABSL_LOCKS_EXCLUDED(mu_);
  void StopReader() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_mu_);
  void StartReader(const std::string& cursor) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_mu_);
  Refusal Scrub(Refusal r) const;
  static FetchResult Transient(std::string code, std::string message);
  static FetchResult Cancelled();

  // Constant after construction.
  const HttpProviderOptions options_;
  const std::string base_;  // base_url without a trailing '/'
  const std::shared_ptr<CurlSessionPool> pool_;
  const std::shared_ptr<PageBudget> budget_;
  // SSE only (nullptr when polling): the reader's session, the stream's connection.
  const std::unique_ptr<CurlSession> stream_session_;
  const std::string pages_url_;
  const std::string stream_url_;

  // The pool session of the polled request in flight (Fetch or prefetch thread), so
  // that Cancel/Close/TakePrefetch can interrupt it.
  absl::Mutex poll_mu_;
  CurlSession* poll_session_ ABSL_GUARDED_BY(poll_mu_) = nullptr;
  // Set by Close(): the next polled request opens a new connection.
  std::atomic<bool> fresh_poll_connection_{false};

  std::atomic<bool> cancelled_{false};
  std::atomic<uint64_t> close_generation_{0};
  std::atomic<bool> stop_reader_{false};

  // Used only by the thread that calls Fetch (polling), or by the prefetch thread while
  // the Fetch thread is elsewhere (handed over by prefetch_.Run() and Wait()).
  PageParser poll_parser_;
  uint64_t prefetch_generation_ = 0;  // close_generation_ when the chain started
  std::atomic<bool> stop_prefetch_{false};
  // The prefetch chain's pages, shared by the prefetch thread (which adds them) and the
  // Fetch thread (which takes them in order).
  struct Prefetched {
    std::string cursor;  // the page's `from` cursor
    absl::Time started;  // when its request went out
    FetchResult result;
  };
  absl::Mutex prefetch_mu_;
  std::deque<Prefetched> prefetched_ ABSL_GUARDED_BY(prefetch_mu_);
  std::string fetching_cursor_ ABSL_GUARDED_BY(prefetch_mu_);  // in flight now, or empty
  bool chain_ended_ ABSL_GUARDED_BY(prefetch_mu_) = false;     // the chain's thread is done
  bool chain_stop_ ABSL_GUARDED_BY(prefetch_mu_) = false;      // StopPrefetch asked it to end
  // Runs the prefetch (declared last among these: destroyed first, it waits for a
  // prefetch in flight before the state that prefetch writes goes away).
  ReusableThread prefetch_;

  // Serialises starting and stopping the SSE reader (Fetch vs Close).
  absl::Mutex lifecycle_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::thread reader_ ABSL_GUARDED_BY(lifecycle_mu_);

  mutable absl::Mutex mu_;
  std::deque<StreamItem> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t stream_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stream_usable_ ABSL_GUARDED_BY(mu_) = false;
  // The cursor the stream continues from: the `next` of the last page handed out.
  std::string position_ ABSL_GUARDED_BY(mu_);
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_PROVIDER_HTTP_PROVIDER_H_
