#include "consumer/provider/http_provider.h"

#include <curl/curl.h>
#include <simdjson.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "consumer/provider/curl_session.h"
#include "consumer/provider/sse_parser.h"

namespace handoff::consumer {
namespace {

constexpr size_t kMaxErrorBody = 64 * 1024;
// Polled pages fetched ahead of the one the engine asked for last, at most.
constexpr size_t kPrefetchDepth = 2;
constexpr size_t kMaxMessage = 300;
constexpr char kRedacted[] = "[redacted]";
// A message may not end in this many or more leading bytes of the secret (a cut, ours
// or the provider's, inside it). Shorter ends are too common in text to mean anything.
constexpr size_t kMinSecretFragment = 4;

std::string UrlEscape(absl::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

// `secret` as a JSON string re-serialised by simdjson spells it (the funding action is
// minified from the parsed body): `"` and `\` escaped, control bytes as \b \f \n \r \t
// or \u00XX. Empty when that is the secret itself, or it is not valid UTF-8.
std::string JsonSpelling(absl::string_view secret) {
  bool plain = true;
  for (unsigned char c : secret) plain &= c >= 0x20 && c != '"' && c != '\\';
  if (plain) return "";
  // Any valid escaping will do here: simdjson reads it and writes its own.
  static constexpr char kHex[] = "0123456789abcdef";
  std::string literal = "[\"";
  for (unsigned char c : secret) {
    if (c == '"' || c == '\\') {
      literal.push_back('\\');
      literal.push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      absl::StrAppend(&literal, "\\u00", std::string(1, kHex[c >> 4]),
                      std::string(1, kHex[c & 15]));
    } else {
      literal.push_back(static_cast<char>(c));
    }
  }
  literal += "\"]";
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(literal).get(doc) != simdjson::SUCCESS) return "";
  const std::string minified = simdjson::minify(doc);  // ["..."]
  if (minified.size() < 4) return "";
  return minified.substr(2, minified.size() - 4);
}

// Replaces every occurrence of `secret`, as is or in its JSON spelling, in `*text`.
void Redact(absl::string_view secret, std::string* text) {
  if (secret.empty()) return;
  absl::StrReplaceAll({{secret, kRedacted}}, text);
  const std::string spelled = JsonSpelling(secret);
  if (!spelled.empty()) absl::StrReplaceAll({{spelled, kRedacted}}, text);
}

// Redacts `secret` in the whole of `*text`, then cuts it to at most `max` bytes (at a
// UTF-8 character boundary), then redacts a start of the secret left at its end (the
// marker may end a few bytes past `max`): a secret the provider cut itself leaves no
// part of it behind either.
void RedactAndCut(absl::string_view secret, size_t max, std::string* text) {
  Redact(secret, text);
  if (text->size() > max) {
    size_t end = max;
    while (end > 0 && (static_cast<unsigned char>((*text)[end]) & 0xC0) == 0x80) --end;
    text->resize(end);
  }
  if (secret.empty()) return;
  const std::string spelled = JsonSpelling(secret);
  for (absl::string_view form : {secret, absl::string_view(spelled)}) {
    for (size_t n = std::min(form.size(), text->size()); n >= kMinSecretFragment; --n) {
      if (absl::EndsWith(*text, form.substr(0, n))) {
        text->replace(text->size() - n, n, kRedacted);
        break;
      }
    }
  }
}

// The provider's `error` code as a Refusal keeps it (it reaches last_error, logs and the
// engine's reasons): the secret redacted, whole and any start of it left at the cut, then
// cut to kMaxCode bytes (a redaction marker past the cut is cut too) and every byte
// outside [A-Za-z0-9_.:-] and the marker's brackets replaced by '_'.
constexpr size_t kMaxCode = 64;
std::string SafeCode(std::string code, absl::string_view secret) {
  RedactAndCut(secret, kMaxCode, &code);
  if (code.size() > kMaxCode) code.resize(kMaxCode);
  for (char& c : code) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        absl::string_view("_-.:[]").find(c) == absl::string_view::npos) {
      c = '_';
    }
  }
  return code;
}

// Whether `text` and `secret` share kMinSecretFragment or more consecutive bytes, in any
// letter case.
bool SharesSecretFragment(absl::string_view text, absl::string_view secret) {
  if (secret.size() < kMinSecretFragment) return false;
  const std::string lower_text = absl::AsciiStrToLower(text);
  const std::string lower_secret = absl::AsciiStrToLower(secret);
  for (size_t i = 0; i + kMinSecretFragment <= lower_secret.size(); ++i) {
    if (absl::StrContains(lower_text, lower_secret.substr(i, kMinSecretFragment))) return true;
  }
  return false;
}

// A Content-Type the provider sent, for a refusal's message. The header is the
// provider's text and may echo the API key (in another case, or cut by a length limit
// inside it, where no redaction of the whole key finds it), so only its media type is
// shown, lowercased, and only when that is a short `type/subtype` of token characters
// sharing no kMinSecretFragment bytes with the key in any case; otherwise nothing of it.
std::string ShownContentType(absl::string_view content_type, absl::string_view secret) {
  absl::string_view media = content_type.substr(0, content_type.find(';'));
  media = absl::StripAsciiWhitespace(media);
  if (media.empty()) return "no Content-Type";
  constexpr size_t kMaxShown = 64;
  bool shown = media.size() <= kMaxShown && std::count(media.begin(), media.end(), '/') == 1 &&
               media.front() != '/' && media.back() != '/';
  for (char c : media) {
    shown &= absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
             absl::string_view("/!#$&^_.+-").find(c) != absl::string_view::npos;
  }
  if (!shown || SharesSecretFragment(media, secret)) return "another Content-Type (not shown)";
  return absl::StrCat("'", absl::AsciiStrToLower(media), "'");
}

