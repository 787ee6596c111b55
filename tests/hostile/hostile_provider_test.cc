// Issue 8, hostile input from the provider: every page and stream in corpus/ (and the
// generated monsters below: a 1 GiB body, an endless SSE frame, header floods, a
// slow-loris trickle, redirects, a gzip bomb, an endless error body) is served over real
// HTTP by a scripted server to the real HttpProvider, and the worst of them through the
// engine (SourceManager + worker). Each must give a clear refusal naming the field or
// limit and the documented state, never a crash, and bounded memory.
#include <dirent.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "consumer/provider/http_provider.h"
#include "consumer/source_manager.h"
#include "gtest/gtest.h"
#include "store/store.h"
#include "tests/hostile/scripted_server.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HANDOFF_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define HANDOFF_SANITIZED 1
#endif
#endif

namespace handoff::tests {
namespace {

using consumer::FetchResult;
using consumer::HttpProvider;
using consumer::HttpProviderOptions;
using consumer::RefusalKind;

constexpr char kCorpus[] = "tests/hostile/corpus";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> CorpusFiles() {
  std::vector<std::string> out;
  DIR* d = opendir(kCorpus);
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  closedir(d);
  return out;
}

// Peak resident set (VmHWM) of this process, in bytes.
int64_t PeakRss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "VmHWM:")) {
      int64_t kb = 0;
      std::string v = line.substr(6);
      v = v.substr(0, v.find("kB"));
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &kb)) return kb * 1024;
    }
  }
  return -1;
}

HttpProviderOptions Options(const ScriptedServer& server, handoff::v1::Transport transport) {
  HttpProviderOptions o;
  o.base_url = server.base_url();
  o.chain = "sim";
  o.source = "logs";
  o.filter = "all";
  o.transport = transport;
  o.connect_timeout = absl::Seconds(5);
  o.read_timeout = absl::Seconds(5);
  o.sse_silence_timeout = absl::Seconds(5);
  return o;
}

std::unique_ptr<HttpProvider> Make(HttpProviderOptions o) {
  absl::StatusOr<std::unique_ptr<HttpProvider>> p = HttpProvider::Create(std::move(o));
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

// A server that answers every connection with `response`, whole.
ScriptedServer::Script Answer(std::string response) {
  return [response = std::move(response)](ScriptedServer::Conn& c) { c.Send(response); };
}

// One polled fetch at "1200" from `server`.
FetchResult PollOnce(const ScriptedServer& server) {
  std::unique_ptr<HttpProvider> p = Make(Options(server, handoff::v1::TRANSPORT_POLL));
  return p->Fetch("1200");
}

std::string Describe(const FetchResult& r) {
  if (r.page) return absl::StrCat("page with ", r.page->items.size(), " items");
  return absl::StrCat("refusal kind=", static_cast<int>(r.refusal->kind), " status=",
                      r.refusal->http_status, " code=", r.refusal->code,
                      " message=", r.refusal->message);
}

// Expected outcome of one corpus file. `kind` is ignored when `page` is true.
struct Expect {
  bool page = false;
  RefusalKind kind = RefusalKind::kMalformedPage;
  std::string code;
  std::string message;  // a substring the message must contain (the field or limit)
  bool engine_violation = false;  // parses, but the engine must halt PROTOCOL_VIOLATION
};

Expect Page() { return Expect{true}; }
Expect EnginePage() { return Expect{true, RefusalKind::kMalformedPage, "", "", true}; }
Expect Bad(std::string message) {
  return Expect{false, RefusalKind::kMalformedPage, "malformed_page", std::move(message)};
}
Expect Refused(RefusalKind kind, std::string code, std::string message) {
  return Expect{false, kind, std::move(code), std::move(message)};
}

const std::map<std::string, Expect>& PageCases() {
  static const auto* cases = new std::map<std::string, Expect>{
      {"page_valid.json", Page()},
      {"page_empty_body.json", Bad("")},
      {"page_not_json.json", Bad("")},
      {"page_truncated.json", Bad("")},
      {"page_trailing_garbage.json", Bad("")},
      {"page_top_level_array.json", Bad("")},
      {"page_from_bool.json", Bad("from")},
      {"page_from_negative.json", Bad("from")},
      {"page_from_float.json", Bad("from")},
      {"page_from_2pow63.json", Bad("from")},
      {"page_from_huge_string.json", Bad("from")},
      {"page_from_1e400.json", Bad("")},
      {"page_from_hex_string.json", Bad("from")},
      {"page_tip_2pow64.json", Bad("invalid JSON")},  // simdjson refuses > 2^64-1 at parse
      {"page_through_number_string_garbage.json", Bad("through.number")},
      {"page_through_hash_short.json", Bad("through.hash")},
      {"page_next_number.json", Bad("next")},
      {"page_next_missing.json", Bad("next")},
      {"page_items_missing.json", Bad("items")},
      {"page_items_object.json", Bad("items")},
      {"page_item_not_object.json", Bad("items[0]")},
      {"page_reorg_string.json", Bad("reorg")},
      {"page_block_invalid_hex.json", Bad("items[0].blockNumber")},
      {"page_block_no_prefix.json", Bad("items[0].blockNumber")},
      {"page_block_empty_hex.json", Bad("items[0].blockNumber")},
      {"page_block_hex_overflow.json", Bad("items[0].blockNumber")},
      {"page_block_number_type.json", Bad("items[0].blockNumber")},
      {"page_log_index_missing.json", Bad("items[0].logIndex")},
      {"page_address_short.json", Bad("items[0].address")},
      {"page_topic_bad_hex.json", Bad("items[0].topics[0]")},
      {"page_topics_too_many.json", Page()},  // the contract sets no topic count limit
      {"page_data_odd_length.json", Bad("items[0].data")},
      {"page_removed_string.json", Bad("items[0].removed")},
      {"page_deep_nesting.json", Bad("")},
      {"page_invalid_utf8.json", Bad("")},
      {"page_nul_in_key.json", Bad("next")},
      {"page_items_out_of_order.json", EnginePage()},
      {"page_items_duplicate_position.json", EnginePage()},
      {"page_item_above_range.json", EnginePage()},
      {"page_item_below_range.json", EnginePage()},
      {"page_through_below_from.json", EnginePage()},
  };
  return *cases;
}

const std::map<std::string, Expect>& SseCases() {
  static const auto* cases = new std::map<std::string, Expect>{
      {"sse_valid.txt", Page()},
      {"sse_crlf_and_comments.txt", Page()},
      {"sse_out_of_order_items.txt", EnginePage()},
      {"sse_bad_page_json.txt", Bad("")},
      {"sse_wrong_type_page.txt", Bad("next")},
      {"sse_error_control_unknown.txt",
       Refused(RefusalKind::kTransient, "gremlins", "SSE error control gremlins")},
      {"sse_error_control_not_json.txt",
       Refused(RefusalKind::kTransient, "", "SSE error control")},
      {"sse_error_control_resync.txt",
       Refused(RefusalKind::kResyncRequired, "resync_required", "resync_required")},
      {"sse_unknown_event_then_eof.txt",
       Refused(RefusalKind::kTransient, "stream_closed", "ended the stream")},
      {"sse_retry_huge.txt",
       Refused(RefusalKind::kTransient, "stream_closed", "ended the stream")},
      {"sse_incomplete_frame.txt",
       Refused(RefusalKind::kTransient, "stream_closed", "incomplete frame was discarded")},
  };
  return *cases;
}

void Check(const std::string& name, const Expect& want, const FetchResult& got) {
  SCOPED_TRACE(name + ": " + Describe(got));
  if (want.page) {
    EXPECT_TRUE(got.page.has_value());
    return;
  }
  ASSERT_TRUE(got.refusal.has_value());
  EXPECT_EQ(got.refusal->kind, want.kind);
  EXPECT_EQ(got.refusal->code, want.code);
  EXPECT_FALSE(got.refusal->message.empty());
  EXPECT_TRUE(absl::StrContains(got.refusal->message, want.message));
}

TEST(HostileCorpusTest, EveryFileHasAnExpectation) {
  std::vector<std::string> files = CorpusFiles();
  ASSERT_GE(files.size(), 50u);
  for (const std::string& f : files) {
    if (f == "gzip_bomb.gz") continue;
    EXPECT_TRUE(PageCases().count(f) + SseCases().count(f) == 1) << f << " has no case";
  }
  for (const auto& [f, e] : PageCases()) EXPECT_TRUE(std::ifstream(absl::StrCat(kCorpus, "/", f)).good()) << f;
  for (const auto& [f, e] : SseCases()) EXPECT_TRUE(std::ifstream(absl::StrCat(kCorpus, "/", f)).good()) << f;
}

// A scripted server that answers every connection with the response last Set().
class CannedServer {
 public:
  CannedServer() : server_([this](ScriptedServer::Conn& c) { c.Send(Response()); }) {}
  void Set(std::string response) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    response_ = std::move(response);
  }
  ScriptedServer& server() { return server_; }

 private:
  std::string Response() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return response_;
  }
  absl::Mutex mu_;
  std::string response_ ABSL_GUARDED_BY(mu_);
  ScriptedServer server_;  // last: stopped before the response goes
};

