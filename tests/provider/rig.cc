#include "tests/provider/rig.h"

#include <cstdlib>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "consumer/provider/http_provider.h"

namespace handoff::tests {

void Journal::Add(const std::string& id, FetchRecord r) {
  absl::MutexLock lock(&mu_);
  records_[id].push_back(std::move(r));
}

std::vector<FetchRecord> Journal::Of(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(id);
  return it == records_.end() ? std::vector<FetchRecord>() : it->second;
}

std::vector<std::string> Journal::AllCursors() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [id, records] : records_) {
    for (const FetchRecord& r : records) out.push_back(r.cursor);
  }
  return out;
}

std::optional<absl::Time> Journal::FirstFetchOf(const std::string& cursor) const {
  absl::MutexLock lock(&mu_);
  std::optional<absl::Time> first;
  for (const auto& [id, records] : records_) {
    for (const FetchRecord& r : records) {
      if (r.cursor == cursor && (!first || r.started < *first)) first = r.started;
    }
  }
  return first;
}

consumer::FetchResult RecordingProvider::Fetch(const std::string& committed_cursor) {
  FetchRecord r;
  r.cursor = committed_cursor;
  r.started = absl::Now();
  consumer::FetchResult result = inner().Fetch(committed_cursor);
  r.ended = absl::Now();
  if (result.page) {
    const consumer::Page& p = *result.page;
    r.is_page = true;
    r.from = p.from;
    r.has_through = p.through.has_value();
    r.through = p.through ? p.through->number : 0;
    r.next = p.next;
    r.reorg = p.reorg;
    r.items = p.items.size();
    r.has_finalized = p.finalized.has_value();
    r.finalized = p.finalized ? p.finalized->number : 0;
  } else {
    r.kind = result.refusal->kind;
    r.http_status = result.refusal->http_status;
    r.code = result.refusal->code;
    r.retry_after = result.refusal->retry_after;
  }
  // A cancelled fetch (shutdown) is not something the provider said.
  if (r.is_page || r.kind != consumer::RefusalKind::kCancelled) journal_->Add(id_, std::move(r));
  return result;
}

void RecordingObserver::OnRefusal(absl::string_view id, absl::string_view code) {
  absl::MutexLock lock(&mu_);
  refusals_[std::string(id)].emplace_back(code);
  texts_.emplace_back(code);
}

void RecordingObserver::OnStateChange(absl::string_view id, handoff::v1::SourceState state,
                                      absl::string_view reason) {
  absl::MutexLock lock(&mu_);
  states_.push_back(StateChange{std::string(id), state, std::string(reason)});
  texts_.emplace_back(reason);
}

void RecordingObserver::OnError(absl::string_view id, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  texts_.push_back(status.ToString());
}

void RecordingObserver::OnCorrection(absl::string_view id, uint64_t depth) {
  absl::MutexLock lock(&mu_);
  texts_.push_back(absl::StrCat("correction ", depth));
}

std::vector<std::string> RecordingObserver::Texts() const {
  absl::MutexLock lock(&mu_);
  return texts_;
}

std::vector<RecordingObserver::StateChange> RecordingObserver::States(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  std::vector<StateChange> out;
  for (const StateChange& s : states_) {
    if (s.id == id) out.push_back(s);
  }
  return out;
}

std::vector<std::string> RecordingObserver::Refusals(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = refusals_.find(id);
  return it == refusals_.end() ? std::vector<std::string>() : it->second;
}

bool RecordingObserver::SawState(const std::string& id, handoff::v1::SourceState state) const {
  for (const StateChange& s : States(id)) {
    if (s.state == state) return true;
  }
  return false;
}

bool IsHalted(handoff::v1::SourceState s) { return consumer::IsHaltedState(s); }

sim::ProviderSimOptions DefaultSimOptions() {
  sim::ProviderSimOptions o;
  o.chain.seed = 11;
  o.chain.initial_head = 200;
  o.chain.logs_per_block = 3;
  o.chain.safe_lag = 5;
  o.chain.finality_lag = 20;
  o.bearer_token = kToken;
  o.heartbeat = absl::Milliseconds(200);
  o.threads = 32;
  o.fault_settings.retry_after_seconds = 1;
  o.fault_settings.rate_limit_seconds = 2;
  o.fault_settings.silence = absl::Seconds(5);
  return o;
}

void ProviderRigTest::SetUp() {
  setenv(kKeyEnv, kToken, 1);
  setenv(kWrongKeyEnv, kWrongKey, 1);
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const char* base = getenv("TEST_TMPDIR");
  dir_ = absl::StrCat(base != nullptr ? base : "/tmp", "/",
                      absl::StrReplaceAll(absl::StrCat(info->test_suite_name(), ".", info->name()),
                                          {{"/", "_"}}));
  StartSim(DefaultSimOptions());
  Open();
}

void ProviderRigTest::TearDown() {
  manager_.reset();
  store_.reset();
  if (sim_) sim_->Stop();
}

