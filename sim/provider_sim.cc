#include "sim/provider_sim.h"

#include <malloc.h>

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace handoff::sim {

void KeepFreedMemoryForReuse() {
  // Fixed thresholds (mallopt turns glibc's dynamic ones off): blocks up to 64 MiB come
  // from the arenas, and an arena keeps up to 256 MiB of free memory at its top.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}
namespace {

constexpr absl::string_view kFaultNames[kFaultCount] = {
    "truncated_body",    "drop_connection",  "incomplete_sse_frame", "chain_unavailable",
    "rate_limited",      "resync_required",  "payment_required",     "server_error",
    "sse_silence",       "overlapping_page", "non_advancing_cursor", "out_of_order_items",
};

constexpr size_t kMaxRecords = 10000;

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(&out, "\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

std::string ErrorBody(absl::string_view code, absl::string_view detail) {
  return absl::StrCat("{\"error\":", JsonString(code), ",\"details\":{\"message\":",
                      JsonString(detail), "}}");
}

std::string FundingBody() {
  return "{\"error\":{\"code\":\"insufficient_credit\",\"message\":\"credit exhausted\","
         "\"challenges\":[{\"type\":\"top_up\",\"amount\":\"25.00\",\"currency\":\"USD\"}],"
         "\"credit\":{\"balance\":\"0.00\",\"currency\":\"USD\"},"
         "\"next_action\":{\"type\":\"top_up\",\"url\":\"https://billing.example.invalid/"
         "top-up?account=sim\"}}}";
}

void SetJson(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json");
}

}  // namespace

absl::string_view FaultName(Fault fault) { return kFaultNames[static_cast<int>(fault)]; }

std::optional<Fault> FaultFromName(absl::string_view name) {
  for (int i = 0; i < kFaultCount; ++i) {
    if (kFaultNames[i] == name) return static_cast<Fault>(i);
  }
  return std::nullopt;
}

struct ProviderSim::Params {
  std::string source, filter, from;
  uint64_t binding = 0;
  uint32_t limit = 1000;
  bool latest = false;
  CursorPosition position;
};

// One open SSE connection.
struct ProviderSim::Stream {
  Params params;
  CursorPosition position;
  std::string cursor;  // the `next` a heartbeat repeats
  absl::Time last_write;
};

ProviderSim::ProviderSim(ProviderSimOptions options)
    : options_(std::move(options)),
      codec_(Mix64(options_.chain.seed ^ 0x637572736f72ULL)),
      chain_(options_.chain),
      server_(std::make_unique<httplib::Server>()),
      settings_(options_.fault_settings),
      rng_(options_.fault_seed) {}

ProviderSim::~ProviderSim() { Stop(); }

std::string ProviderSim::base_url() const { return absl::StrCat("http://", options_.host, ":", port_); }

absl::StatusOr<int> ProviderSim::Start(int port) {
  httplib::Server& s = *server_;
  const int threads = std::max(4, options_.threads);
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_keep_alive_max_count(1u << 30);
  s.set_keep_alive_timeout(
      std::max<time_t>(1, absl::ToInt64Seconds(options_.keep_alive_timeout)));
  s.set_read_timeout(30, 0);
  s.set_write_timeout(120, 0);
  s.set_tcp_nodelay(true);
  s.Get("/v1/pages", [this](const httplib::Request& q, httplib::Response& r) { HandlePages(q, r); });
  s.Get("/v1/stream", [this](const httplib::Request& q, httplib::Response& r) { HandleStream(q, r); });
  auto admin = [this](const httplib::Request& q, httplib::Response& r) { HandleAdmin(q, r); };
  s.Get(R"(/sim/.*)", admin);
  s.Post(R"(/sim/.*)", admin);
  // httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into
  // Debian's libcpp-httplib): when 64 sources connect at once, the accept queue
  // overflows, the kernel drops SYNs, and a client retries its connect only after 1 s,
  // then 3 s (bench: 69-170 listen overflows and 32-57 SYN retransmissions per 64-source
  // run, and sources that started seconds late). The socket is listened on again, with
  // the system's limit, once bound; Linux takes the new backlog for a listening socket.
  int listen_fd = -1;
  s.set_socket_options([&listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = sock;
  });
  int bound = port == 0 ? s.bind_to_any_port(options_.host) : (s.bind_to_port(options_.host, port) ? port : -1);
  if (bound <= 0) return absl::UnavailableError(absl::StrCat("cannot bind ", options_.host, ":", port));
  if (listen_fd < 0 || ::listen(listen_fd, SOMAXCONN) != 0) {
    return absl::InternalError("cannot widen the HTTP server's listen backlog");
  }
  port_ = bound;
  listener_ = std::thread([this] { server_->listen_after_bind(); });
  // httplib's stop() is a no-op until the listen loop runs: wait for it to start.
  absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!server_->is_running() && absl::Now() < give_up) absl::SleepFor(absl::Microseconds(200));
  if (!server_->is_running()) return absl::InternalError("HTTP server did not start");
  return bound;
}

void ProviderSim::Stop() {
  stopping_.store(true);
  chain_.Poke();
  { absl::MutexLock lock(&mu_); }  // wakes SleepUnlessStopping
  server_->stop();
  if (listener_.joinable()) listener_.join();
}

void ProviderSim::ArmFault(Fault fault, int count) {
  absl::MutexLock lock(&mu_);
  faults_[static_cast<int>(fault)].remaining = count;
  chain_.Touch();  // open streams waiting for blocks check the fault now
}

void ProviderSim::SetFaultProbability(Fault fault, double probability) {
  absl::MutexLock lock(&mu_);
  faults_[static_cast<int>(fault)].probability = probability;
  chain_.Touch();
}

void ProviderSim::ClearFaults() {
  absl::MutexLock lock(&mu_);
  faults_.fill(FaultState{});
}

void ProviderSim::SetFaultSettings(const FaultSettings& settings) {
  absl::MutexLock lock(&mu_);
  settings_ = settings;
}

FaultSettings ProviderSim::Settings() const {
  absl::MutexLock lock(&mu_);
  return settings_;
}

bool ProviderSim::Fire(Fault fault) {
  absl::MutexLock lock(&mu_);
  FaultState& f = faults_[static_cast<int>(fault)];
  if (f.remaining > 0) {
    --f.remaining;
    return true;
  }
  return f.probability > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < f.probability;
}

std::string ProviderSim::EncodeCursor(absl::string_view source, absl::string_view filter,
                                      CursorPosition position) const {
  return codec_.Encode(SourceBinding(options_.chain_name, source, filter), position);
}

void ProviderSim::Record(RequestRecord record) {
  record.at = absl::Now();
  absl::MutexLock lock(&mu_);
  requests_.push_back(std::move(record));
  if (requests_.size() > kMaxRecords) requests_.pop_front();
  ++request_total_;
}

std::vector<RequestRecord> ProviderSim::Requests() const {
  absl::MutexLock lock(&mu_);
  return std::vector<RequestRecord>(requests_.begin(), requests_.end());
}

bool ProviderSim::WaitForRequests(size_t n, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  struct Args {
    const ProviderSim* sim;
    size_t n;
  } args{this, n};
  auto done = +[](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->sim->request_total_ >= a->n; };
  return mu_.AwaitWithTimeout(absl::Condition(done, &args), timeout);
}

bool ProviderSim::Admit(const httplib::Request& req, bool sse, Params* p,
                        httplib::Response& res, RequestRecord* record) {
  record->path = req.path;
  record->remote_port = req.remote_port;
  record->from = req.get_param_value("from");
  record->has_last_event_id = req.has_header("Last-Event-ID");
  record->last_event_id = req.get_header_value("Last-Event-ID");
  std::string auth = req.get_header_value("Authorization");
  record->had_authorization = !auth.empty();
  record->authorized = options_.bearer_token.empty() ||
                       auth == absl::StrCat("Bearer ", options_.bearer_token);
  if (!options_.bearer_token.empty()) {
    if (auth.empty()) {
      SetJson(res, 401, ErrorBody("unauthorized", "missing bearer token"));
      return false;
    }
    if (!record->authorized) {
      SetJson(res, 403, ErrorBody("forbidden", "bearer token not accepted"));
      return false;
    }
  }
  for (const char* name : {"chain", "source", "filter", "from"}) {
    if (!req.has_param(name) || req.get_param_value(name).empty()) {
      SetJson(res, 400, ErrorBody("invalid_request", absl::StrCat("missing parameter ", name)));
      return false;
    }
  }
  if (req.get_param_value("chain") != options_.chain_name) {
    SetJson(res, 400, ErrorBody("invalid_request", "unknown chain"));
    return false;
  }
  p->source = req.get_param_value("source");
  p->filter = req.get_param_value("filter");
  p->binding = SourceBinding(options_.chain_name, p->source, p->filter);
  if (req.has_param("limit")) {
    uint32_t limit = 0;
    if (!absl::SimpleAtoi(req.get_param_value("limit"), &limit) || limit == 0 || limit > 1000) {
      SetJson(res, 400, ErrorBody("invalid_request", "limit must be 1..1000"));
      return false;
    }
    p->limit = limit;
  }
  p->from = req.get_param_value("from");
  if (sse && record->has_last_event_id) {
    if (record->last_event_id == "latest" || record->last_event_id.empty()) {
      SetJson(res, 400, ErrorBody("invalid_request", "Last-Event-ID must be a cursor or block"));
      return false;
    }
    p->from = record->last_event_id;  // the header wins
  }
  if (StatusFault(res)) return false;
  ChainView view = chain_.View();
  uint64_t block = 0;
  if (p->from == "latest") {
    p->latest = true;
    p->position = CursorPosition{view.head + 1, view.epoch};
  } else if (absl::SimpleAtoi(p->from, &block)) {
    p->position = CursorPosition{block, view.epoch};
  } else {
    absl::StatusOr<CursorPosition> pos = codec_.Decode(p->binding, p->from);
    if (!pos.ok()) {
      if (pos.status().code() == absl::StatusCode::kFailedPrecondition) {
        SetJson(res, 409, ErrorBody("cursor_mismatch", pos.status().message()));
      } else {
        SetJson(res, 400, ErrorBody("invalid_request", pos.status().message()));
      }
      return false;
    }
    if (pos->epoch > view.epoch || pos->block > view.head + 1) {
      SetJson(res, 409, ErrorBody("resync_required", "cursor is ahead of this chain"));
      return false;
    }
    p->position = *pos;
  }
  return true;
}

bool ProviderSim::StatusFault(httplib::Response& res) {
  FaultSettings settings = Settings();
  if (Fire(Fault::kChainUnavailable)) {
    SetJson(res, 503, absl::StrCat("{\"error\":\"chain_unavailable\",\"retry_after\":",
                                   settings.retry_after_seconds, "}"));
  } else if (Fire(Fault::kRateLimited)) {
    res.set_header("Retry-After", std::to_string(settings.rate_limit_seconds));
    SetJson(res, 429, ErrorBody("rate_limited", "slow down"));
  } else if (Fire(Fault::kResyncRequired)) {
    SetJson(res, 409, ErrorBody("resync_required", "cannot continue from this cursor"));
  } else if (Fire(Fault::kPaymentRequired)) {
    SetJson(res, 402, FundingBody());
  } else if (Fire(Fault::kServerError)) {
    SetJson(res, 500, ErrorBody("internal", "simulated server error"));
  } else {
    return false;
  }
  return true;
}

// An `event: error` control frame for a status fault that fired mid-stream.
std::optional<std::string> ProviderSim::ControlFault() {
  FaultSettings settings = Settings();
  std::string data;
  std::string retry;
  if (Fire(Fault::kChainUnavailable)) {
    data = absl::StrCat("{\"error\":\"chain_unavailable\",\"retry_after\":",
                        settings.retry_after_seconds, "}");
  } else if (Fire(Fault::kRateLimited)) {
    data = absl::StrCat("{\"error\":\"rate_limited\",\"retry_after\":",
                        settings.rate_limit_seconds, "}");
  } else if (Fire(Fault::kResyncRequired)) {
    data = "{\"error\":\"resync_required\"}";
  } else if (Fire(Fault::kPaymentRequired)) {
    data = FundingBody();
    retry = "retry: 60000\n";
  } else if (Fire(Fault::kServerError)) {
    data = "{\"error\":\"internal\"}";
  } else {
    return std::nullopt;
  }
  return absl::StrCat("event: error\n", retry, "data: ", data, "\n\n");
}

ProviderSim::PageText ProviderSim::RenderPage(PageContent& page, const std::string& next,
                                              absl::string_view before,
                                              absl::string_view after) const {
  const bool q = options_.decimal_strings;
  auto num = [q](uint64_t n) { return q ? absl::StrCat("\"", n, "\"") : absl::StrCat(n); };
  auto mark = [&](const std::optional<uint64_t>& n, const std::string& hash) {
    return n ? absl::StrCat("{\"number\":", num(*n), ",\"hash\":\"", hash, "\"}")
             : std::string("null");
  };
  PageText text;
  absl::StrAppend(&text.head, before, "{\"from\":", num(page.from), ",\"through\":",
                  mark(page.through, page.through_hash), ",\"next\":", JsonString(next),
                  ",\"reorg\":", page.reorg ? "true" : "false", ",\"safe\":",
                  mark(page.view.safe, page.safe_hash), ",\"finalized\":",
                  mark(page.view.finalized, page.finalized_hash), ",\"tip\":",
                  num(page.view.head), ",\"items\":[");
  text.items = std::move(page.items_json);
  absl::StrAppend(&text.tail, "]}", after);
  return text;
}

bool ProviderSim::PageText::Write(size_t offset, size_t end, httplib::DataSink& sink) const {
  size_t part_start = 0;
  for (const std::string* part : {&head, &items, &tail}) {
    const size_t part_end = part_start + part->size();
    const size_t from = std::max(offset, part_start), to = std::min(end, part_end);
    if (from < to && !sink.write(part->data() + (from - part_start), to - from)) return false;
    part_start = part_end;
  }
  return true;
}

void ProviderSim::HandlePages(const httplib::Request& req, httplib::Response& res) {
  RequestRecord record;
  Params p;
  if (!Admit(req, false, &p, res, &record)) {
    record.status = res.status;
    Record(std::move(record));
    return;
  }
  if (options_.response_delay > absl::ZeroDuration()) absl::SleepFor(options_.response_delay);
  PageContent page;
  std::string next;
  if (Fire(Fault::kNonAdvancingCursor)) {
    // An empty page at the head. Built at the current epoch: epoch 0 would make it a
    // correction page (reorg: true, full of items) after any reorg, with next == the
    // request cursor: a contract violation instead of the empty page this fault means.
    const ChainView v = chain_.View();
    page = chain_.BuildPage(CursorPosition{v.head + 1, v.epoch}, p.limit);
    page.from = p.position.block;
    next = p.from;
  } else {
    PageFaults faults;
    faults.overlap = Fire(Fault::kOverlappingPage);
    faults.swap_items = Fire(Fault::kOutOfOrderItems);
    page = chain_.BuildPage(p.position, p.limit, faults);
    // Nothing new: the request cursor comes back unchanged (but "latest" resolves).
    next = (!page.through && !page.reorg && !p.latest) ? p.from : codec_.Encode(p.binding, page.next);
  }
  auto body = std::make_shared<PageText>(RenderPage(page, next));
  const bool truncate = Fire(Fault::kTruncatedBody);
  const bool drop = !truncate && Fire(Fault::kDropConnection);
  res.status = 200;
  res.set_content_provider(
      body->size(), "application/json",
      [body, truncate, drop](size_t offset, size_t length, httplib::DataSink& sink) {
        if (drop) return false;
        if (truncate) {
          body->Write(0, body->size() / 2, sink);
          return false;
        }
        return body->Write(offset, offset + length, sink);
      });
  record.status = 200;
  Record(std::move(record));
}

void ProviderSim::HandleStream(const httplib::Request& req, httplib::Response& res) {
  RequestRecord record;
  auto stream = std::make_shared<Stream>();
  if (!Admit(req, true, &stream->params, res, &record)) {
    record.status = res.status;
    Record(std::move(record));
    return;
  }
  stream->position = stream->params.position;
  stream->cursor = stream->params.latest
                       ? codec_.Encode(stream->params.binding, stream->position)
                       : stream->params.from;
  // A "latest" stream tells the client its real cursor at once.
  stream->last_write = stream->params.latest ? absl::InfinitePast() : absl::Now();
  record.status = 200;
  Record(std::move(record));
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  open_streams_.fetch_add(1);
  auto step = [this, stream](size_t, httplib::DataSink& sink) { return StreamStep(*stream, sink); };
  auto released = [this](bool) { open_streams_.fetch_sub(1); };
  if (options_.sse_close_delimited) {
    res.set_header("Connection", "close");
    res.set_content_provider("text/event-stream", std::move(step), std::move(released));
  } else {
    res.set_chunked_content_provider("text/event-stream", std::move(step), std::move(released));
  }
}

bool ProviderSim::SleepUnlessStopping(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  auto stopping = +[](std::atomic<bool>* flag) { return flag->load(); };
  return !mu_.AwaitWithTimeout(absl::Condition(stopping, &stopping_), d);
}

bool ProviderSim::StreamStep(Stream& s, httplib::DataSink& sink) {
  if (stopping_.load()) return false;
  if (Fire(Fault::kDropConnection)) return false;
  if (std::optional<std::string> control = ControlFault()) {
    sink.write(control->data(), control->size());
    sink.done();
    return true;
  }
  if (Fire(Fault::kSseSilence)) {
    bool alive = SleepUnlessStopping(Settings().silence);
    s.last_write = absl::Now();
    return alive;
  }
  const uint64_t seen = chain_.ChangeCount();
  PageContent page = chain_.BuildPage(s.position, s.params.limit);
  const bool has_page = page.through.has_value() || page.reorg;
  bool advances = false;
  std::string next;
  if (has_page) {
    if (Fire(Fault::kNonAdvancingCursor)) {
      // The current epoch, as in HandlePages: an empty page, never a correction.
      const ChainView v = chain_.View();
      page = chain_.BuildPage(CursorPosition{v.head + 1, v.epoch}, s.params.limit);
      page.from = s.position.block;
      next = s.cursor;
    } else {
      PageFaults faults;
      faults.overlap = Fire(Fault::kOverlappingPage);
      faults.swap_items = Fire(Fault::kOutOfOrderItems);
      if (faults.overlap || faults.swap_items) {
        page = chain_.BuildPage(s.position, s.params.limit, faults);
      }
      next = codec_.Encode(s.params.binding, page.next);
      advances = true;
    }
  } else {
    // Nothing new: wait for the chain to change, or write a heartbeat when it is due.
    const absl::Time due = s.last_write + options_.heartbeat;
    if (absl::Now() < due) {
      chain_.WaitForChange(seen, due, &stopping_);
      return !stopping_.load();  // the next step re-plans (a page or the heartbeat)
    }
    next = s.cursor;
  }
  // Sent in parts: copying a ~1 MB page into its frame was ~30 % of the simulator's CPU
  // samples (perf), on the cores the benchmark shares with it.
  const PageText frame =
      RenderPage(page, next, absl::StrCat("id: ", next, "\ndata: "), "\n\n");
  if (Fire(Fault::kIncompleteSseFrame) || Fire(Fault::kTruncatedBody)) {
    frame.Write(0, frame.size() / 2, sink);
    return false;
  }
  if (!frame.Write(0, frame.size(), sink)) return false;
  s.last_write = absl::Now();
  s.cursor = next;
  if (advances) s.position = page.next;
  return true;
}

void ProviderSim::HandleAdmin(const httplib::Request& req, httplib::Response& res) {
  const std::string& path = req.path;
  auto u64 = [&req](const char* name, uint64_t def) {
    uint64_t v = def;
    if (req.has_param(name) && !absl::SimpleAtoi(req.get_param_value(name), &v)) v = def;
    return v;
  };
  auto opt = [](const std::optional<uint64_t>& v) {
    return v ? absl::StrCat(*v) : std::string("null");
  };
  if (path == "/sim/status") {
    ChainView v = chain_.View();
    size_t total;
    {
      absl::MutexLock lock(&mu_);
      total = request_total_;
    }
    SetJson(res, 200,
            absl::StrCat("{\"head\":", v.head, ",\"epoch\":", v.epoch, ",\"safe\":", opt(v.safe),
                         ",\"finalized\":", opt(v.finalized), ",\"requests\":", total,
                         ",\"open_streams\":", open_streams_.load(), "}"));
  } else if (path == "/sim/canonical") {
    ChainView v = chain_.View();
    uint64_t from = u64("from", chain_.options().genesis);
    uint64_t to = std::min(u64("to", v.head), v.head);
    if (to >= from && (to - from + 1) * chain_.options().logs_per_block > 200000) {
      SetJson(res, 400, ErrorBody("invalid_request", "range too large (max 200000 logs)"));
      return;
    }
    uint32_t count = 0;
    std::string items = to >= from ? chain_.CanonicalJson(from, to, &count) : std::string();
    SetJson(res, 200,
            absl::StrCat("{\"head\":", v.head, ",\"epoch\":", v.epoch, ",\"from\":", from,
                         ",\"to\":", to, ",\"count\":", count, ",\"items\":[", items, "]}"));
  } else if (req.method != "POST") {
    SetJson(res, 405, ErrorBody("invalid_request", "admin endpoints are POST"));
  } else if (path == "/sim/admin/fault") {
    std::optional<Fault> fault = FaultFromName(req.get_param_value("kind"));
    if (!fault) {
      SetJson(res, 400, ErrorBody("invalid_request", "unknown fault kind"));
      return;
    }
    double p = 0;
    if (req.has_param("probability")) {
      if (!absl::SimpleAtod(req.get_param_value("probability"), &p) || p < 0 || p > 1) {
        SetJson(res, 400, ErrorBody("invalid_request", "probability must be in [0,1]"));
        return;
      }
      SetFaultProbability(*fault, p);
    } else {
      ArmFault(*fault, static_cast<int>(u64("count", 1)));
    }
    SetJson(res, 200, "{\"ok\":true}");
  } else if (path == "/sim/admin/faults/clear") {
    ClearFaults();
    SetJson(res, 200, "{\"ok\":true}");
  } else if (path == "/sim/admin/settings") {
    FaultSettings f = Settings();
    f.retry_after_seconds = static_cast<int>(u64("retry_after", f.retry_after_seconds));
    f.rate_limit_seconds = static_cast<int>(u64("rate_limit", f.rate_limit_seconds));
    f.silence = absl::Milliseconds(u64("silence_ms", absl::ToInt64Milliseconds(f.silence)));
    SetFaultSettings(f);
    SetJson(res, 200, "{\"ok\":true}");
  } else if (path == "/sim/admin/reorg") {
    absl::StatusOr<uint64_t> fork = chain_.Reorg(static_cast<uint32_t>(u64("depth", 3)));
    if (!fork.ok()) {
      SetJson(res, 409, ErrorBody("no_reorg", fork.status().message()));
      return;
    }
    SetJson(res, 200, absl::StrCat("{\"fork\":", *fork, "}"));
  } else if (path == "/sim/admin/advance") {
    chain_.AddBlocks(u64("blocks", 1));
    SetJson(res, 200, absl::StrCat("{\"head\":", chain_.View().head, "}"));
  } else {
    SetJson(res, 404, ErrorBody("not_found", path));
  }
}

}  // namespace handoff::sim