TEST(HostileProviderTest, PolledCorpus) {
  CannedServer canned;
  std::unique_ptr<HttpProvider> p =
      Make(Options(canned.server(), handoff::v1::TRANSPORT_POLL));
  for (const auto& [name, want] : PageCases()) {
    const std::string body = ReadFile(absl::StrCat(kCorpus, "/", name));
    canned.Set(ResponseHead("200 OK", "application/json", body.size()) + body);
    Check(name, want, p->Fetch("1200"));
  }
}

TEST(HostileProviderTest, StreamedCorpus) {
  CannedServer canned;
  for (const auto& [name, want] : SseCases()) {
    canned.Set(ResponseHead("200 OK", "text/event-stream", -1) +
               ReadFile(absl::StrCat(kCorpus, "/", name)));
    std::unique_ptr<HttpProvider> p = Make(Options(canned.server(), handoff::v1::TRANSPORT_SSE));
    FetchResult r = p->Fetch("1200");
    Check(name, want, r);
    if (r.page) {  // the stream then ends: a transient refusal, never a half page
      FetchResult end = p->Fetch(r.page->next);
      ASSERT_TRUE(end.refusal.has_value()) << name;
      EXPECT_EQ(end.refusal->kind, RefusalKind::kTransient) << name;
    }
  }
}

// A body of 1 GiB, written by the server as fast as the client reads, never held by
// it: the client aborts at max_page_bytes (64 MiB, the default) with page_too_large.
void HugeBody(bool chunked_without_length) {
  constexpr long long kGiB = 1LL << 30;
  std::atomic<long long> sent{0};
  ScriptedServer server([&](ScriptedServer::Conn& c) {
    if (!c.Send(ResponseHead("200 OK", "application/json", chunked_without_length ? -1 : kGiB))) {
      return;
    }
    std::string block(64 * 1024, ' ');
    block.replace(0, 20, "{\"from\":1200,\"x\":\"  ");
    for (long long n = 0; n < kGiB; n += block.size()) {
      if (!c.Send(block)) return;
      sent.fetch_add(block.size());
      block.assign(block.size(), 'a');
    }
  });
  HttpProviderOptions o = Options(server, handoff::v1::TRANSPORT_POLL);
  ASSERT_EQ(o.max_page_bytes, 64u << 20);
  std::unique_ptr<HttpProvider> p = Make(o);
  const int64_t before = PeakRss();
  FetchResult r = p->Fetch("1200");
  const int64_t after = PeakRss();
  SCOPED_TRACE(Describe(r));
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->kind, RefusalKind::kMalformedPage);
  EXPECT_EQ(r.refusal->code, "page_too_large");
  EXPECT_TRUE(absl::StrContains(r.refusal->message, "max_page_bytes"));
  server.Stop();
  EXPECT_LT(sent.load(), kGiB / 4) << "the client kept reading";
#ifndef HANDOFF_SANITIZED
  EXPECT_LT(after - before, 200LL << 20) << "VmHWM grew by " << (after - before);
#endif
  std::printf("huge body (%s): server sent %lld bytes; VmHWM %lld -> %lld MiB\n",
              chunked_without_length ? "no length" : "Content-Length 1 GiB",
              static_cast<long long>(sent.load()), static_cast<long long>(before >> 20),
              static_cast<long long>(after >> 20));
}

TEST(HostileProviderTest, GibibyteBodyWithoutLength) { HugeBody(true); }
TEST(HostileProviderTest, GibibyteBodyWithContentLength) { HugeBody(false); }