// The code a cut JSON refusal body began with, as the contract's bodies begin:
// `{"error":"<code>"` or `{"error":{"code":"<code>"`. Empty when the cut came first (or
// the body begins otherwise).
std::string LeadingErrorCode(absl::string_view body) {
  auto take = [&body](absl::string_view token) {
    while (!body.empty() && absl::ascii_isspace(static_cast<unsigned char>(body[0]))) {
      body.remove_prefix(1);
    }
    if (!absl::StartsWith(body, token)) return false;
    body.remove_prefix(token.size());
    return true;
  };
  if (!take("{") || !take("\"error\"") || !take(":")) return "";
  if (take("{") && (!take("\"code\"") || !take(":"))) return "";
  if (!take("\"")) return "";
  const size_t end = body.find('"');
  if (end == absl::string_view::npos || end == 0 || end > kMaxCode) return "";
  for (char c : body.substr(0, end)) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' &&
        c != '.') {
      return "";
    }
  }
  return std::string(body.substr(0, end));
}

// The code a refused status means when its body did not say (it was cut first). A 409
// has two codes, both of which stop the source; resync_required is the one that names
// what an operator does next (rebuild from a numeric start block).
std::string DefaultErrorCode(int http_status) {
  switch (http_status) {
    case 400:
      return "invalid_request";
    case 401:
      return "unauthorized";
    case 402:
      return "payment_required";
    case 403:
      return "forbidden";
    case 409:
      return "resync_required";
    case 429:
      return "rate_limited";
    case 503:
      return "chain_unavailable";
    default:
      return "";
  }
}

}  // namespace

Refusal ClassifyRefusal(int http_status, absl::string_view body,
                        std::optional<absl::Duration> retry_after_header,
                        std::optional<int64_t> sse_retry_ms, absl::string_view secret,
                        bool body_cut) {
  Refusal r;
  r.http_status = http_status;
  std::string provider_message;
  std::optional<absl::Duration> body_retry_after;
  bool nested = false;
  // Best effort: a refusal body that is not JSON still maps by its status.
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  const bool parsed = !body.empty() && body.size() <= kMaxErrorBody &&
                      parser.parse(body.data(), body.size(), true).get(doc) == simdjson::SUCCESS;
  if (!parsed && body_cut) {
    // Only the start arrived: the code it began with, else what the status means.
    r.code = LeadingErrorCode(body);
    if (r.code.empty()) r.code = DefaultErrorCode(http_status);
  }
  if (parsed) {
    simdjson::dom::element error;
    if (doc["error"].get(error) == simdjson::SUCCESS) {
      std::string_view s;
      if (error.get_string().get(s) == simdjson::SUCCESS) {
        r.code = std::string(s);
      } else if (error.is_object()) {
        nested = true;
        if (error["code"].get_string().get(s) == simdjson::SUCCESS) r.code = std::string(s);
        if (error["message"].get_string().get(s) == simdjson::SUCCESS) provider_message = std::string(s);
        std::string funding = "{";
        for (const char* key : {"next_action", "challenges", "credit"}) {
          simdjson::dom::element v;
          if (error[key].get(v) == simdjson::SUCCESS) {
            absl::StrAppend(&funding, funding.size() > 1 ? "," : "", "\"", key,
                            "\":", simdjson::minify(v));
          }
        }
        funding += "}";
        r.funding_action_json = funding;
      }
    }
    auto seconds_of = [](simdjson::dom::element v) -> std::optional<absl::Duration> {
      double d = 0;
      if (v.get_double().get(d) == simdjson::SUCCESS && d >= 0 && d < 1e9) {
        return absl::Seconds(d);
      }
      std::string_view s;
      int64_t n = 0;
      if (v.get_string().get(s) == simdjson::SUCCESS &&
          absl::SimpleAtoi(absl::string_view(s.data(), s.size()), &n) && n >= 0) {
        return absl::Seconds(n);
      }
      return std::nullopt;
    };
    simdjson::dom::element v;
    if (doc["retry_after"].get(v) == simdjson::SUCCESS) {
      body_retry_after = seconds_of(v);
    } else if (doc["details"]["retry_after"].get(v) == simdjson::SUCCESS) {
      body_retry_after = seconds_of(v);
    }
    std::string_view m;
    if (provider_message.empty() &&
        doc["details"]["message"].get_string().get(m) == simdjson::SUCCESS) {
      provider_message = std::string(m);
    }
  }
  r.retry_after = body_retry_after ? body_retry_after : retry_after_header;
  if (!r.retry_after && sse_retry_ms) r.retry_after = absl::Milliseconds(*sse_retry_ms);

  const std::string& c = r.code;
  if (nested || http_status == 402 || c == "payment_required" || c == "insufficient_credit") {
    r.kind = RefusalKind::kFundingRequired;
  } else if (c == "chain_unavailable" || c == "rate_limited" || http_status == 429) {
    r.kind = RefusalKind::kRetryAfter;
  } else if (c == "resync_required") {
    r.kind = RefusalKind::kResyncRequired;
  } else if (http_status == 401 || http_status == 403 || c == "unauthorized" ||
             c == "forbidden") {
    r.kind = RefusalKind::kAuthFailed;
  } else if (http_status == 0) {
    // An SSE control: known configuration errors halt, anything else is retried.
    r.kind = (c == "cursor_mismatch" || c == "invalid_request") ? RefusalKind::kConfigInvalid
                                                                 : RefusalKind::kTransient;
  } else if (http_status >= 500 || http_status == 408) {
    r.kind = RefusalKind::kTransient;
  } else {
    // 400, 409 cursor_mismatch (or another 409: not transient), other 4xx and 3xx.
    r.kind = RefusalKind::kConfigInvalid;
  }
  // Redacted before the message is cut: a cut first could leave part of the secret,
  // which a later redaction of the whole secret would not find.
  RedactAndCut(secret, kMaxMessage, &provider_message);
  r.code = SafeCode(std::move(r.code), secret);
  Redact(secret, &r.funding_action_json);
  r.message = absl::StrCat(http_status == 0 ? std::string("SSE error control")
                                            : absl::StrCat("HTTP ", http_status),
                           r.code.empty() ? "" : " ", r.code,
                           provider_message.empty() ? "" : ": ", provider_message,
                           body_cut && !parsed
                               ? " (the response body was cut short; classified by its status)"
                               : "",
                           http_status >= 300 && http_status < 400
                               ? " (redirects are not followed: fix the provider url)"
                               : "");
  return r;
}

