// ProviderSim: the reference event provider, serving provider-contract.md over real HTTP.
//
// Serves GET /v1/pages (polling) and GET /v1/stream (Server-Sent Events) for any
// (source, filter) of one chain from a SyntheticChain, with opaque cursors bound to the
// (chain, source, filter) triple, correction pages after reorgs, heartbeats, an optional
// bearer token, and fault knobs that tests arm from C++ or over HTTP:
//
//   POST /sim/admin/fault?kind=<name>&count=<n>        one-shot: the next n occurrences
//   POST /sim/admin/fault?kind=<name>&probability=<p>  on every request / frame
//   POST /sim/admin/faults/clear
//   POST /sim/admin/settings?retry_after=<s>&rate_limit=<s>&silence_ms=<ms>
//   POST /sim/admin/reorg?depth=<n>      POST /sim/admin/advance?blocks=<n>
//   GET  /sim/status                     {"head","epoch","safe","finalized","requests",...}
//   GET  /sim/canonical?from=&to=        {"head":..,"count":..,"items":[canonical logs]}
//
// Where a fault fires: status faults (chain_unavailable, rate_limited, resync_required,
// payment_required, server_error) answer a poll or an SSE connect with the HTTP status;
// armed while a stream is open they become an `event: error` control, after which the
// stream ends. Content faults (overlapping_page, non_advancing_cursor, out_of_order_items)
// alter the next non-empty page; truncated_body / incomplete_sse_frame send half a body
// or frame and drop the connection; drop_connection drops it; sse_silence stops writing
// for the configured silence.
//
// Thread-safe. Start() at most once; Stop() is idempotent and safe when never started.
#ifndef HANDOFF_SIM_PROVIDER_SIM_H_
#define HANDOFF_SIM_PROVIDER_SIM_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sim/cursor.h"
#include "sim/synthetic_chain.h"

namespace httplib {
class Server;
class Request;
struct Response;
class DataSink;
}  // namespace httplib

namespace handoff::sim {

enum class Fault : int {
  kTruncatedBody = 0,
  kDropConnection,
  kIncompleteSseFrame,
  kChainUnavailable,   // 503 {"error":"chain_unavailable","retry_after":N}
  kRateLimited,        // 429 Retry-After: N
  kResyncRequired,     // 409
  kPaymentRequired,    // 402 nested error with a funding action
  kServerError,        // 500
  kSseSilence,
  kOverlappingPage,    // page starts two blocks before the cursor
  kNonAdvancingCursor, // empty page, next == request cursor, although blocks exist
  kOutOfOrderItems,
  kCount,
};
constexpr int kFaultCount = static_cast<int>(Fault::kCount);

absl::string_view FaultName(Fault fault);  // e.g. "chain_unavailable"
std::optional<Fault> FaultFromName(absl::string_view name);

struct FaultSettings {
  int retry_after_seconds = 1;  // chain_unavailable body
  int rate_limit_seconds = 2;   // 429 Retry-After header
  absl::Duration silence = absl::Seconds(90);
};

struct ProviderSimOptions {
  ChainOptions chain;
  std::string chain_name = "sim";  // the only `chain` accepted (others: 400)
  // When non-empty, requests need "Authorization: Bearer <token>" (absent 401, wrong 403).
  std::string bearer_token;
  // SSE writes an empty page with an unchanged `next` after this much quiet.
  absl::Duration heartbeat = absl::Seconds(30);
  int threads = 64;  // concurrent connections (each open stream holds one)
  // An idle kept-alive connection is closed after this long (whole seconds, at least 1).
  // cpp-httplib waits for a connection's next request by polling it every ~10 ms, so
  // each idle kept-alive connection costs the simulator ~100 wakeups a second.
  absl::Duration keep_alive_timeout = absl::Seconds(60);
  std::string host = "127.0.0.1";
  // How an SSE response's body is delimited. Chunked (the default) is what most
  // servers and proxies send. Close-delimited (HTTP/1.1 lets a response without a
  // length end when the server closes the connection) writes each frame as is:
  // cpp-httplib copies every chunked write about three times to frame it, ~30% of the
  // simulator's CPU while streaming, on the cores a benchmark shares with the process
  // under test. The stream's content is the same either way.
  bool sse_close_delimited = false;
  bool decimal_strings = false;  // page numbers as "123" instead of 123
  // Polled pages: each response is held this long before it is rendered, standing in
  // for a provider farther away than loopback (the round trip). Benchmarks only.
  absl::Duration response_delay = absl::ZeroDuration();
  uint64_t fault_seed = 7;
  FaultSettings fault_settings;
};

// One request as the simulator saw it. Never holds the token.
struct RequestRecord {
  std::string path;
  std::string from;
  std::string last_event_id;
  bool has_last_event_id = false;
  bool had_authorization = false;
  bool authorized = false;
  int status = 0;
  // The client's TCP port: requests with the same port came over one connection.
  int remote_port = 0;
  // When the simulator recorded it (as the request was answered).
  absl::Time at;
};

// For a process whose main job is serving pages (the simulator binary, the benchmark
// harness hosting one): keeps freed memory mapped so that each page's ~1 MB buffers
// reuse warm memory. By default glibc returns it to the kernel after responses and the
// next page faults it back in, zeroed (perf of the simulator binary: page faults and
// madvise were a sixth of its CPU). Process-wide (mallopt); call before starting threads.
void KeepFreedMemoryForReuse();

class ProviderSim {
 public:
  explicit ProviderSim(ProviderSimOptions options);
  ~ProviderSim();
  ProviderSim(const ProviderSim&) = delete;
  ProviderSim& operator=(const ProviderSim&) = delete;