// An SSE frame that never ends: fast, it hits the frame bound (page_too_large); trickled,
// it completes no frame and the silence timeout fires although bytes keep coming.
TEST(HostileProviderTest, EndlessSseFrameFast) {
  ScriptedServer server([&](ScriptedServer::Conn& c) {
    if (!c.Send(ResponseHead("200 OK", "text/event-stream", -1) + "id: 1\ndata: {")) return;
    std::string block(64 * 1024, 'x');
    for (int i = 0; i < 16 * 1024; ++i) {  // up to 1 GiB
      if (!c.Send(block)) return;
    }
  });
  std::unique_ptr<HttpProvider> p = Make(Options(server, handoff::v1::TRANSPORT_SSE));
  const int64_t before = PeakRss();
  FetchResult r = p->Fetch("1200");
  const int64_t after = PeakRss();
  SCOPED_TRACE(Describe(r));
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->kind, RefusalKind::kMalformedPage);
  EXPECT_EQ(r.refusal->code, "page_too_large");
  EXPECT_TRUE(absl::StrContains(r.refusal->message, "SSE frame larger than max_page_bytes"));
#ifndef HANDOFF_SANITIZED
  EXPECT_LT(after - before, 200LL << 20);
#endif
  (void)before;
  (void)after;
}

TEST(HostileProviderTest, EndlessSseFrameTrickled) {
  ScriptedServer server([&](ScriptedServer::Conn& c) {
    if (!c.Send(ResponseHead("200 OK", "text/event-stream", -1) + "id: 1\ndata: {")) return;
    while (c.Pause(absl::Milliseconds(100)) && c.Send("x")) {
    }
  });
  HttpProviderOptions o = Options(server, handoff::v1::TRANSPORT_SSE);
  o.sse_silence_timeout = absl::Seconds(1);
  std::unique_ptr<HttpProvider> p = Make(o);
  const absl::Time start = absl::Now();
  FetchResult r = p->Fetch("1200");
  SCOPED_TRACE(Describe(r));
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->kind, RefusalKind::kTransient);
  EXPECT_EQ(r.refusal->code, "sse_silence");
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// Slow loris: a byte a second keeps every idle timer happy; response_timeout ends it.
TEST(HostileProviderTest, SlowLorisBody) {
  ScriptedServer server([&](ScriptedServer::Conn& c) {
    if (!c.Send(ResponseHead("200 OK", "application/json", 100000) + "{")) return;
    while (c.Pause(absl::Seconds(1)) && c.Send(" ")) {
    }
  });
  HttpProviderOptions o = Options(server, handoff::v1::TRANSPORT_POLL);
  o.read_timeout = absl::Seconds(2);
  o.response_timeout = absl::Seconds(3);
  std::unique_ptr<HttpProvider> p = Make(o);
  const absl::Time start = absl::Now();
  FetchResult r = p->Fetch("1200");
  SCOPED_TRACE(Describe(r));
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->kind, RefusalKind::kTransient);
  EXPECT_EQ(r.refusal->code, "timeout");
  EXPECT_TRUE(absl::StrContains(r.refusal->message, "response_timeout"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// Headers trickled a line at a time: the header timeout (read_timeout polling, the silence
// timeout for a stream) counts from the request, so it fires.
TEST(HostileProviderTest, SlowLorisHeaders) {
  ScriptedServer server([&](ScriptedServer::Conn& c) {
    if (!c.Send("HTTP/1.1 200 OK\r\n")) return;
    for (int i = 0; c.Pause(absl::Milliseconds(300)) && c.Send(absl::StrCat("X-Slow-", i, ": 1\r\n")); ++i) {
    }
  });
  for (auto transport : {handoff::v1::TRANSPORT_POLL, handoff::v1::TRANSPORT_SSE}) {
    HttpProviderOptions o = Options(server, transport);
    o.read_timeout = absl::Seconds(2);
    o.sse_silence_timeout = absl::Seconds(2);
    std::unique_ptr<HttpProvider> p = Make(o);
    const absl::Time start = absl::Now();
    FetchResult r = p->Fetch("1200");
    SCOPED_TRACE(Describe(r));
    ASSERT_TRUE(r.refusal.has_value());
    EXPECT_EQ(r.refusal->kind, RefusalKind::kTransient);
    EXPECT_EQ(r.refusal->code, "timeout");
    EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  }
}

// Retry-After may be an HTTP-date (RFC 9110): a 429 saying "30 s from now" as a date is
// honoured as a delay of about 30 s, not read as malformed.
TEST(HostileProviderTest, RetryAfterAsAnHttpDate) {
  const absl::Time when = absl::Now() + absl::Seconds(30);
  const std::string date = absl::FormatTime("%a, %d %b %Y %H:%M:%S GMT", when, absl::UTCTimeZone());
  const std::string body = R"({"error":"rate_limited","details":{"message":"slow down"}})";
  const std::string retry_after = absl::StrCat("Retry-After: ", date, "\r\n");
  ScriptedServer server(Answer(
      ResponseHead("429 Too Many Requests", "application/json", body.size(), retry_after) + body));
  const absl::Time sent = absl::Now();
  FetchResult r = PollOnce(server);
  const absl::Time answered = absl::Now();
  SCOPED_TRACE(Describe(r));
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->kind, RefusalKind::kRetryAfter);
  ASSERT_TRUE(r.refusal->retry_after.has_value());
  // The date is read between `sent` and `answered` (whole seconds: up to 1 s less).
  EXPECT_GE(*r.refusal->retry_after, when - answered - absl::Seconds(1));
  EXPECT_LE(*r.refusal->retry_after, when - sent);
  EXPECT_GE(*r.refusal->retry_after, absl::Seconds(20)) << "a delay, not a malformed date";
}

// An SSE response may open only with its first frame, which the provider writes within 30 s:
// the stream's headers get the 60 s silence rule, not the polled read_timeout.
TEST(HostileProviderTest, SseHeadersLaterThanReadTimeoutButWithinSilence) {
  const std::string page = ReadFile(absl::StrCat(kCorpus, "/page_valid.json"));
  ScriptedServer server([&](ScriptedServer::Conn& c) {
    if (!c.Pause(absl::Milliseconds(1500))) return;
    c.Send(ResponseHead("200 OK", "text/event-stream", -1) +
           absl::StrCat("id: c1210\ndata: ", page, "\n\n"));
    c.Pause(absl::Seconds(30));
  });
  HttpProviderOptions o = Options(server, handoff::v1::TRANSPORT_SSE);
  o.read_timeout = absl::Seconds(1);
  o.sse_silence_timeout = absl::Seconds(10);
  std::unique_ptr<HttpProvider> p = Make(o);
  FetchResult r = p->Fetch("1200");
  SCOPED_TRACE(Describe(r));
  ASSERT_FALSE(r.refusal.has_value());
  ASSERT_TRUE(r.page.has_value());
  EXPECT_EQ(r.page->next, "c1210");
  EXPECT_EQ(server.connections(), 1);
}

// Thousands of headers, then one huge header: never a crash, never unbounded memory;
// libcurl refuses a single header over 100 KiB (a transient transfer failure).
TEST(HostileProviderTest, HeaderFloods) {
  const std::string page = ReadFile(absl::StrCat(kCorpus, "/page_valid.json"));
  std::string many;
  for (int i = 0; i < 10000; ++i) absl::StrAppend(&many, "X-Flood-", i, ": ", std::string(20, 'f'), "\r\n");
  const std::string huge = absl::StrCat("X-Huge: ", std::string(8 << 20, 'h'), "\r\n");
  std::string extra;
  absl::Mutex mu;
  ScriptedServer server([&](ScriptedServer::Conn& c) {
    std::string e;
    {
      absl::MutexLock lock(&mu);
      e = extra;
    }
    c.Send(ResponseHead("200 OK", "application/json", page.size(), e) + page);
  });
  std::unique_ptr<HttpProvider> p = Make(Options(server, handoff::v1::TRANSPORT_POLL));
  {
    absl::MutexLock lock(&mu);
    extra = many;
  }
  FetchResult r = p->Fetch("1200");
  std::printf("10000 headers (%zu bytes): %s\n", many.size(), Describe(r).c_str());
  if (r.refusal) {
    EXPECT_EQ(r.refusal->kind, RefusalKind::kTransient) << Describe(r);
  }
  {
    absl::MutexLock lock(&mu);
    extra = huge;
  }
  const int64_t before = PeakRss();
  r = p->Fetch("1200");
  const int64_t after = PeakRss();
  std::printf("one 8 MiB header: %s\n", Describe(r).c_str());
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->kind, RefusalKind::kTransient) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.refusal->message, "response header is larger")) << Describe(r);
#ifndef HANDOFF_SANITIZED
  EXPECT_LT(after - before, 64LL << 20);