// ---------------------------------------------------------------------------------------

HttpProvider::HttpProvider(HttpProviderOptions options)
    : options_(std::move(options)),
      base_(absl::StripSuffix(options_.base_url, "/")),
      pool_(options_.session_pool != nullptr ? options_.session_pool
                                             : std::make_shared<CurlSessionPool>(1)),
      budget_(options_.page_budget != nullptr ? options_.page_budget : PageBudget::Create(0)),
      stream_session_(options_.transport == handoff::v1::TRANSPORT_SSE
                          ? std::make_unique<CurlSession>()
                          : nullptr),
      pages_url_(UrlPrefix("/v1/pages")),
      stream_url_(UrlPrefix("/v1/stream")) {}

void HttpProvider::WakeTransfers() {
  {
    absl::MutexLock lock(&poll_mu_);
    if (poll_session_ != nullptr) poll_session_->Wakeup();
  }
  if (stream_session_ != nullptr) stream_session_->Wakeup();
}

HttpProviderOptions OptionsForSpec(const handoff::v1::SourceSpec& spec) {
  HttpProviderOptions o;
  o.base_url = spec.provider_url();
  o.chain = spec.chain();
  o.source = spec.source();
  o.filter = spec.filter();
  if (spec.page_limit() != 0) o.page_limit = spec.page_limit();
  o.transport = spec.transport();
  return o;
}

absl::StatusOr<std::unique_ptr<Provider>> MakeHttpProvider(HttpProviderOptions options) {
  absl::StatusOr<std::unique_ptr<HttpProvider>> p = HttpProvider::Create(std::move(options));
  if (!p.ok()) return p.status();
  return std::unique_ptr<Provider>(*std::move(p));
}

absl::StatusOr<std::unique_ptr<HttpProvider>> HttpProvider::Create(HttpProviderOptions options) {
  if (!absl::StartsWith(options.base_url, "http://") &&
      !absl::StartsWith(options.base_url, "https://")) {
    return absl::InvalidArgumentError("provider url must start with http:// or https://");
  }
  if (options.chain.empty() || options.source.empty() || options.filter.empty()) {
    return absl::InvalidArgumentError("chain, source and filter are required");
  }
  if (options.page_limit == 0 || options.page_limit > 1000) {
    return absl::InvalidArgumentError("page_limit must be 1..1000");
  }
  if (options.transport != handoff::v1::TRANSPORT_POLL &&
      options.transport != handoff::v1::TRANSPORT_SSE) {
    return absl::InvalidArgumentError("transport must be POLL or SSE");
  }
  if (options.api_key.find_first_of("\r\n") != std::string::npos) {
    return absl::InvalidArgumentError("api key contains a line break");
  }
  if (options.max_page_bytes < 1024) return absl::InvalidArgumentError("max_page_bytes < 1024");
  options.sse_buffered_pages = std::max<size_t>(1, options.sse_buffered_pages);
  std::unique_ptr<HttpProvider> p(new HttpProvider(std::move(options)));
  if (p->stream_session_ != nullptr && !p->stream_session_->ok()) {
    return absl::InternalError("libcurl initialisation failed");
  }
  return p;
}

HttpProvider::~HttpProvider() {
  cancelled_.store(true);
  StopPrefetch();
  absl::MutexLock lock(&lifecycle_mu_);
  StopReader();
}

std::string HttpProvider::UrlPrefix(absl::string_view path) const {
  std::string url = absl::StrCat(base_, path, "?chain=", UrlEscape(options_.chain),
                                 "&source=", UrlEscape(options_.source),
                                 "&filter=", UrlEscape(options_.filter));
  if (options_.page_limit != 0) absl::StrAppend(&url, "&limit=", options_.page_limit);
  url.append("&from=");
  return url;
}