void ProviderRigTest::StartSim(sim::ProviderSimOptions options, int port) {
  if (sim_) sim_->Stop();
  sim_ = std::make_unique<sim::ProviderSim>(std::move(options));
  absl::StatusOr<int> bound = sim_->Start(port);
  ASSERT_TRUE(bound.ok()) << bound.status();
}

void ProviderRigTest::Open() {
  store::StoreOptions so;
  so.path = dir_;
  absl::StatusOr<std::unique_ptr<store::Store>> s = store::Store::Open(so);
  ASSERT_TRUE(s.ok()) << s.status();
  store_ = *std::move(s);
  consumer::SourceManagerOptions mo;
  mo.store = store_.get();
  mo.observer = &observer_;
  // At the test's own priority: niced workers can starve for minutes under the
  // suite's load (source_manager_test).
  mo.worker.thread_nice = 0;
  mo.worker.fetch_backoff.initial = fetch_backoff_initial_;
  mo.worker.fetch_backoff.max = fetch_backoff_max_;
  mo.worker.idle_backoff = idle_backoff_.value_or(mo.worker.fetch_backoff);
  // As server/factories.cc builds it, with test timeouts.
  mo.factories.provider = [this](const handoff::v1::SourceSpec& spec)
      -> absl::StatusOr<std::unique_ptr<consumer::Provider>> {
    consumer::HttpProviderOptions o = consumer::OptionsForSpec(spec);
    auto override_it = filter_override_.find(spec.id());
    if (override_it != filter_override_.end()) o.filter = override_it->second;
    if (spec.has_api_key()) {
      const char* key = getenv(spec.api_key().env().c_str());
      if (key == nullptr) return absl::FailedPreconditionError("api_key.env is not set");
      o.api_key = key;
    }
    o.connect_timeout = absl::Seconds(2);
    o.read_timeout = absl::Seconds(5);
    o.sse_silence_timeout = sse_silence_;
    o.page_budget = page_budget_;
    absl::StatusOr<std::unique_ptr<consumer::HttpProvider>> p =
        consumer::HttpProvider::Create(std::move(o));
    if (!p.ok()) return p.status();
    return std::unique_ptr<consumer::Provider>(
        new RecordingProvider(*std::move(p), &journal_, spec.id()));
  };
  absl::StatusOr<std::unique_ptr<consumer::SourceManager>> m =
      consumer::SourceManager::Create(std::move(mo));
  ASSERT_TRUE(m.ok()) << m.status();
  manager_ = *std::move(m);
  ASSERT_TRUE(manager_->Recover().ok());
}

void ProviderRigTest::Restart() {
  manager_.reset();
  store_.reset();
  Open();
}

handoff::v1::SourceSpec ProviderRigTest::Spec(const std::string& id,
                                              handoff::v1::Transport transport,
                                              uint64_t start_block, uint32_t page_limit) {
  handoff::v1::SourceSpec spec;
  spec.set_id(id);
  spec.set_provider_url(sim_->base_url());
  spec.set_chain("sim");
  spec.set_source("logs");
  spec.set_filter(absl::StrCat("filter-", id));
  spec.set_transport(transport);
  spec.mutable_start()->set_block(start_block);
  spec.set_page_limit(page_limit);
  spec.mutable_api_key()->set_env(kKeyEnv);
  return spec;
}

void ProviderRigTest::Create(const handoff::v1::SourceSpec& spec) {
  handoff::v1::CreateSourceRequest req;
  *req.mutable_spec() = spec;
  req.set_start(true);
  absl::StatusOr<handoff::v1::Source> s = manager_->CreateSource(req);
  ASSERT_TRUE(s.ok()) << s.status();
}

bool ProviderRigTest::WaitFor(const std::string& id,
                              const std::function<bool(const handoff::v1::Progress&)>& done,
                              absl::Duration timeout, handoff::v1::Progress* last) {
  const absl::Time deadline = absl::Now() + timeout;
  uint64_t generation = 0;
  while (true) {
    // A bounded wait: a condition on the simulator (its head) can change without a
    // progress change.
    absl::StatusOr<handoff::v1::Progress> p = manager_->WaitProgress(
        id, &generation, std::min(deadline, absl::Now() + absl::Milliseconds(100)));
    if (p.ok()) {
      if (last != nullptr) *last = *p;
      if (done(*p)) return true;
    }
    if (absl::Now() >= deadline) return false;
  }
}

bool ProviderRigTest::WaitCaughtUp(const std::string& id, absl::Duration timeout) {
  handoff::v1::Progress last;
  bool ok = WaitFor(
      id,
      [this](const handoff::v1::Progress& p) {
        const uint64_t h = head();
        return p.checkpoint().has_applied() && p.checkpoint().applied_block() == h &&
               p.tip() == h && !IsHalted(p.state());
      },
      timeout, &last);
  EXPECT_TRUE(ok) << id << " did not catch up to " << head() << ": " << last.DebugString();
  return ok;
}