#endif
  (void)before;
  (void)after;
  {
    absl::MutexLock lock(&mu);
    extra.clear();
  }
  EXPECT_TRUE(p->Fetch("1200").page.has_value()) << "the provider recovers";
}

// 301 to another host: never followed (CURLOPT_FOLLOWLOCATION off); a configuration
// error naming the redirect.
TEST(HostileProviderTest, RedirectIsNotFollowed) {
  ScriptedServer elsewhere([](ScriptedServer::Conn& c) {
    c.Send(ResponseHead("200 OK", "application/json", 2) + "{}");
  });
  ScriptedServer server([&](ScriptedServer::Conn& c) {
    c.Send(ResponseHead("301 Moved Permanently", "text/plain", 0,
                        absl::StrCat("Location: ", elsewhere.base_url(), "/v1/pages?steal=1\r\n")));
  });
  for (auto transport : {handoff::v1::TRANSPORT_POLL, handoff::v1::TRANSPORT_SSE}) {
    std::unique_ptr<HttpProvider> p = Make(Options(server, transport));
    FetchResult r = p->Fetch("1200");
    SCOPED_TRACE(Describe(r));
    ASSERT_TRUE(r.refusal.has_value());
    EXPECT_EQ(r.refusal->kind, RefusalKind::kConfigInvalid);
    EXPECT_EQ(r.refusal->http_status, 301);
    EXPECT_TRUE(absl::StrContains(r.refusal->message, "redirects are not followed"));
  }
  EXPECT_EQ(elsewhere.connections(), 0);
}

// A gzip bomb (64 MiB of zeros in 64 KiB): Accept-Encoding is never sent and the body
// is not decoded, so it is a small malformed page, not 64 MiB of memory.
TEST(HostileProviderTest, GzipBombIsNotDecoded) {
  const std::string bomb = ReadFile(absl::StrCat(kCorpus, "/gzip_bomb.gz"));
  ASSERT_GT(bomb.size(), 1000u);
  ScriptedServer server(
      Answer(ResponseHead("200 OK", "application/json", bomb.size(), "Content-Encoding: gzip\r\n") +
             bomb));
  FetchResult r = PollOnce(server);
  SCOPED_TRACE(Describe(r));
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->kind, RefusalKind::kMalformedPage);
  ASSERT_FALSE(server.requests().empty());
  EXPECT_FALSE(absl::StrContains(absl::AsciiStrToLower(server.requests()[0]), "accept-encoding"));
}

// An error status with an endless body: read up to its cap (64 KiB), then classified by
// its status at once instead of reading forever.
TEST(HostileProviderTest, EndlessErrorBody) {
  ScriptedServer server([&](ScriptedServer::Conn& c) {
    if (!c.Send(ResponseHead("503 Service Unavailable", "application/json", -1) +
                R"({"error":"chain_unavailable","retry_after":1,"pad":")")) {
      return;
    }
    std::string block(64 * 1024, 'p');
    for (int i = 0; i < 16 * 1024 && c.Send(block); ++i) {
    }
  });
  for (auto transport : {handoff::v1::TRANSPORT_POLL, handoff::v1::TRANSPORT_SSE}) {
    std::unique_ptr<HttpProvider> p = Make(Options(server, transport));
    const absl::Time start = absl::Now();
    FetchResult r = p->Fetch("1200");
    SCOPED_TRACE(Describe(r));
    ASSERT_TRUE(r.refusal.has_value());
    EXPECT_EQ(r.refusal->http_status, 503);
    EXPECT_TRUE(r.refusal->kind == RefusalKind::kTransient ||
                r.refusal->kind == RefusalKind::kRetryAfter);
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  }
}

// Garbage where a status line belongs, and absurd Content-Lengths: transient failures.
TEST(HostileProviderTest, BrokenResponses) {
  const std::vector<std::string> responses = {
      "garbage\r\n\r\n{}",
      "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n{}",
      "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n{}",
      "HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\n{}",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffffff\r\n",
      "",
  };
  CannedServer canned;
  std::unique_ptr<HttpProvider> p =
      Make(Options(canned.server(), handoff::v1::TRANSPORT_POLL));
  for (const std::string& resp : responses) {
    canned.Set(resp);
    FetchResult r = p->Fetch("1200");
    SCOPED_TRACE(resp.substr(0, 40) + " -> " + Describe(r));
    ASSERT_TRUE(r.refusal.has_value());
    // A broken response is retried (kTransient) or, when it is a complete 200 body,
    // a malformed page; never a configuration halt (it used to be "bad_url").
    EXPECT_TRUE(r.refusal->kind == RefusalKind::kTransient ||
                r.refusal->kind == RefusalKind::kMalformedPage);
    EXPECT_FALSE(r.refusal->message.empty());
    std::printf("%-45s -> %s\n", resp.substr(0, resp.find('\r')).c_str(), Describe(r).c_str());
  }
}

// ----- what a provider's headers and bodies may not smuggle through -------------------