Refusal HttpProvider::Scrub(Refusal r) const {
  // Refusals classified here are redacted already (ClassifyRefusal, before its cut);
  // this covers the rest (libcurl's error text, parse errors) and every field again.
  for (std::string* s : {&r.message, &r.code, &r.funding_action_json}) {
    Redact(options_.api_key, s);
  }
  return r;
}

FetchResult HttpProvider::Transient(std::string code, std::string message) {
  Refusal r;
  r.kind = RefusalKind::kTransient;
  r.code = std::move(code);
  r.message = std::move(message);
  return FetchResult::Refused(std::move(r));
}

FetchResult HttpProvider::Cancelled() {
  Refusal r;
  r.kind = RefusalKind::kCancelled;
  r.code = "cancelled";
  r.message = "provider cancelled";
  return FetchResult::Refused(std::move(r));
}

FetchResult HttpProvider::Fetch(const std::string& committed_cursor) {
  if (cancelled_.load()) return Cancelled();
  if (committed_cursor.empty()) {
    Refusal r;
    r.kind = RefusalKind::kConfigInvalid;
    r.code = "empty_cursor";
    r.message = "Fetch needs a cursor, a decimal block or \"latest\"";
    return FetchResult::Refused(std::move(r));
  }
  return options_.transport == handoff::v1::TRANSPORT_SSE ? FetchStream(committed_cursor)
                                                           : FetchPoll(committed_cursor);
}

void HttpProvider::Cancel() {
  cancelled_.store(true);
  { absl::MutexLock lock(&mu_); }  // re-evaluates the conditions of waiting threads
  budget_->WakeWaiters();          // a Fetch or reader waiting for a page slot
  WakeTransfers();
}

void HttpProvider::Close() {
  {
    // The pages fetched ahead, and their slots of the shared budget, go now: a closed
    // provider can wait long to be destroyed (a halted source, until an operator acts),
    // and the slots would starve the other sources. A request still in flight drops
    // its own page when it ends (RunPrefetchChain).
    absl::MutexLock lock(&prefetch_mu_);
    chain_stop_ = true;
    prefetched_.clear();
  }
  close_generation_.fetch_add(1);
  fresh_poll_connection_.store(true);
  if (stream_session_ != nullptr) stream_session_->DropConnections();
  WakeTransfers();
  absl::MutexLock lock(&lifecycle_mu_);
  StopReader();
}

void HttpProvider::DropReadAhead() {
  if (options_.transport == handoff::v1::TRANSPORT_SSE) {
    absl::MutexLock lock(&lifecycle_mu_);
    StopReader();
    return;
  }
  StopPrefetch();  // drops the prefetched pages, and their slots
}

// ----- polling -------------------------------------------------------------------------

namespace {

// Collects a polled body: a 200 body up to max_page_bytes, an error body up to 64 KiB.
class BodyHandler : public CurlSession::Handler {
 public:
  BodyHandler(std::string* body, size_t max_page_bytes, size_t padding)
      : body_(body), max_(max_page_bytes), padding_(padding) {
    body_->clear();
  }
  bool OnHeaders(const CurlSession::Response& response) override {
    response_ = response;
    limit_ = response.status == 200 ? max_ : kMaxErrorBody;
    if (response.content_length && *response.content_length > limit_) {
      too_large_ = response.status == 200;
      return !too_large_;  // an oversized error body is just cut
    }
    if (response.content_length) body_->reserve(*response.content_length + padding_);
    return true;
  }
  bool OnBody(absl::string_view chunk) override {
    if (body_->size() + chunk.size() > limit_) {
      if (response_.status == 200) {
        too_large_ = true;
        return false;
      }
      // An error body is only read up to its cap, then the transfer ends (an endless
      // error body must not hold the worker): the refusal maps by its status.
      body_->append(chunk.data(), limit_ - body_->size());
      error_capped_ = true;
      return false;
    }
    body_->append(chunk.data(), chunk.size());
    return true;
  }
  const CurlSession::Response& response() const { return response_; }
  bool too_large() const { return too_large_; }
  bool error_capped() const { return error_capped_; }

 private:
  std::string* body_;
  const size_t max_;
  const size_t padding_;
  size_t limit_ = kMaxErrorBody;
  CurlSession::Response response_;
  bool too_large_ = false;
  bool error_capped_ = false;
};

FetchResult TooLarge(size_t max) {
  Refusal r;
  r.kind = RefusalKind::kMalformedPage;
  r.http_status = 200;
  r.code = "page_too_large";
  r.message = absl::StrCat("page larger than max_page_bytes (", max,
                           "); lower page_limit or raise the limit");
  return FetchResult::Refused(std::move(r));
}

}  // namespace

FetchResult HttpProvider::FetchPoll(const std::string& cursor) {
  std::optional<FetchResult> result = TakePrefetch(cursor);
  if (!result.has_value()) {
    // This source holds no slot here (its earlier pages were handed to the engine, which
    // releases them without waiting for the budget), so waiting cannot deadlock.
    std::optional<PageSlot> slot = budget_->Acquire([this] { return cancelled_.load(); });
    if (!slot.has_value()) return Cancelled();
    result = PollOnce(cursor, nullptr, *std::move(slot));
  }
  // A chain still running (or with pages waiting) is already fetching what follows.
  if (options_.poll_prefetch && !prefetch_.busy() && result->page.has_value() &&
      result->page->next != cursor && !cancelled_.load()) {
    // Only with a slot to spare: when sources wait for slots, the ones ahead of this
    // one fetch first, and a speculative page would take a slot from them.
    if (std::optional<PageSlot> slot = budget_->TryAcquire()) {
      StartPrefetch(result->page->next, *std::move(slot));
    }
  }
  return *std::move(result);
}