  // Binds `port` (0: any) on options.host and serves from a background thread.
  absl::StatusOr<int> Start(int port = 0);
  // Ends open streams, stops serving, joins. Idempotent.
  void Stop();

  int port() const { return port_; }
  std::string base_url() const;
  SyntheticChain& chain() { return chain_; }

  void ArmFault(Fault fault, int count = 1) ABSL_LOCKS_EXCLUDED(mu_);
  void SetFaultProbability(Fault fault, double probability) ABSL_LOCKS_EXCLUDED(mu_);
  void ClearFaults() ABSL_LOCKS_EXCLUDED(mu_);
  void SetFaultSettings(const FaultSettings& settings) ABSL_LOCKS_EXCLUDED(mu_);

  // A valid cursor for (source, filter) at `position` (tests).
  std::string EncodeCursor(absl::string_view source, absl::string_view filter,
                           CursorPosition position) const;

  std::vector<RequestRecord> Requests() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until at least `n` requests were seen (all time), or the timeout.
  bool WaitForRequests(size_t n, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  int open_streams() const { return open_streams_.load(); }

 private:
  struct Params;
  struct Stream;
  struct FaultState {
    int remaining = 0;
    double probability = 0;
  };

  void Record(RequestRecord record) ABSL_LOCKS_EXCLUDED(mu_);
  bool Fire(Fault fault) ABSL_LOCKS_EXCLUDED(mu_);
  FaultSettings Settings() const ABSL_LOCKS_EXCLUDED(mu_);
  // Fills `res` and returns false when the request is refused before any page.
  bool Admit(const httplib::Request& req, bool sse, Params* params, httplib::Response& res,
             RequestRecord* record);
  // The status fault due now, if any: (status, body, retry-after header).
  bool StatusFault(httplib::Response& res);
  std::optional<std::string> ControlFault();
  // A page's wire text in three parts: the items the chain rendered are sent as they
  // are, not copied into one body (~1 MB a page of 1000).
  struct PageText {
    std::string head;   // `before`, then the page's fields up to "items":[
    std::string items;  // PageContent::items_json
    std::string tail;   // ]} and `after`
    size_t size() const { return head.size() + items.size() + tail.size(); }
    // Writes bytes [offset, end) of the text; false when the sink refuses.
    bool Write(size_t offset, size_t end, httplib::DataSink& sink) const;
  };
  // The page's JSON, between `before` and `after` (an SSE frame's lines around it). Takes
  // the page's items.
  PageText RenderPage(PageContent& page, const std::string& next, absl::string_view before = "",
                      absl::string_view after = "") const;
  void HandlePages(const httplib::Request& req, httplib::Response& res);
  void HandleStream(const httplib::Request& req, httplib::Response& res);
  bool StreamStep(Stream& stream, httplib::DataSink& sink);
  // Returns false when Stop() cut the sleep short.
  bool SleepUnlessStopping(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);
  void HandleAdmin(const httplib::Request& req, httplib::Response& res);

  // Constant after construction.
  const ProviderSimOptions options_;
  const CursorCodec codec_;
  SyntheticChain chain_;
  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
  int port_ = 0;

  std::atomic<bool> stopping_{false};
  std::atomic<int> open_streams_{0};

  mutable absl::Mutex mu_;
  std::array<FaultState, kFaultCount> faults_ ABSL_GUARDED_BY(mu_);
  FaultSettings settings_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::deque<RequestRecord> requests_ ABSL_GUARDED_BY(mu_);
  size_t request_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace handoff::sim

#endif  // HANDOFF_SIM_PROVIDER_SIM_H_