// Whether `text` holds `min_length` or more consecutive bytes of `secret`, in any case.
bool HasFragmentOf(absl::string_view text, absl::string_view secret, size_t min_length) {
  const std::string lower_text = absl::AsciiStrToLower(text);
  const std::string lower_secret = absl::AsciiStrToLower(secret);
  for (size_t i = 0; i + min_length <= lower_secret.size(); ++i) {
    if (absl::StrContains(lower_text, lower_secret.substr(i, min_length))) return true;
  }
  return false;
}

// A 200 from the stream endpoint that is not an event stream is refused with its
// Content-Type named; an API key in that header (mixed case, or cut by a length limit
// anywhere inside it) leaves no part of it in the refusal.
TEST(HostileProviderTest, ANonStreamContentTypeLeavesNoPartOfTheKey) {
  const std::string key = "Sk-MiXeD-CaSe-Key-0123456789abcdef";
  std::vector<std::string> types = {key, absl::StrCat(key, "/json"), absl::StrCat("text/", key),
                                    absl::AsciiStrToLower(key),
                                    absl::StrCat("text/plain; token=", key)};
  // Padded so that any cut at a fixed length splits the key somewhere.
  for (size_t pad = 0; pad <= 80; ++pad) {
    types.push_back(absl::StrCat("text/html; x=", std::string(pad, 'p'), key));
    types.push_back(absl::StrCat("text/html; x=", std::string(pad, 'p'),
                                 absl::AsciiStrToLower(key)));
  }
  CannedServer canned;
  HttpProviderOptions o = Options(canned.server(), handoff::v1::TRANSPORT_SSE);
  o.api_key = key;
  std::unique_ptr<HttpProvider> p = Make(o);
  for (const std::string& type : types) {
    canned.Set(ResponseHead("200 OK", type, 2) + "{}");
    FetchResult r = p->Fetch("1200");
    SCOPED_TRACE(type + " -> " + Describe(r));
    ASSERT_TRUE(r.refusal.has_value());
    EXPECT_EQ(r.refusal->kind, RefusalKind::kMalformedPage);
    EXPECT_EQ(r.refusal->code, "not_event_stream");
    for (const std::string* text :
         {&r.refusal->message, &r.refusal->code, &r.refusal->funding_action_json}) {
      EXPECT_FALSE(HasFragmentOf(*text, key, 6)) << *text;
    }
  }
  // A harmless media type is still named, for the operator.
  canned.Set(ResponseHead("200 OK", "Text/HTML; charset=utf-8", 2) + "{}");
  FetchResult r = p->Fetch("1200");
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_TRUE(absl::StrContains(r.refusal->message, "text/html")) << Describe(r);
}

// A refusal whose body is cut short (a Content-Length larger than what arrives, then the
// connection closes; or a body that stalls) is still the provider's answer: classified
// by its status and Retry-After header, with the code its body began with, else the
// status's default code; never a transient "network" failure retried forever. A 200 cut
// short stays a transient failure (the partial page is dropped).
TEST(HostileProviderTest, ARefusalWithACutBodyIsClassifiedByItsStatus) {
  struct Case {
    std::string status;
    std::string headers;
    std::string body_start;
    RefusalKind kind;
    std::string code;
    std::optional<absl::Duration> retry_after;
  };
  const std::vector<Case> cases = {
      {"409 Conflict", "", R"({"error":"resync_required","details":{"message":"rebuild fr)",
       RefusalKind::kResyncRequired, "resync_required", std::nullopt},
      {"409 Conflict", "", R"({"det)", RefusalKind::kResyncRequired, "resync_required",
       std::nullopt},
      {"409 Conflict", "", R"({"error" : "cursor_mismatch", "details":{)",
       RefusalKind::kConfigInvalid, "cursor_mismatch", std::nullopt},
      {"400 Bad Request", "", R"({"err)", RefusalKind::kConfigInvalid, "invalid_request",
       std::nullopt},
      {"401 Unauthorized", "", R"({"error":"unauth)", RefusalKind::kAuthFailed, "unauthorized",
       std::nullopt},
      {"403 Forbidden", "", "", RefusalKind::kAuthFailed, "forbidden", std::nullopt},
      {"402 Payment Required", "",
       R"({"error":{"code":"insufficient_credit","message":"top up",)",
       RefusalKind::kFundingRequired, "insufficient_credit", std::nullopt},
      {"429 Too Many Requests", "Retry-After: 60\r\n", R"({"error":"rate_li)",
       RefusalKind::kRetryAfter, "rate_limited", absl::Seconds(60)},
      {"503 Service Unavailable", "Retry-After: 7\r\n",
       R"({"error":"chain_unavailable","retry_after":)", RefusalKind::kRetryAfter,
       "chain_unavailable", absl::Seconds(7)},
      {"500 Internal Server Error", "", "{", RefusalKind::kTransient, "", std::nullopt},
      {"200 OK", "", R"({"from":1200,"through":nu)", RefusalKind::kTransient, "network",
       std::nullopt},
  };
  Case current;
  bool stall = false;
  absl::Mutex mu;
  ScriptedServer server([&](ScriptedServer::Conn& c) {
    Case k;
    bool s;
    {
      absl::MutexLock lock(&mu);
      k = current;
      s = stall;
    }
    if (!c.Send(ResponseHead(k.status, "application/json", k.body_start.size() + 100,
                             k.headers) +
                k.body_start)) {
      return;
    }
    if (s) c.Pause(absl::Seconds(30));  // the body stalls (ended by Stop)
  });
  for (bool stalled : {false, true}) {
    for (auto transport : {handoff::v1::TRANSPORT_POLL, handoff::v1::TRANSPORT_SSE}) {
      HttpProviderOptions o = Options(server, transport);
      o.read_timeout = absl::Seconds(1);
      o.sse_silence_timeout = absl::Seconds(1);
      std::unique_ptr<HttpProvider> p = Make(o);
      for (const Case& k : cases) {
        // A 200 cut short is a polled page's affair (a stream's is the corpus's); stalled,
        // two refusals suffice (each waits out the 1 s timeout).
        if (k.status == "200 OK" && (stalled || transport == handoff::v1::TRANSPORT_SSE)) {
          continue;
        }
        if (stalled && k.status != "409 Conflict" && k.status != "429 Too Many Requests") {
          continue;
        }
        {
          absl::MutexLock lock(&mu);
          current = k;
          stall = stalled;
        }
        FetchResult r = p->Fetch("1200");
        SCOPED_TRACE(absl::StrCat(transport, stalled ? " stalled " : " cut ", k.status, " ",
                                  k.body_start, " -> ", Describe(r)));
        ASSERT_TRUE(r.refusal.has_value());
        EXPECT_EQ(r.refusal->kind, k.kind);
        EXPECT_EQ(r.refusal->code, k.code);
        EXPECT_EQ(r.refusal->retry_after, k.retry_after);
        if (k.status != "200 OK") {
          EXPECT_EQ(r.refusal->http_status, std::stoi(k.status));
        }
      }
    }
  }
}