void HttpProvider::StartPrefetch(const std::string& cursor, PageSlot slot) {
  {
    absl::MutexLock lock(&prefetch_mu_);
    prefetched_.clear();
    fetching_cursor_ = cursor;
    chain_ended_ = false;
    chain_stop_ = false;
  }
  prefetch_generation_ = close_generation_.load();
  stop_prefetch_.store(false);
  prefetch_.Run([this, cursor, slot = std::move(slot)]() mutable {
    RunPrefetchChain(cursor, std::move(slot));
  });
}

void HttpProvider::RunPrefetchChain(std::string cursor, PageSlot slot) {
  while (true) {
    const absl::Time started = absl::Now();
    FetchResult result = PollOnce(cursor, &stop_prefetch_, std::move(slot));
    const bool more = result.page.has_value() && result.page->next != cursor;
    std::string next = more ? result.page->next : std::string();
    absl::MutexLock lock(&prefetch_mu_);  // released before `result` goes, with its slot
    fetching_cursor_.clear();
    if (chain_stop_) {  // stopped or closed meanwhile: nobody takes this page
      chain_ended_ = true;
      return;
    }
    prefetched_.push_back(Prefetched{cursor, started, std::move(result)});
    // Goes on while the engine takes what is fetched, and only with a slot to spare.
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(prefetch_mu_) {
      return chain_stop_ || prefetched_.size() < kPrefetchDepth;
    };
    std::optional<PageSlot> next_slot;
    if (more &&
        prefetch_mu_.AwaitWithTimeout(absl::Condition(&room), options_.max_prefetch_age) &&
        !chain_stop_) {
      next_slot = budget_->TryAcquire();
    }
    if (!next_slot.has_value()) {
      chain_ended_ = true;
      return;
    }
    cursor = std::move(next);
    fetching_cursor_ = cursor;
    slot = *std::move(next_slot);
  }
}

void HttpProvider::StopPrefetch() {
  if (!prefetch_.busy()) return;
  {
    absl::MutexLock lock(&prefetch_mu_);
    chain_stop_ = true;
  }
  stop_prefetch_.store(true);
  WakeTransfers();
  prefetch_.Wait();
  absl::MutexLock lock(&prefetch_mu_);
  prefetched_.clear();  // the pages, and their slots
  fetching_cursor_.clear();
}

std::optional<FetchResult> HttpProvider::TakePrefetch(const std::string& cursor) {
  if (!prefetch_.busy()) return std::nullopt;
  std::optional<Prefetched> taken;
  bool chain_over = false;
  {
    absl::MutexLock lock(&prefetch_mu_);
    // The chain's next page: fetched, or being fetched (waited for) if it is `cursor`'s.
    auto arrived = [this, &cursor]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(prefetch_mu_) {
      return !prefetched_.empty() || chain_ended_ || fetching_cursor_ != cursor;
    };
    prefetch_mu_.Await(absl::Condition(&arrived));
    if (!prefetched_.empty() && prefetched_.front().cursor == cursor) {
      taken = std::move(prefetched_.front());
      prefetched_.pop_front();
      chain_over = chain_ended_ && prefetched_.empty();
    }
  }
  // A refusal is the provider's answer to this cursor's request, as it would be to the
  // Fetch's own: asking again at once would defy its Retry-After (or retry_after), or
  // send a refused key a second time. So it is handed out whatever its age: what it says
  // ("not before", "stop") does not go stale the way a page does, and the engine's
  // wait, counted from now, can only be longer than the provider asked.
  const bool usable = taken.has_value() && prefetch_generation_ == close_generation_.load() &&
                      (!taken->result.page.has_value() ||
                       absl::Now() - taken->started < options_.max_prefetch_age);
  if (!usable) {
    // The engine did not commit the page the chain followed (or it is stale, or a
    // Close() came since): drop the speculation.
    taken.reset();
    StopPrefetch();
    return std::nullopt;
  }
  if (chain_over) prefetch_.Wait();
  return std::move(taken->result);
}

FetchResult HttpProvider::PollOnce(const std::string& cursor, const std::atomic<bool>* stop,
                                   PageSlot slot) {
  std::unique_ptr<CurlSession> session = pool_->Take();
  if (!session->ok()) return Transient("internal", "libcurl could not allocate a session");
  if (fresh_poll_connection_.exchange(false)) session->DropConnections();
  {
    absl::MutexLock lock(&poll_mu_);
    poll_session_ = session.get();
  }
  FetchResult result = PollWith(session.get(), cursor, stop, std::move(slot));
  {
    absl::MutexLock lock(&poll_mu_);
    poll_session_ = nullptr;
  }
  // Back to the pool even when the source asks again at once: the pool hands out the
  // most recently used session first, so its next request finds the same warm
  // connection if nobody took it meanwhile, and many sources catching up together hold
  // about as many connections as they have requests in flight, not one each.
  pool_->Give(std::move(session));
  return result;
}

