#include "consumer/provider/curl_session.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"

namespace handoff::consumer {
namespace {

std::optional<absl::Duration> ParseRetryAfterHeader(absl::string_view v) {
  v = absl::StripAsciiWhitespace(v);
  int64_t seconds = 0;
  if (absl::SimpleAtoi(v, &seconds)) return absl::Seconds(std::max<int64_t>(0, seconds));
  std::string date(v);
  time_t when = curl_getdate(date.c_str(), nullptr);
  if (when < 0) return std::nullopt;
  return std::max(absl::ZeroDuration(), absl::FromTimeT(when) - absl::Now());
}

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace

struct CurlSession::Context {
  Handler* handler = nullptr;
  Response response;
  bool headers_done = false;
  absl::Time last_activity;
};

CurlSession::CurlSession() {
  InitCurlOnce();
  multi_ = curl_multi_init();
  easy_ = curl_easy_init();
  curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS, 1L);
  if (easy_ == nullptr) return;
  curl_easy_setopt(easy_, CURLOPT_HTTPGET, 1L);
  curl_easy_setopt(easy_, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy_, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(easy_, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(easy_, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(easy_, CURLOPT_TCP_NODELAY, 1L);
  // Behind a proxy (https_proxy), its answer to CONNECT ("200 Connection established")
  // is not the provider's response: keep it from the header callback.
  curl_easy_setopt(easy_, CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
  // Set once: curl_easy_reset would free and reallocate this buffer every request.
  curl_easy_setopt(easy_, CURLOPT_BUFFERSIZE, 256L * 1024);
  curl_easy_setopt(easy_, CURLOPT_WRITEFUNCTION, &CurlSession::WriteCallback);
  curl_easy_setopt(easy_, CURLOPT_HEADERFUNCTION, &CurlSession::HeaderCallback);
}

CurlSession::~CurlSession() {
  curl_easy_cleanup(easy_);
  curl_multi_cleanup(multi_);
}

CurlSession::Result CurlSession::Run(const Request& request, Handler* handler,
                                     const std::function<bool()>& should_stop) {
  Context ctx;
  ctx.handler = handler;
  ctx.last_activity = absl::Now();
  const absl::Time start = ctx.last_activity;
  curl_slist* headers = nullptr;
  for (const std::string& h : request.headers) headers = curl_slist_append(headers, h.c_str());
  char error[CURL_ERROR_SIZE] = {0};
  // The options every request shares were set once (constructor); the handle is
  // reused so that its connection and buffers are too.
  curl_easy_setopt(easy_, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(easy_, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(easy_, CURLOPT_USERAGENT, request.user_agent.c_str());
  curl_easy_setopt(easy_, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(request.connect_timeout)));
  curl_easy_setopt(easy_, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(easy_, CURLOPT_WRITEDATA, &ctx);
  curl_easy_setopt(easy_, CURLOPT_HEADERDATA, &ctx);
  curl_easy_setopt(easy_, CURLOPT_FRESH_CONNECT, fresh_connect_.exchange(false) ? 1L : 0L);

  Result result;
  curl_multi_add_handle(multi_, easy_);
  bool done = false;
  while (true) {
    int running = 0;
    CURLMcode mc = curl_multi_perform(multi_, &running);
    if (mc != CURLM_OK) {
      result.code = CURLE_RECV_ERROR;
      result.error = curl_multi_strerror(mc);
      break;
    }
    if (running == 0) {
      done = true;
      break;
    }
    if (should_stop()) {
      result.interrupted = true;
      break;
    }
    // Headers must complete within header_timeout of the start (a flood of header
    // lines, or one trickled byte by byte, does not extend it).
    const absl::Time now = absl::Now();
    absl::Duration left = ctx.headers_done
                              ? ctx.last_activity + request.body_idle_timeout - now
                              : start + request.header_timeout - now;
    if (left <= absl::ZeroDuration()) {
      result.idle_timeout = true;
      break;
    }
    const absl::Duration total_left = start + request.total_timeout - now;
    if (total_left <= absl::ZeroDuration()) {
      result.deadline_exceeded = true;
      break;
    }
    left = std::min(left, total_left);
    int timeout_ms = static_cast<int>(
        std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 60 * 1000));
    curl_multi_poll(multi_, nullptr, 0, timeout_ms, nullptr);
  }
  if (done) {
    int queued = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi_, &queued)) {
      if (msg->msg == CURLMSG_DONE && msg->easy_handle == easy_) result.code = msg->data.result;
    }
    if (result.code != CURLE_OK) result.error = error[0] ? error : curl_easy_strerror(result.code);
    if (result.code == CURLE_OUT_OF_MEMORY && !ctx.headers_done) {
      // libcurl's cap on one response header (100 KiB), not this process's memory.
      result.error = "a response header is larger than libcurl accepts (100 KiB)";
    }
  }
  // Removing an unfinished transfer closes its connection; a finished one is kept.
  curl_multi_remove_handle(multi_, easy_);
  curl_easy_setopt(easy_, CURLOPT_ERRORBUFFER, nullptr);
  curl_slist_free_all(headers);
  result.headers_done = ctx.headers_done;
  return result;
}

size_t CurlSession::HeaderCallback(char* data, size_t size, size_t n, void* user) {
  auto* ctx = static_cast<Context*>(user);
  const size_t len = size * n;
  ctx->last_activity = absl::Now();
  absl::string_view line(data, len);
  line = absl::StripTrailingAsciiWhitespace(line);
  if (absl::StartsWith(line, "HTTP/")) {
    // A new response: an interim one (1xx) or a proxy's went before it. Only the last
    // response's status and headers count, so they start over here.
    ctx->response = Response();
    ctx->headers_done = false;
    size_t sp = line.find(' ');
    if (sp != absl::string_view::npos) {
      // Exactly three digits, then a space or the end ("2000" or "20x" is no status).
      absl::string_view code = line.substr(sp + 1);
      code = code.substr(0, code.find(' '));
      int status = 0;
      if (code.size() == 3 && std::all_of(code.begin(), code.end(), absl::ascii_isdigit) &&
          absl::SimpleAtoi(code, &status)) {
        ctx->response.status = status;
      }
    }
    return len;
  }
  if (line.empty()) {
    if (ctx->response.status >= 200 && !ctx->headers_done) {
      ctx->headers_done = true;
      if (!ctx->handler->OnHeaders(ctx->response)) return 0;
    }
    return len;
  }
  size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return len;
  std::string name = absl::AsciiStrToLower(line.substr(0, colon));
  absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
  if (name == "content-type") {
    // As sent (case kept): it is the provider's text, which may echo the API key, and a
    // lowercased copy would hide a mixed-case key from redaction.
    ctx->response.content_type = std::string(value);
  } else if (name == "content-length") {
    uint64_t v = 0;
    if (absl::SimpleAtoi(value, &v)) ctx->response.content_length = v;
  } else if (name == "retry-after") {
    ctx->response.retry_after = ParseRetryAfterHeader(value);
  }
  return len;
}

size_t CurlSession::WriteCallback(char* data, size_t size, size_t n, void* user) {
  auto* ctx = static_cast<Context*>(user);
  const size_t len = size * n;
  if (!ctx->headers_done) {  // e.g. HTTP/0.9 or a missing blank line
    ctx->headers_done = true;
    if (!ctx->handler->OnHeaders(ctx->response)) return 0;
  }
  bool ok = ctx->handler->OnBody(absl::string_view(data, len));
  // After OnBody: time blocked there is not silence.
  if (ctx->handler->Progressed()) ctx->last_activity = absl::Now();
  return ok ? len : 0;
}

std::unique_ptr<CurlSession> CurlSessionPool::Take() {
  std::unique_ptr<CurlSession> session = idle_.Take();
  if (session != nullptr) return session;
  created_.fetch_add(1, std::memory_order_relaxed);
  return std::make_unique<CurlSession>();
}

void CurlSessionPool::Give(std::unique_ptr<CurlSession> session) {
  if (session == nullptr || !session->ok()) return;
  idle_.Give(std::move(session));
}

CurlSessionPool::Stats CurlSessionPool::stats() const {
  Stats s;
  s.created = created_.load(std::memory_order_relaxed);
  s.idle = static_cast<int64_t>(idle_.held());
  return s;
}

}  // namespace handoff::consumer