// Interim responses before the real one: a `100 Continue` (or `103 Early Hints` with
// headers of its own) is not the answer, the response after it is, and its headers
// alone count.
TEST(HostileProviderTest, InterimResponsesAreNotTheAnswer) {
  const std::string page = ReadFile(absl::StrCat(kCorpus, "/page_valid.json"));
  const std::string resync = R"({"error":"resync_required"})";
  const std::vector<std::string> interims = {
      "HTTP/1.1 100 Continue\r\n\r\n",
      "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
      "Content-Type: text/event-stream\r\nRetry-After: 99\r\nLink: </x>\r\n\r\n",
  };
  CannedServer canned;
  std::unique_ptr<HttpProvider> p =
      Make(Options(canned.server(), handoff::v1::TRANSPORT_POLL));
  for (const std::string& interim : interims) {
    SCOPED_TRACE(interim);
    canned.Set(interim + ResponseHead("409 Conflict", "application/json", resync.size()) + resync);
    FetchResult r = p->Fetch("1200");
    SCOPED_TRACE(Describe(r));
    ASSERT_TRUE(r.refusal.has_value());
    EXPECT_EQ(r.refusal->kind, RefusalKind::kResyncRequired);
    EXPECT_EQ(r.refusal->http_status, 409);
    EXPECT_EQ(r.refusal->retry_after, std::nullopt);
    canned.Set(interim + ResponseHead("200 OK", "application/json", page.size()) + page);
    r = p->Fetch("1200");
    SCOPED_TRACE(Describe(r));
    ASSERT_TRUE(r.page.has_value());
    EXPECT_FALSE(r.page->items.empty());
  }
}

// Environment variables set for one scope (a proxy for libcurl), restored after it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// An https provider behind a proxy: the proxy's `200 Connection established` to CONNECT
// is not the provider's answer (libcurl is told to keep it from the header callback).
// Here the tunnel then fails (this proxy speaks no TLS): a transient failure, not the
// stream's response taken for a 200 without Content-Type ("not_event_stream", a halt
// once repeated).
TEST(HostileProviderTest, AProxysConnectResponseIsNotTheAnswer) {
  ScriptedServer proxy([](ScriptedServer::Conn& c) {
    if (!absl::StartsWith(c.request(), "CONNECT ")) return;
    c.Send("HTTP/1.1 200 Connection established\r\nProxy-Agent: scripted\r\n\r\n"
           "not a TLS server hello");
  });
  ScopedEnv https_proxy("https_proxy", proxy.base_url().c_str());
  ScopedEnv no_proxy("no_proxy", nullptr);
  ScopedEnv no_proxy_upper("NO_PROXY", nullptr);
  for (auto transport : {handoff::v1::TRANSPORT_POLL, handoff::v1::TRANSPORT_SSE}) {
    HttpProviderOptions o = Options(proxy, transport);
    o.base_url = "https://provider.invalid";
    std::unique_ptr<HttpProvider> p = Make(o);
    FetchResult r = p->Fetch("1200");
    SCOPED_TRACE(absl::StrCat(transport, ": ", Describe(r)));
    ASSERT_TRUE(r.refusal.has_value());
    EXPECT_EQ(r.refusal->kind, RefusalKind::kTransient);
    EXPECT_EQ(r.refusal->http_status, 0);
  }
  ASSERT_FALSE(proxy.requests().empty());
  EXPECT_TRUE(absl::StartsWith(proxy.requests()[0], "CONNECT provider.invalid:443"))
      << proxy.requests()[0];
}

// A stream that begins with a UTF-8 byte order mark: its first frame is what it would be
// without it (a control stays a control, a page whose first line is its data a page).
TEST(HostileProviderTest, AStreamsLeadingByteOrderMarkIsDropped) {
  const std::string page = ReadFile(absl::StrCat(kCorpus, "/page_valid.json"));
  const std::string bom = "\xEF\xBB\xBF";
  std::string stream;
  absl::Mutex mu;
  ScriptedServer server([&](ScriptedServer::Conn& c) {
    std::string s;
    {
      absl::MutexLock lock(&mu);
      s = stream;
    }
    if (!c.Send(ResponseHead("200 OK", "text/event-stream", -1) + bom)) return;
    c.Send(s);  // the mark in a read of its own, if the reads follow the sends
  });
  {
    absl::MutexLock lock(&mu);
    stream = "event: error\ndata: {\"error\":\"resync_required\"}\n\n";
  }
  std::unique_ptr<HttpProvider> p = Make(Options(server, handoff::v1::TRANSPORT_SSE));
  FetchResult r = p->Fetch("1200");
  SCOPED_TRACE(Describe(r));
  ASSERT_TRUE(r.refusal.has_value());
  EXPECT_EQ(r.refusal->kind, RefusalKind::kResyncRequired);
  {
    absl::MutexLock lock(&mu);
    stream = absl::StrCat("data: ", page, "\nid: c1210\n\n");
  }
  r = p->Fetch("1200");
  SCOPED_TRACE(Describe(r));
  ASSERT_TRUE(r.page.has_value());
  EXPECT_FALSE(r.page->items.empty());
}

// A frame whose data is empty (`data:`, `data`, with or without an id) is not an event
// (the SSE spec does not dispatch an empty data buffer): not a malformed page, and the
// page after it is read.
TEST(HostileProviderTest, AFrameWithEmptyDataIsNotAPage) {
  const std::string page = ReadFile(absl::StrCat(kCorpus, "/page_valid.json"));
  ScriptedServer server(Answer(ResponseHead("200 OK", "text/event-stream", -1) +
                               "data:\n\ndata\n\nid: c1205\ndata:\n\nevent: message\ndata: \n\n" +
                               absl::StrCat("id: c1210\ndata: ", page, "\n\n")));
  std::unique_ptr<HttpProvider> p = Make(Options(server, handoff::v1::TRANSPORT_SSE));
  FetchResult r = p->Fetch("1200");
  SCOPED_TRACE(Describe(r));
  ASSERT_TRUE(r.page.has_value());
  EXPECT_EQ(r.page->next, "c1210");
}