FetchResult HttpProvider::PollWith(CurlSession* session, const std::string& cursor,
                                   const std::atomic<bool>* stop, PageSlot slot) {
  std::string& body = *slot.buffer();
  CurlSession::Request req;
  req.url = pages_url_ + UrlEscape(cursor);
  req.headers.push_back("Accept: application/json");
  if (!options_.api_key.empty()) req.headers.push_back("Authorization: Bearer " + options_.api_key);
  req.user_agent = options_.user_agent;
  req.connect_timeout = options_.connect_timeout;
  req.header_timeout = options_.read_timeout;
  req.body_idle_timeout = options_.read_timeout;
  req.total_timeout = options_.response_timeout;
  BodyHandler handler(&body, options_.max_page_bytes, PageParser::Padding());
  const uint64_t generation = close_generation_.load();
  CurlSession::Result result = session->Run(req, &handler, [this, generation, stop] {
    return cancelled_.load() || close_generation_.load() != generation ||
           (stop != nullptr && stop->load());
  });
  if (cancelled_.load()) return Cancelled();
  if (result.interrupted) return Transient("closed", "connection closed by Close()");
  if (handler.too_large()) return TooLarge(options_.max_page_bytes);
  const int status = handler.response().status;
  // A refusal's status line and headers arrived but not its whole body (capped, cut by a
  // closed connection, stalled): still the provider's answer, classified by its status
  // and Retry-After header. A 409, 401 or 402 retried as a network failure would be
  // retried forever; a 429's Retry-After would be ignored.
  const bool body_failed = result.code != CURLE_OK || result.idle_timeout ||
                           result.deadline_exceeded;
  if (handler.error_capped() || (result.headers_done && status >= 300 && body_failed)) {
    return FetchResult::Refused(Scrub(ClassifyRefusal(status, body,
                                                      handler.response().retry_after,
                                                      std::nullopt, options_.api_key,
                                                      /*body_cut=*/true)));
  }
  if (result.idle_timeout) {
    return Transient("timeout", absl::StrCat("no data from the provider for ",
                                             absl::FormatDuration(options_.read_timeout)));
  }
  if (result.deadline_exceeded) {
    return Transient("timeout", absl::StrCat("the response did not complete within "
                                             "response_timeout (",
                                             absl::FormatDuration(options_.response_timeout),
                                             "); the partial body was discarded"));
  }
  if (result.code != CURLE_OK) {
    // Create() admits only http(s) URLs, so CURLE_UNSUPPORTED_PROTOCOL here means the
    // server's answer was not HTTP (HTTP/0.9 garbage, a status code like 2000): a broken
    // or hostile response, retried like other transport failures below, never a halt.
    if (result.code == CURLE_URL_MALFORMAT) {
      Refusal r;
      r.kind = RefusalKind::kConfigInvalid;
      r.code = "bad_url";
      r.message = Scrub(Refusal{RefusalKind::kConfigInvalid, 0, "", result.error}).message;
      return FetchResult::Refused(std::move(r));
    }
    // Resets, timeouts, truncated bodies (CURLE_PARTIAL_FILE): the partial body is dropped.
    return FetchResult::Refused(Scrub(Refusal{RefusalKind::kTransient, 0, "network", absl::StrCat("transfer failed: ", result.error)}));
  }
  if (status != 200) {
    return FetchResult::Refused(Scrub(ClassifyRefusal(
        status, body, handler.response().retry_after, std::nullopt, options_.api_key)));
  }
  absl::StatusOr<Page> page = poll_parser_.ParseOwned(&body);
  slot.ReturnBuffer();
  if (!page.ok()) {
    Refusal r;
    r.kind = RefusalKind::kMalformedPage;
    r.http_status = 200;
    r.code = "malformed_page";
    r.message = std::string(page.status().message());
    return FetchResult::Refused(Scrub(std::move(r)));
  }
  page->slot = std::move(slot);
  return FetchResult::Of(*std::move(page));
}

bool HttpProvider::Ready(const std::string& committed_cursor) {
  if (cancelled_.load()) return true;
  if (options_.transport != handoff::v1::TRANSPORT_SSE) {
    // The provider answers a poll at once (it never holds one open for news), so with no
    // prefetch running Fetch sends its poll now: one exchange, after the wait for a page
    // slot that other sources' pages free as they are committed. A prefetch running is
    // only as good if it fetches (or fetched) this cursor's page.
    if (!prefetch_.busy()) return true;
    absl::MutexLock lock(&prefetch_mu_);
    return (!prefetched_.empty() && prefetched_.front().cursor == committed_cursor) ||
           (prefetched_.empty() && fetching_cursor_ == committed_cursor);
  }
  absl::MutexLock lock(&mu_);
  return stream_usable_ && position_ == committed_cursor && !queue_.empty();
}

// ----- SSE -----------------------------------------------------------------------------