bool ProviderRigTest::WaitIdle(const std::string& id, absl::Duration timeout) {
  if (!WaitCaughtUp(id, timeout)) return false;
  handoff::v1::Progress last;
  bool ok = WaitFor(
      id,
      [&](const handoff::v1::Progress& p) {
        if (p.state() != handoff::v1::SOURCE_STATE_BACKING_OFF || p.reason() != "no new events") {
          return false;
        }
        std::vector<FetchRecord> j = journal_.Of(id);
        return !j.empty() && j.back().is_page && j.back().items == 0 &&
               j.back().next == j.back().cursor &&
               j.back().cursor == p.checkpoint().resume_cursor();
      },
      timeout, &last);
  EXPECT_TRUE(ok) << id << " did not become idle: " << last.DebugString();
  return ok;
}

handoff::v1::Progress ProviderRigTest::Progress(const std::string& id) {
  absl::StatusOr<handoff::v1::Progress> p = manager_->GetProgress(id);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : handoff::v1::Progress();
}

std::vector<handoff::v1::EventRow> ProviderRigTest::Rows(const std::string& id) {
  std::vector<handoff::v1::EventRow> rows;
  handoff::v1::QueryEventsRequest q;
  q.set_source_id(id);
  q.set_page_size(97);  // odd on purpose: pages end mid-block
  while (true) {
    absl::StatusOr<handoff::v1::QueryEventsResponse> r = manager_->QueryEvents(q);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) break;
    rows.insert(rows.end(), r->rows().begin(), r->rows().end());
    if (r->next_page_token().empty()) break;
    q.set_page_token(r->next_page_token());
  }
  return rows;
}

void ProviderRigTest::ExpectRowsCanonical(const std::string& id, uint64_t from, uint64_t to) {
  std::vector<handoff::v1::EventRow> rows = Rows(id);
  std::vector<handoff::v1::EventRow> canonical = sim_->chain().Canonical(from, to);
  EXPECT_EQ(rows.size(), canonical.size()) << id << " over [" << from << ", " << to << "]";
  for (size_t i = 0; i < std::min(rows.size(), canonical.size()); ++i) {
    if (rows[i].SerializeAsString() != canonical[i].SerializeAsString()) {
      ADD_FAILURE() << id << ": row " << i << " differs from the canonical chain\n  got:  "
                    << rows[i].ShortDebugString() << "\n  want: " << canonical[i].ShortDebugString();
      return;
    }
  }
}

void ProviderRigTest::ExpectRefusalsKeptTheCursor(const std::string& id) {
  std::vector<FetchRecord> j = journal_.Of(id);
  for (size_t i = 0; i + 1 < j.size(); ++i) {
    // Halting refusals end the worker; what follows them is an operator's decision.
    if (j[i].is_page || (j[i].kind != consumer::RefusalKind::kRetryAfter &&
                         j[i].kind != consumer::RefusalKind::kTransient &&
                         j[i].kind != consumer::RefusalKind::kMalformedPage)) {
      continue;
    }
    EXPECT_EQ(j[i + 1].cursor, j[i].cursor)
        << id << ": the fetch after refusal " << j[i].code << " moved the cursor";
  }
}

std::vector<sim::RequestRecord> ProviderRigTest::StreamRequests() {
  std::vector<sim::RequestRecord> out;
  for (sim::RequestRecord& r : sim_->Requests()) {
    if (r.path == "/v1/stream") out.push_back(std::move(r));
  }
  return out;
}

void ProviderRigTest::ExpectStreamsResumedFromCommittedCursors() {
  std::vector<std::string> all = journal_.AllCursors();
  std::set<std::string> fetched(all.begin(), all.end());
  for (const sim::RequestRecord& r : StreamRequests()) {
    EXPECT_TRUE(r.has_last_event_id) << "stream from " << r.from << " without Last-Event-ID";
    EXPECT_NE(r.last_event_id, "latest");
    EXPECT_EQ(r.last_event_id, r.from);
    EXPECT_TRUE(fetched.count(r.last_event_id) == 1)
        << "a stream resumed from " << r.last_event_id
        << ", a cursor the engine never committed";
    // Committed before the stream asked for it: an id the reader had only received (its
    // page not yet durable) would be fetched, if ever, only later.
    const std::optional<absl::Time> fetched_at = journal_.FirstFetchOf(r.last_event_id);
    EXPECT_TRUE(fetched_at.has_value() && *fetched_at <= r.at)
        << "a stream resumed from " << r.last_event_id << " before the engine committed it";
  }
}

std::vector<std::string> ProviderRigTest::PublicTexts(const std::string& id) {
  std::vector<std::string> out = observer_.Texts();
  handoff::v1::Progress p = Progress(id);
  out.push_back(p.reason());
  out.push_back(p.last_error().message());
  absl::StatusOr<handoff::v1::Source> s = manager_->GetSource(id);
  if (s.ok()) {
    out.push_back(s->progress().reason());
    out.push_back(s->progress().last_error().message());
  }
  return out;
}

}  // namespace handoff::tests