// The provider's `error` code goes into last_error, logs and the engine's reasons: a
// hostile body cannot put kilobytes, line breaks or control bytes there (at most 64
// bytes of a safe charset), nor any part of the API key (cut anywhere inside it).
TEST(HostileProviderTest, TheProvidersErrorCodeIsCappedAndSafe) {
  const std::string key = "k3y-Abcdefghijklmnopqrstuvwxyz0123456789";
  const std::vector<std::string> codes = {
      std::string(10000, 'A'),
      absl::StrCat("resync_required\\r\\nX-Injected: 1\\u0000\\u001b[31m", std::string(500, 'z')),
      absl::StrCat(std::string(50, 'c'), key, "-tail"),
      absl::StrCat(std::string(60, 'c'), key),
      absl::StrCat("\\u00e9\\u4e2d", key),
  };
  std::string body;
  bool sse = false;
  absl::Mutex mu;
  ScriptedServer server([&](ScriptedServer::Conn& c) {
    std::string b;
    bool s;
    {
      absl::MutexLock lock(&mu);
      b = body;
      s = sse;
    }
    if (s) {
      c.Send(ResponseHead("200 OK", "text/event-stream", -1) + "event: error\ndata: " + b +
             "\n\n");
    } else {
      c.Send(ResponseHead("400 Bad Request", "application/json", b.size()) + b);
    }
  });
  for (auto transport : {handoff::v1::TRANSPORT_POLL, handoff::v1::TRANSPORT_SSE}) {
    HttpProviderOptions o = Options(server, transport);
    o.api_key = key;
    std::unique_ptr<HttpProvider> p = Make(o);
    for (bool nested : {false, true}) {
      for (const std::string& code : codes) {
        {
          absl::MutexLock lock(&mu);
          sse = transport == handoff::v1::TRANSPORT_SSE;
          body = nested ? absl::StrCat(R"({"error":{"code":")", code, R"(","message":"m"}})")
                        : absl::StrCat(R"({"error":")", code, R"("})");
        }
        FetchResult r = p->Fetch("1200");
        SCOPED_TRACE(absl::StrCat(transport, nested ? " nested " : " ", code.substr(0, 80),
                                  " -> ", Describe(r).substr(0, 300)));
        ASSERT_TRUE(r.refusal.has_value());
        EXPECT_LE(r.refusal->code.size(), 64u);
        EXPECT_FALSE(r.refusal->code.empty());
        for (char ch : r.refusal->code) {
          EXPECT_TRUE(absl::ascii_isalnum(static_cast<unsigned char>(ch)) ||
                      absl::string_view("_-.:[]").find(ch) != absl::string_view::npos)
              << static_cast<int>(static_cast<unsigned char>(ch));
        }
        EXPECT_LE(r.refusal->message.size(), 500u);
        EXPECT_FALSE(absl::StrContains(r.refusal->message, "\n"));
        for (const std::string* text : {&r.refusal->code, &r.refusal->message}) {
          EXPECT_FALSE(HasFragmentOf(*text, key, 6)) << *text;
        }
        // A known code is still known; anything else is not mistaken for one.
        EXPECT_NE(r.refusal->kind, RefusalKind::kResyncRequired);
      }
    }
  }
}

// ----- through the engine --------------------------------------------------------------

// Every state change the engine reports, as it happens: progress, sampled, can miss a
// state that lasts milliseconds (a backoff of 5-20 ms between retries).
class StateRecorder : public consumer::EngineObserver {
 public:
  void OnStateChange(absl::string_view id, handoff::v1::SourceState state,
                     absl::string_view reason) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    changes_.push_back({std::string(id), state, std::string(reason)});
  }
  // Whether `id` entered `state` with a reason containing `reason_part`.
  bool Saw(const std::string& id, handoff::v1::SourceState state,
           absl::string_view reason_part = "") const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    for (const Change& c : changes_) {
      if (c.id == id && c.state == state && absl::StrContains(c.reason, reason_part)) return true;
    }
    return false;
  }

 private:
  struct Change {
    std::string id;
    handoff::v1::SourceState state;
    std::string reason;
  };
  mutable absl::Mutex mu_;
  std::vector<Change> changes_ ABSL_GUARDED_BY(mu_);
};

class EngineRig {
 public:
  explicit EngineRig(const std::string& name, const ScriptedServer& server) {
    const char* base = getenv("TEST_TMPDIR");
    store::StoreOptions so;
    so.path = absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
    absl::StatusOr<std::unique_ptr<store::Store>> s = store::Store::Open(so);
    EXPECT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
    consumer::SourceManagerOptions mo;
    mo.store = store_.get();
    mo.observer = &states_;
    // At the test's own priority: niced workers can starve for minutes under the
    // suite's load (source_manager_test).
    mo.worker.thread_nice = 0;
    mo.worker.fetch_backoff.initial = absl::Milliseconds(5);
    mo.worker.fetch_backoff.max = absl::Milliseconds(20);
    mo.worker.idle_backoff = mo.worker.fetch_backoff;
    mo.factories.provider = [](const handoff::v1::SourceSpec& spec)
        -> absl::StatusOr<std::unique_ptr<consumer::Provider>> {
      HttpProviderOptions o = consumer::OptionsForSpec(spec);
      o.read_timeout = absl::Seconds(1);
      o.response_timeout = absl::Seconds(2);
      o.sse_silence_timeout = absl::Seconds(1);
      return consumer::MakeHttpProvider(std::move(o));
    };
    mo.factories.external_sink = [](const handoff::v1::SourceSpec&) {
      return absl::StatusOr<std::unique_ptr<consumer::ExternalSink>>(nullptr);
    };
    absl::StatusOr<std::unique_ptr<consumer::SourceManager>> m =
        consumer::SourceManager::Create(std::move(mo));
    EXPECT_TRUE(m.ok()) << m.status();
    manager_ = *std::move(m);
    url_ = server.base_url();
  }
  ~EngineRig() {
    manager_->Shutdown();
    manager_.reset();
    store_.reset();
  }

  void Create(const std::string& id, handoff::v1::Transport transport) {
    handoff::v1::CreateSourceRequest req;
    handoff::v1::SourceSpec* spec = req.mutable_spec();
    spec->set_id(id);
    spec->set_provider_url(url_);
    spec->set_chain("sim");
    spec->set_source("logs");
    spec->set_filter("all");
    spec->set_transport(transport);
    spec->mutable_start()->set_block(1200);
    spec->mutable_sink()->mutable_local_rows();
    req.set_start(true);
    absl::StatusOr<handoff::v1::Source> s = manager_->CreateSource(req);
    ASSERT_TRUE(s.ok()) << s.status();
  }