FetchResult HttpProvider::FetchStream(const std::string& cursor) {
  // The stream this Fetch reads, named while the lifecycle lock keeps it current: a Close
  // between here and the wait below then ends the wait (the id moves on) instead of
  // leaving it on the next stream, which nobody starts.
  uint64_t id;
  {
    absl::MutexLock lifecycle(&lifecycle_mu_);
    bool reuse;
    {
      absl::MutexLock lock(&mu_);
      reuse = stream_usable_ && position_ == cursor;
    }
    if (!reuse) {
      StopReader();
      StartReader(cursor);
    }
    absl::MutexLock lock(&mu_);
    id = stream_id_;
  }
  absl::MutexLock lock(&mu_);
  struct Args {
    HttpProvider* self;
    uint64_t id;
  } args{this, id};
  mu_.Await(absl::Condition(
      +[](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return !a->self->queue_.empty() || a->self->cancelled_.load() ||
               a->self->stream_id_ != a->id;
      },
      &args));
  if (cancelled_.load()) return Cancelled();
  if (stream_id_ != id || queue_.empty()) return Transient("closed", "connection closed by Close()");
  StreamItem item = std::move(queue_.front());
  queue_.pop_front();
  if (item.page) {
    position_ = item.page->next;
    return FetchResult::Of(*std::move(item.page));
  }
  stream_usable_ = false;  // the reader has ended; the next Fetch reconnects
  return FetchResult::Refused(std::move(*item.refusal));
}

void HttpProvider::StopReader() {
  if (reader_.joinable()) {
    stop_reader_.store(true);
    { absl::MutexLock lock(&mu_); }  // wakes a reader waiting for queue room
    budget_->WakeWaiters();          // or for a page slot
    WakeTransfers();
    reader_.join();
    stop_reader_.store(false);
  }
  absl::MutexLock lock(&mu_);
  queue_.clear();
  stream_usable_ = false;
  ++stream_id_;
}

void HttpProvider::StartReader(const std::string& cursor) {
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    position_ = cursor;
    stream_usable_ = true;
    queue_.clear();
    id = ++stream_id_;
  }
  reader_ = std::thread([this, cursor, id] { ReaderMain(cursor, id); });
}

std::optional<PageSlot> HttpProvider::ReserveForPage(uint64_t stream_id) {
  struct Args {
    HttpProvider* self;
  } args{this};
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return a->self->queue_.size() < a->self->options_.sse_buffered_pages ||
                 a->self->ReaderStopped();
        },
        &args));
    if (ReaderStopped() || stream_id_ != stream_id) return std::nullopt;
  }
  // A frame is parsed only under a slot of the budget, so a source waiting for one holds
  // the frame's bytes (its stream buffers), not a parsed page: with many streams, the
  // parsed pages are the slots' few, not one per source. The reader holds no slot while
  // it waits (the queued pages' slots are released by the engine, which does not wait
  // for the budget): no deadlock. Waiting leaves the socket unread, as a full queue
  // does. Only this thread adds to the queue, so the room found above is still there
  // when the page is pushed.
  return budget_->Acquire([this] { return ReaderStopped(); });
}

bool HttpProvider::PushPage(Page page, uint64_t stream_id) {
  absl::MutexLock lock(&mu_);
  if (ReaderStopped() || stream_id_ != stream_id) return false;
  StreamItem item;
  item.page = std::move(page);
  queue_.push_back(std::move(item));
  return true;
}

void HttpProvider::PushTerminal(Refusal refusal, uint64_t stream_id) {
  absl::MutexLock lock(&mu_);
  if (stream_id_ != stream_id) return;
  StreamItem item;
  item.refusal = Scrub(std::move(refusal));
  queue_.push_back(std::move(item));  // may exceed the bound by this one item
}

namespace {

// Parses the event stream of one connection (runs on the reader thread).
class StreamHandler : public CurlSession::Handler {
 public:
  using SlotReserve = std::function<std::optional<PageSlot>()>;
  using PagePush = std::function<bool(Page)>;
  // `secret` (the API key) is redacted from the refusal of an `event: error` control.
  StreamHandler(size_t max_page_bytes, absl::string_view secret, SlotReserve reserve,
                PagePush push)
      : max_page_bytes_(max_page_bytes),
        secret_(secret),
        sse_(max_page_bytes + 4096, PageParser::Padding()),
        reserve_(std::move(reserve)),
        push_(std::move(push)) {}

  bool OnHeaders(const CurlSession::Response& response) override {
    response_ = response;
    streaming_ = response.status == 200 &&
                 absl::StartsWithIgnoreCase(response.content_type, "text/event-stream");
    if (response.status == 200 && !streaming_) {
      terminal_ = Refusal{RefusalKind::kMalformedPage, 200, "not_event_stream",
                          absl::StrCat("expected text/event-stream, got ",
                                       ShownContentType(response.content_type, secret_))};
      return false;
    }
    return true;
  }

  bool Progressed() override {
    const bool progressed = !streaming_ || frames_ != frames_seen_;
    frames_seen_ = frames_;
    return progressed;
  }

  bool OnBody(absl::string_view chunk) override {
    if (!streaming_) {  // a refusal body
      size_t room = kMaxErrorBody - std::min(kMaxErrorBody, error_body_.size());
      error_body_.append(chunk.data(), std::min(room, chunk.size()));
      return chunk.size() <= room;  // capped: stop reading, classify by the status
    }
    bool keep_going = true;
    absl::Status s = sse_.Feed(chunk, [&](SseFrame&& frame) {
      ++frames_;
      if (!keep_going) return;
      keep_going = OnFrame(std::move(frame));
    });
    if (!s.ok()) {
      terminal_ = Refusal{RefusalKind::kMalformedPage, 200, "page_too_large",
                          absl::StrCat("SSE frame larger than max_page_bytes (",
                                       max_page_bytes_, "); lower page_limit or raise the limit")};
      return false;
    }
    return keep_going;
  }

