// CurlSession: one HTTP request at a time over libcurl, interruptible from another thread.
// CurlSessionPool: the idle sessions that polled requests of every source share.
//
// A session is a libcurl easy handle driven through its own multi handle, so another
// thread can interrupt a transfer (curl_multi_wakeup) and a wait for data sleeps in
// poll(). The multi handle keeps at most one idle connection: a finished transfer
// leaves its connection there for the session's next request; an unfinished one
// (interrupted, timed out, failed) closes it.
//
// Why a pool: a caught-up polling source asks every 15-30 s, longer than most servers
// keep an idle connection (5-60 s), so a session per source reconnects on almost every
// poll (TCP, and TLS over https: the costliest part of an idle poll) and holds a
// receive buffer and a socket in between. Polled requests instead lease a session for
// one request and give it back: the polls of all the sources that share a pool (in
// handoffd, every source: server/factories.cc), a few dozen a second, run over a few
// warm connections, and the idle sources hold none. The idle connections close with
// the pool, once the last provider using it is gone.
//
// Invariants: a session is used by one request at a time (its lease); the pool keeps
// at most `max_idle` idle sessions, most recently used first; a session whose owner
// asked for a fresh connection (DropConnections) opens a new one for its next request
// before it can be reused by anybody.
#ifndef HANDOFF_CONSUMER_PROVIDER_CURL_SESSION_H_
#define HANDOFF_CONSUMER_PROVIDER_CURL_SESSION_H_

#include <curl/curl.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/recycler.h"

namespace handoff::consumer {

// Thread-compatible: Run is called by one thread at a time; Wakeup from any thread.
class CurlSession {
 public:
  struct Request {
    std::string url;
    std::vector<std::string> headers;
    std::string user_agent;
    absl::Duration connect_timeout;
    absl::Duration header_timeout;     // from the start until the headers are complete
    absl::Duration body_idle_timeout;  // quiet time allowed after (see Handler::Progressed)
    // The whole transfer, however steadily bytes trickle in (polling: a slow-loris body
    // that sends a byte every second never trips the idle timeout).
    absl::Duration total_timeout = absl::InfiniteDuration();
  };
  struct Response {
    int status = 0;
    std::string content_type;  // as sent (compare case-insensitively); never logged whole
    std::optional<uint64_t> content_length;
    std::optional<absl::Duration> retry_after;
  };
  // Callbacks run on the thread that called Run. Returning false aborts the transfer.
  class Handler {
   public:
    virtual ~Handler() = default;
    virtual bool OnHeaders(const Response& response) = 0;
    virtual bool OnBody(absl::string_view chunk) = 0;
    // Whether the body made progress since the last call (resets the idle timer). Bytes
    // for a polled body; complete frames for a stream, so that a frame trickled forever
    // counts as silence.
    virtual bool Progressed() { return true; }
  };
  struct Result {
    CURLcode code = CURLE_OK;
    std::string error;               // curl's message
    bool interrupted = false;        // should_stop() became true
    bool idle_timeout = false;
    bool deadline_exceeded = false;  // total_timeout
    bool headers_done = false;
  };

  CurlSession();
  ~CurlSession();
  CurlSession(const CurlSession&) = delete;
  CurlSession& operator=(const CurlSession&) = delete;

  // False when libcurl could not allocate its handles.
  bool ok() const { return multi_ != nullptr && easy_ != nullptr; }

  // Makes a Run in progress re-evaluate should_stop now. Any thread.
  void Wakeup() { curl_multi_wakeup(multi_); }
  // The next request opens a new connection (and drops the idle one). Any thread.
  void DropConnections() { fresh_connect_.store(true); }

  // Runs one request to its end, an error, a timeout, or should_stop() (checked after
  // every wake-up, so a Wakeup() from another thread ends the transfer promptly).
  Result Run(const Request& request, Handler* handler, const std::function<bool()>& should_stop);

 private:
  struct Context;
  static size_t HeaderCallback(char* data, size_t size, size_t n, void* user);
  static size_t WriteCallback(char* data, size_t size, size_t n, void* user);

  CURLM* multi_ = nullptr;
  CURL* easy_ = nullptr;
  std::atomic<bool> fresh_connect_{false};
};

// Thread-safe. Sessions are interchangeable: a session's idle connection is reused only
// by a request to the same scheme, host and port (libcurl matches them), so a pool
// serves any number of providers; requests carry their own headers (API keys).
class CurlSessionPool {
 public:
  struct Stats {
    int64_t created = 0;  // sessions made because none was idle
    int64_t idle = 0;     // sessions idle in the pool now
  };

  explicit CurlSessionPool(size_t max_idle) : idle_(max_idle) {}

  // The most recently returned idle session, or a new one (check ok()).
  std::unique_ptr<CurlSession> Take();
  // Returns a session for reuse; beyond max_idle the least recently used is closed.
  void Give(std::unique_ptr<CurlSession> session);

  Stats stats() const;

 private:
  Recycler<CurlSession> idle_;
  std::atomic<int64_t> created_{0};
};

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_PROVIDER_CURL_SESSION_H_