  // Waits on progress changes (no sleeps) until `done`.
  handoff::v1::Progress WaitFor(const std::string& id,
                                const std::function<bool(const handoff::v1::Progress&)>& done,
                                absl::Duration timeout = absl::Seconds(30)) {
    const absl::Time deadline = absl::Now() + timeout;
    uint64_t generation = 0;
    handoff::v1::Progress last;
    while (absl::Now() < deadline) {
      absl::StatusOr<handoff::v1::Progress> p = manager_->WaitProgress(
          id, &generation, std::min(deadline, absl::Now() + absl::Milliseconds(200)));
      if (!p.ok()) continue;
      last = *p;
      if (done(*p)) return last;
    }
    ADD_FAILURE() << "timed out; last progress: " << last.ShortDebugString();
    return last;
  }

  consumer::SourceManager* manager() { return manager_.get(); }
  const StateRecorder& states() const { return states_; }

 private:
  StateRecorder states_;  // outlives the manager
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<consumer::SourceManager> manager_;
  std::string url_;
};

bool Halted(const handoff::v1::Progress& p) {
  return p.state() >= handoff::v1::SOURCE_STATE_RESYNC_REQUIRED &&
         p.state() != handoff::v1::SOURCE_STATE_STOPPING;
}

// Serves `body` for the start cursor and an empty "nothing new" page for anything else.
ScriptedServer::Script ServeAtStart(std::string body, bool sse) {
  return [body = std::move(body), sse](ScriptedServer::Conn& c) {
    if (sse) {
      c.Send(ResponseHead("200 OK", "text/event-stream", -1) +
             absl::StrCat("id: x\ndata: ", body, "\n\n"));
      return;
    }
    c.Send(ResponseHead("200 OK", "application/json", body.size()) + body);
  };
}

// A malformed page, every time: BACKING_OFF (retried), then PROTOCOL_VIOLATION after
// max_malformed_pages (5) in a row, the reason naming the field.
TEST(HostileEngineTest, PersistentMalformedPageHaltsAsProtocolViolation) {
  ScriptedServer server(ServeAtStart(ReadFile(absl::StrCat(kCorpus, "/page_block_invalid_hex.json")), false));
  EngineRig rig("malformed", server);
  rig.Create("m", handoff::v1::TRANSPORT_POLL);
  handoff::v1::Progress p = rig.WaitFor("m", Halted);
  EXPECT_EQ(p.state(), handoff::v1::SOURCE_STATE_PROTOCOL_VIOLATION) << p.ShortDebugString();
  EXPECT_TRUE(absl::StrContains(p.reason(), "5 malformed pages in a row")) << p.reason();
  EXPECT_TRUE(absl::StrContains(p.reason(), "items[0].blockNumber")) << p.reason();
  EXPECT_TRUE(rig.states().Saw("m", handoff::v1::SOURCE_STATE_BACKING_OFF)) << "retried first";
  EXPECT_GE(server.connections(), 5);
  EXPECT_EQ(p.checkpoint().ShortDebugString(), rig.manager()->GetProgress("m")->checkpoint().ShortDebugString());
}

// Contract breaks that parse: the validator halts the source at once, nothing applied.
TEST(HostileEngineTest, ContractBreakingPagesHaltAsProtocolViolation) {
  int n = 0;
  for (const auto& [name, want] : PageCases()) {
    if (!want.engine_violation) continue;
    for (bool sse : {false, true}) {
      SCOPED_TRACE(absl::StrCat(name, sse ? " (sse)" : " (poll)"));
      ScriptedServer server(ServeAtStart(ReadFile(absl::StrCat(kCorpus, "/", name)), sse));
      EngineRig rig(absl::StrCat("violation", n), server);
      const std::string id = absl::StrCat("v", n++);
      rig.Create(id, sse ? handoff::v1::TRANSPORT_SSE : handoff::v1::TRANSPORT_POLL);
      handoff::v1::Progress p = rig.WaitFor(id, Halted);
      EXPECT_EQ(p.state(), handoff::v1::SOURCE_STATE_PROTOCOL_VIOLATION) << p.ShortDebugString();
      EXPECT_FALSE(p.reason().empty());
      std::printf("%s%s -> %s\n", name.c_str(), sse ? " (sse)" : "", p.reason().c_str());
      handoff::v1::QueryEventsRequest q;
      q.set_source_id(id);
      absl::StatusOr<handoff::v1::QueryEventsResponse> events = rig.manager()->QueryEvents(q);
      ASSERT_TRUE(events.ok()) << events.status();
      EXPECT_EQ(events->rows_size(), 0) << "nothing applied";
    }
  }
  EXPECT_EQ(n, 10);
}

// Transient hostility (slow loris, 1 GiB body is not transient; an endless frame, a
// header flood): the source backs off and keeps retrying, it never halts or crashes.
TEST(HostileEngineTest, SlowLorisBacksOff) {
  ScriptedServer server([](ScriptedServer::Conn& c) {
    if (!c.Send(ResponseHead("200 OK", "application/json", 100000) + "{")) return;
    while (c.Pause(absl::Milliseconds(500)) && c.Send(" ")) {
    }
  });
  EngineRig rig("loris", server);
  rig.Create("l", handoff::v1::TRANSPORT_POLL);
  // A second attempt starts: the first ended by the response timeout and was retried.
  handoff::v1::Progress p =
      rig.WaitFor("l", [&](const handoff::v1::Progress&) { return server.connections() >= 2; });
  EXPECT_TRUE(rig.states().Saw("l", handoff::v1::SOURCE_STATE_BACKING_OFF, "response_timeout"));
  EXPECT_TRUE(absl::StrContains(p.last_error().message(), "timeout")) << p.ShortDebugString();
  EXPECT_FALSE(Halted(p));
}

TEST(HostileEngineTest, GibibyteBodyHaltsAfterRepetition) {
  ScriptedServer server([](ScriptedServer::Conn& c) {
    if (!c.Send(ResponseHead("200 OK", "application/json", -1) + "{\"from\":1200,\"x\":\"")) return;
    std::string block(64 * 1024, 'a');
    for (int i = 0; i < 16 * 1024 && c.Send(block); ++i) {
    }
  });
  EngineRig rig("huge", server);
  rig.Create("h", handoff::v1::TRANSPORT_POLL);
  handoff::v1::Progress p = rig.WaitFor("h", Halted, absl::Seconds(120));
  EXPECT_EQ(p.state(), handoff::v1::SOURCE_STATE_PROTOCOL_VIOLATION);
  EXPECT_TRUE(absl::StrContains(p.reason(), "max_page_bytes")) << p.reason();
}

}  // namespace
}  // namespace handoff::tests