  const CurlSession::Response& response() const { return response_; }
  bool streaming() const { return streaming_; }
  const std::string& error_body() const { return error_body_; }
  std::optional<Refusal>& terminal() { return terminal_; }
  bool partial_frame() const { return sse_.HasPartialFrame(); }
  bool stopped() const { return stopped_; }

 private:
  bool OnFrame(SseFrame frame) {
    if (frame.event == "error") {
      terminal_ = ClassifyRefusal(0, frame.data, std::nullopt, frame.retry_ms, secret_);
      return false;  // the provider closes after a control; so do we
    }
    if (!frame.event.empty() && frame.event != "message") return true;  // unknown: ignored
    if (!frame.has_data || frame.data.empty()) {
      // Not an event: the SSE spec dispatches no frame whose data buffer is empty (`data:`
      // alone, or an id without data).
      sse_.GiveBack(std::move(frame.data));
      return true;
    }
    std::optional<PageSlot> slot = reserve_();
    if (!slot.has_value()) {
      stopped_ = true;
      return false;
    }
    absl::StatusOr<Page> page = parser_.ParseOwned(&frame.data);
    sse_.GiveBack(std::move(frame.data));  // the next frame's data goes into it
    if (!page.ok()) {
      terminal_ = Refusal{RefusalKind::kMalformedPage, 200, "malformed_page",
                          std::string(page.status().message())};
      return false;  // the slot is given back here
    }
    page->slot = *std::move(slot);
    if (!push_(*std::move(page))) {
      stopped_ = true;
      return false;
    }
    return true;
  }

  const size_t max_page_bytes_;
  const absl::string_view secret_;
  SseParser sse_;
  PageParser parser_;
  SlotReserve reserve_;
  PagePush push_;
  CurlSession::Response response_;
  bool streaming_ = false;
  bool stopped_ = false;
  uint64_t frames_ = 0;       // complete frames, any kind (heartbeats included)
  uint64_t frames_seen_ = 0;  // frames_ at the last Progressed()
  std::string error_body_;
  std::optional<Refusal> terminal_;
};

}  // namespace

void HttpProvider::ReaderMain(std::string cursor, uint64_t stream_id) {
  CurlSession::Request req;
  const bool latest = cursor == "latest";
  req.url = stream_url_ + UrlEscape(cursor);
  req.headers.push_back("Accept: text/event-stream");
  req.headers.push_back("Cache-Control: no-cache");
  if (!latest) req.headers.push_back("Last-Event-ID: " + cursor);
  if (!options_.api_key.empty()) req.headers.push_back("Authorization: Bearer " + options_.api_key);
  req.user_agent = options_.user_agent;
  req.connect_timeout = options_.connect_timeout;
  // A stream may open with its first frame, which the provider owes within 30 s: the
  // silence rule (60 s) bounds the headers too, not the polled read_timeout.
  req.header_timeout = options_.sse_silence_timeout;
  req.body_idle_timeout = options_.sse_silence_timeout;
  StreamHandler handler(
      options_.max_page_bytes, options_.api_key,
      [this, stream_id] { return ReserveForPage(stream_id); },
      [this, stream_id](Page page) { return PushPage(std::move(page), stream_id); });
  CurlSession::Result result =
      stream_session_->Run(req, &handler, [this] { return ReaderStopped(); });
  if (stop_reader_.load() || handler.stopped()) return;  // Close / reconnect: nobody waits
  if (cancelled_.load()) {
    PushTerminal(Cancelled().refusal.value(), stream_id);
    return;
  }
  if (handler.terminal()) {
    PushTerminal(std::move(*handler.terminal()), stream_id);
    return;
  }
  // A refused status whose headers arrived is the provider's answer, its body complete or
  // not (capped, cut by a closed connection, stalled): classified by its status.
  const int status = handler.response().status;
  const bool body_complete = result.code == CURLE_OK && !result.idle_timeout;
  if (result.headers_done && status != 200 && status != 0 && (body_complete || status >= 300)) {
    PushTerminal(ClassifyRefusal(status, handler.error_body(), handler.response().retry_after,
                                 std::nullopt, options_.api_key, /*body_cut=*/!body_complete),
                 stream_id);
    return;
  }
  if (result.idle_timeout) {
    PushTerminal(Refusal{RefusalKind::kTransient, 0, result.headers_done ? "sse_silence" : "timeout",
                         result.headers_done
                             ? absl::StrCat("no SSE frame for ",
                                            absl::FormatDuration(options_.sse_silence_timeout),
                                            "; reconnecting from the committed cursor")
                             : "no response from the provider"},
                 stream_id);
    return;
  }
  std::string why = result.code == CURLE_OK ? "the provider ended the stream"
                                            : absl::StrCat("transfer failed: ", result.error);
  if (handler.partial_frame()) absl::StrAppend(&why, "; an incomplete frame was discarded");
  PushTerminal(Refusal{RefusalKind::kTransient, 0,
                       result.code == CURLE_OK ? "stream_closed" : "network", why},
               stream_id);
}

}  // namespace handoff::consumer
