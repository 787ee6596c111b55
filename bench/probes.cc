#include "bench/probes.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/thread_priority.h"
#include "consumer/memory_bound.h"
#include "consumer/observer.h"
#include "consumer/sink.h"
#include "consumer/source_manager.h"
#include "grpcpp/grpcpp.h"
#include "handoff/v1/consumer_admin.grpc.pb.h"
#include "handoff/v1/event_sink.grpc.pb.h"
#include "rocksdb/db.h"
#include "rocksdb/sst_file_writer.h"
#include "server/factories.h"
#include "sim/synthetic_chain.h"
#include "store/keys.h"
#include "store/records.pb.h"
#include "store/row_codec.h"
#include "store/store.h"
#include "store/wal_syncer.h"

extern char** environ;

namespace handoff::bench {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json Error(absl::string_view what, const absl::Status& s) {
  return json{{"error", absl::StrCat(what, ": ", s.ToString())}};
}
json Error(absl::string_view what) { return json{{"error", std::string(what)}}; }

}  // namespace

ProcessUsage UsageOf(const rusage& ru) {
  return ProcessUsage{ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
                          (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6,
                      ru.ru_nvcsw + ru.ru_nivcsw, ru.ru_minflt};
}

double PeakRssMb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024.0;
  }
  return 0;
}

ProcessUsage ReadProcessUsage() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return UsageOf(ru);
}

MachineTicks ReadMachineTicks() {
  MachineTicks t;
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;  // "cpu": the sum over all CPUs
  // user nice system idle iowait irq softirq steal (guest time is inside user/nice)
  for (int i = 0; i < 8; ++i) {
    int64_t v = 0;
    if (!(in >> v)) return MachineTicks{};
    t.total += v;
    if (i == 7) t.steal = v;
  }
  return t;
}

double StealFraction(const MachineTicks& from, const MachineTicks& to) {
  const int64_t total = to.total - from.total;
  return total > 0 ? static_cast<double>(to.steal - from.steal) / total : 0.0;
}

namespace {

double CpuSeconds() { return ReadProcessUsage().cpu_seconds; }

// The machine's TCP counters of connections that had to wait (/proc/net/netstat,
// TcpExt): a full accept queue drops the SYN and the client retries its connect only
// after a second or more, so a source starts or resumes that much later.
struct ConnectDelays {
  int64_t listen_overflows = 0;
  int64_t syn_retransmits = 0;
};
ConnectDelays ReadConnectDelays() {
  std::ifstream in("/proc/net/netstat");
  std::string names, values;
  while (std::getline(in, names) && std::getline(in, values)) {
    if (names.rfind("TcpExt:", 0) != 0) continue;
    std::istringstream n(names), v(values);
    std::string name, value;
    ConnectDelays d;
    while (n >> name && v >> value) {
      int64_t x = 0;
      if (!absl::SimpleAtoi(value, &x)) continue;
      if (name == "ListenOverflows") d.listen_overflows = x;
      if (name == "TCPSynRetrans") d.syn_retransmits = x;
    }
    return d;
  }
  return ConnectDelays{};
}

// Resident memory of this process now, in MB (/proc/self/statm).
double CurrentRssMb() {
  std::ifstream statm("/proc/self/statm");
  size_t size = 0, resident = 0;
  statm >> size >> resident;
  return static_cast<double>(resident) * sysconf(_SC_PAGESIZE) / (1 << 20);
}

// Counts committed events per source (every durable step reports here) and notices halts.
class CountingObserver : public consumer::EngineObserver {
 public:
  void OnCommit(absl::string_view id, int events, absl::Duration latency) override {
    absl::MutexLock lock(&mu_);
    if (commits_ == 0) first_commit_ = absl::Now();
    ++commits_;
    commit_time_ += latency;
    const std::string key(id);
    per_source_[key] += events;
    const absl::Time now = absl::Now();
    if (!first_.count(key)) first_[key] = now;
    last_[key] = now;
    total_ += events;
    if (timeline_step_ > 0 &&
        total_ >= static_cast<int64_t>(timeline_.size()) * timeline_step_) {
      AddTimelinePointLocked(now);
    }
    if (snapshot_target_ > 0 && total_ >= snapshot_target_ && !snapshot_time_.has_value()) {
      snapshot_time_ = now;
      snapshot_ = per_source_;
    }
  }
  void OnStateChange(absl::string_view id, handoff::v1::SourceState state,
                     absl::string_view reason) override {
    if (state >= handoff::v1::SOURCE_STATE_RESYNC_REQUIRED &&
        state <= handoff::v1::SOURCE_STATE_STORAGE_FAILED) {
      absl::MutexLock lock(&mu_);
      if (error_.empty()) error_ = absl::StrCat("source ", id, " halted: ", reason);
    }
  }
  // Refused fetches by the provider's code ("network" for transport failures): a source
  // that backs off lags the others, which the fairness figures alone do not explain.
  void OnRefusal(absl::string_view id, absl::string_view code) override {
    absl::MutexLock lock(&mu_);
    ++refusals_[std::string(code)];
  }
  std::map<std::string, int64_t> refusals() {
    absl::MutexLock lock(&mu_);
    return refusals_;
  }
  // Waits until `target` events committed (true), a halt, or the deadline.
  bool WaitTotal(int64_t target, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    struct Args {
      CountingObserver* self;
      int64_t target;
    } args{this, target};
    mu_.AwaitWithDeadline(absl::Condition(
                              +[](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                return a->self->total_ >= a->target || !a->self->error_.empty();
                              },
                              &args),
                          deadline);
    return total_ >= target;
  }
  // Each source's committed events at the commit that takes the total to `target`,
  // and when: taken as it happens, so it does not depend on when anyone asks.
  void SnapshotAt(int64_t target) {
    absl::MutexLock lock(&mu_);
    snapshot_target_ = target;
  }
  // From `t0` on, a point of the timeline at every `step` events committed (and one
  // now): [seconds since t0, events committed, this process's CPU seconds, its minor
  // page faults], so that a run's phases (a slow start, a slow tail) can be read from its
  // JSON without a profiler (bench/HISTORY.md 115).
  void TimelineEvery(int64_t step, absl::Time t0) {
    absl::MutexLock lock(&mu_);
    timeline_step_ = step;
    timeline_t0_ = t0;
    AddTimelinePointLocked(t0);
  }
  std::vector<std::vector<double>> timeline() {
    absl::MutexLock lock(&mu_);
    return timeline_;
  }
  std::optional<std::pair<absl::Time, std::map<std::string, int64_t>>> snapshot() {
    absl::MutexLock lock(&mu_);
    if (!snapshot_time_.has_value()) return std::nullopt;
    return std::make_pair(*snapshot_time_, snapshot_);
  }
  bool WaitFirstCommit(absl::Time deadline) { return WaitTotal(1, deadline) || commits() > 0; }
  int64_t total() {
    absl::MutexLock lock(&mu_);
    return total_;
  }
  // Time spent inside Store::CommitStep (write + fsync), summed over commits.
  absl::Duration commit_time() {
    absl::MutexLock lock(&mu_);
    return commit_time_;
  }
  int64_t commits() {
    absl::MutexLock lock(&mu_);
    return commits_;
  }
  absl::Time first_commit() {
    absl::MutexLock lock(&mu_);
    return first_commit_;
  }
  std::string error() {
    absl::MutexLock lock(&mu_);
    return error_;
  }
  std::map<std::string, int64_t> per_source() {
    absl::MutexLock lock(&mu_);
    return per_source_;
  }
  // Events/s of each source over its own active span (first to last commit).
  std::vector<double> ActiveRates() {
    absl::MutexLock lock(&mu_);
    std::vector<double> out;
    for (const auto& [id, n] : per_source_) {
      const double secs = absl::ToDoubleSeconds(last_[id] - first_[id]);
      if (secs > 0) out.push_back(n / secs);
    }
    return out;
  }

 private:
  void AddTimelinePointLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const ProcessUsage u = ReadProcessUsage();
    timeline_.push_back({absl::ToDoubleSeconds(now - timeline_t0_), static_cast<double>(total_),
                         u.cpu_seconds, static_cast<double>(u.minor_faults)});
  }

  absl::Mutex mu_;
  int64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t commits_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration commit_time_ ABSL_GUARDED_BY(mu_);
  absl::Time first_commit_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> per_source_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Time> first_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Time> last_ ABSL_GUARDED_BY(mu_);
  std::string error_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> refusals_ ABSL_GUARDED_BY(mu_);
  int64_t snapshot_target_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t timeline_step_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time timeline_t0_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<double>> timeline_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> snapshot_time_ ABSL_GUARDED_BY(mu_);  // set once, when taken
  std::map<std::string, int64_t> snapshot_ ABSL_GUARDED_BY(mu_);
};

// handoffd's production factories, minus API keys (the simulator runs without a token).
// Fetches made by every worker of the probe (the idle scenario reports polls/s).
std::atomic<int64_t> g_fetches{0};
// The largest page body any worker of the probe received (the memory bound's `b`).
std::atomic<size_t> g_largest_page_bytes{0};

// handoffd's HttpProvider, counting Fetch calls.
class CountingProvider final : public consumer::ProviderDecorator {
 public:
  using ProviderDecorator::ProviderDecorator;
  consumer::FetchResult Fetch(const std::string& committed_cursor) override {
    g_fetches.fetch_add(1, std::memory_order_relaxed);
    consumer::FetchResult r = inner().Fetch(committed_cursor);
    if (r.page.has_value()) {
      size_t seen = g_largest_page_bytes.load(std::memory_order_relaxed);
      while (r.page->wire_bytes > seen &&
             !g_largest_page_bytes.compare_exchange_weak(seen, r.page->wire_bytes)) {
      }
    }
    return r;
  }
};

consumer::Factories BenchFactories() {
  // handoffd's own factories (one session pool shared by every source's polls), with
  // fetches counted.
  consumer::Factories f = server::ProductionFactories(server::DefaultMaxPagesInFlight());
  f.provider = [inner = std::move(f.provider)](const handoff::v1::SourceSpec& spec)
      -> absl::StatusOr<std::unique_ptr<consumer::Provider>> {
    absl::StatusOr<std::unique_ptr<consumer::Provider>> p = inner(spec);
    if (!p.ok()) return p.status();
    return std::make_unique<CountingProvider>(*std::move(p));
  };
  return f;
}

handoff::v1::SourceSpec Spec(const std::string& id, const ProbeArgs& a, const std::string& source) {
  handoff::v1::SourceSpec spec;
  spec.set_id(id);
  spec.set_provider_url(a.sim_url);
  spec.set_chain("sim");
  spec.set_source(source);
  spec.set_filter("all");
  spec.set_transport(a.transport == "sse" ? handoff::v1::TRANSPORT_SSE
                                          : handoff::v1::TRANSPORT_POLL);
  spec.mutable_start()->set_block(0);
  spec.set_page_limit(a.page);
  spec.mutable_sink()->mutable_local_rows();
  return spec;
}

struct Engine {
  std::unique_ptr<store::Store> store;
  std::unique_ptr<consumer::SourceManager> manager;
  // Resident memory once the store is open and the manager created, before any source.
  double base_rss_mb = 0;
  // store::StoreMemoryCeiling of the options the store was opened with.
  double store_ceiling_mb = 0;
  ~Engine() {
    if (manager != nullptr) manager->Shutdown();
    manager.reset();
    store.reset();
  }
};

absl::Status StartEngine(const std::string& path, bool sync, consumer::EngineObserver* observer,
                         Engine* engine) {
  store::StoreOptions so;
  so.path = path;
  so.sync = sync;
  absl::StatusOr<std::unique_ptr<store::Store>> st = store::Store::Open(so);
  if (!st.ok()) return st.status();
  engine->store = *std::move(st);
  consumer::SourceManagerOptions mo;
  mo.store = engine->store.get();
  mo.factories = BenchFactories();
  mo.observer = observer;
  mo.max_sources = 100000;
  absl::StatusOr<std::unique_ptr<consumer::SourceManager>> m =
      consumer::SourceManager::Create(std::move(mo));
  if (!m.ok()) return m.status();
  engine->manager = *std::move(m);
  engine->base_rss_mb = CurrentRssMb();
  engine->store_ceiling_mb = store::StoreMemoryCeiling(so) / double{1 << 20};
  return absl::OkStatus();
}

// The terms of the memory bound this probe can state (bench/report.cc adds the
// per-source fixed cost measured by the idle probe): the process before any source, the
// storage ceiling and consumer::PageMemoryBound for the largest page received.
json MemoryTerms(const Engine& engine, const ProbeArgs& a) {
  consumer::PageMemoryInputs in;
  (a.transport == "sse" ? in.sse_sources : in.poll_sources) = a.sources;
  in.largest_page_bytes = g_largest_page_bytes.load();
  in.page_slots = server::DefaultMaxPagesInFlight();  // BenchFactories' budget
  return json{{"base_rss_mb", engine.base_rss_mb},
              {"store_ceiling_mb", engine.store_ceiling_mb},
              {"largest_page_bytes", in.largest_page_bytes},
              {"page_bound_mb", consumer::PageMemoryBound(in) / (1 << 20)}};
}

// ---- simulator alone: a plain libcurl client following `next`, body discarded ----

size_t Collect(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

json SimAlone(const ProbeArgs& a) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  CURL* curl = curl_easy_init();
  std::string body, cursor = "0";
  body.reserve(8 << 20);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
  const int64_t pages = std::max<int64_t>(1, a.events / a.page);
  size_t bytes = 0;
  const absl::Time t0 = absl::Now();
  for (int64_t i = 0; i < pages; ++i) {
    std::string url = absl::StrCat(a.sim_url, "/v1/pages?chain=sim&source=alone&filter=all&limit=",
                                   a.page, "&from=", cursor);
    body.clear();
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    long status = 0;
    if (curl_easy_perform(curl) != CURLE_OK ||
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status) != CURLE_OK || status != 200) {
      curl_easy_cleanup(curl);
      return Error("simulator request failed");
    }
    bytes += body.size();
    size_t at = body.find("\"next\":\"");
    size_t end = body.find('"', at + 8);
    if (at == std::string::npos || end == std::string::npos) return Error("page without next");
    cursor = body.substr(at + 8, end - at - 8);
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  curl_easy_cleanup(curl);
  return json{{"pages", pages},        {"events", pages * a.page},
              {"seconds", secs},       {"events_per_s", pages * a.page / secs},
              {"pages_per_s", pages / secs}, {"bytes_per_page", bytes / pages}};
}

// ---- the bare RocksDB loop: the same rows, options and sync policy, no engine ----

std::vector<std::string> TemplateRows(int logs_per_block, uint64_t blocks) {
  sim::ChainOptions co;
  co.initial_head = blocks + 10;
  co.logs_per_block = logs_per_block;
  sim::SyntheticChain chain(co);
  std::vector<std::string> out;
  for (const handoff::v1::EventRow& row : chain.Canonical(0, blocks - 1)) {
    out.push_back(store::EncodeRow(row));
  }
  return out;
}

json BareRocks(const ProbeArgs& a) {
  const std::vector<std::string> rows = TemplateRows(a.logs_per_block, 2000);
  store::StoreOptions so;
  so.path = a.dir + "/bare";
  so.sync = a.sync;
  store::RocksOptions ro = store::StoreRocksOptions(so);
  rocksdb::DB* raw = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::Status s = rocksdb::DB::Open(ro.db, so.path, ro.families, &handles, &raw);
  if (!s.ok()) return Error(absl::StrCat("open: ", s.ToString()));
  std::unique_ptr<rocksdb::DB> db(raw);
  rocksdb::ColumnFamilyHandle* rows_cf = nullptr;
  rocksdb::ColumnFamilyHandle* cp_cf = nullptr;
  for (size_t i = 0; i < ro.families.size(); ++i) {
    if (ro.families[i].name == "rows") rows_cf = handles[i];
    if (ro.families[i].name == "checkpoints") cp_cf = handles[i];
  }
  rocksdb::WriteOptions wo;
  // The engine's policy (store::Store's deferred commits and WalSyncer, SourceWorker's
  // limit of unsynced pages): the writes return unsynced and one background fsync,
  // paced as the store's, covers every batch written before it began; a writer keeps at
  // most max_unsynced_pages batches unsynced, and a batch counts once its sync is done.
  const bool deferred = a.sync && a.deferred_sync;
  wo.sync = a.sync && !deferred;
  const size_t max_unsynced =
      static_cast<size_t>(std::max(1, consumer::WorkerOptions().max_unsynced_pages));
  std::unique_ptr<store::WalSyncer> syncer;
  if (deferred) {
    syncer = std::make_unique<store::WalSyncer>(
        [&db]() -> absl::Status {
          rocksdb::Status s = db->SyncWAL();
          return s.ok() ? absl::OkStatus() : absl::InternalError(s.ToString());
        },
        store::StoreOptions().wal_sync_interval);
  }
  // One writer thread per source, each writing its own key range (as the engine's
  // sources do), so that with several sources RocksDB groups their commits and the
  // memtable and the L0 files hold their interleaved ranges.
  const int writers = std::max(1, a.sources);
  const int64_t per_writer = a.events / writers;
  std::atomic<size_t> bytes{0};
  absl::Mutex error_mu;
  std::string error;
  auto write_source = [&](int w) {
    const std::string id = writers == 1 ? "bare" : absl::StrCat("bare-", w);
    store::CheckpointRecord cp;
    cp.set_resume_cursor(std::string(43, 'c'));
    cp.set_identity_hash(std::string(64, 'f'));
    cp.set_version(1);
    const int per_batch = 1000;
    size_t written = 0;
    int64_t done = 0;
    std::string key;
    std::deque<store::SyncTicket> unsynced;
    auto settle = [&](size_t keep) {
      while (!unsynced.empty() &&
             (unsynced.size() > keep || syncer->IsSynced(unsynced.front()))) {
        absl::Status st = syncer->Await(unsynced.front());
        if (!st.ok()) return st;
        unsynced.pop_front();
      }
      return absl::OkStatus();
    };
    while (done < per_writer) {
      if (syncer != nullptr) {
        if (absl::Status st = settle(max_unsynced - 1); !st.ok()) {
          absl::MutexLock lock(&error_mu);
          error = st.ToString();
          return;
        }
      }
      rocksdb::WriteBatch batch;
      for (int k = 0; k < per_batch && done < per_writer; ++k, ++done) {
        const std::string& v = rows[done % rows.size()];
        Position pos{static_cast<uint64_t>(done / a.logs_per_block),
                     static_cast<uint64_t>(done % a.logs_per_block)};
        store::keys::AssignPositional(id, pos, &key);
        batch.Put(rows_cf, key, v);
        written += v.size();
      }
      cp.set_version(cp.version() + 1);
      cp.set_applied_block(done / a.logs_per_block);
      cp.mutable_counters()->set_applied(done);
      batch.Put(cp_cf, store::keys::Checkpoint(id, store::Stage::kIngest),
                cp.SerializeAsString());
      rocksdb::Status ws = db->Write(wo, &batch);
      if (!ws.ok()) {
        absl::MutexLock lock(&error_mu);
        error = ws.ToString();
        return;
      }
      if (syncer != nullptr) unsynced.push_back(syncer->Written());
    }
    if (syncer != nullptr) {
      if (absl::Status st = settle(0); !st.ok()) {
        absl::MutexLock lock(&error_mu);
        error = st.ToString();
        return;
      }
    }
    bytes += written;
  };
  const absl::Time t0 = absl::Now();
  {
    std::vector<std::thread> threads;
    for (int w = 0; w < writers; ++w) threads.emplace_back(write_source, w);
    for (std::thread& t : threads) t.join();
  }
  const int64_t done = per_writer * writers;
  if (!error.empty()) return Error(absl::StrCat("write: ", error));
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  const uint64_t syncs = syncer != nullptr ? syncer->syncs() : 0;
  syncer.reset();
  for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
  db->Close().PermitUncheckedError();
  return json{{"events", done},
              {"seconds", secs},
              {"events_per_s", done / secs},
              {"sources", writers},
              {"deferred_sync", deferred},
              {"wal_syncs", syncs},
              {"row_bytes", bytes.load() / std::max<int64_t>(1, done)},
              {"mb_per_s", bytes.load() / secs / 1e6}};
}

// ---- end to end: simulator over HTTP -> SourceManager -> durable local rows ----

json E2e(const ProbeArgs& a) {
  CountingObserver obs;
  Engine engine;
  absl::Status s = StartEngine(a.dir + "/db", a.sync, &obs, &engine);
  if (!s.ok()) return Error("engine", s);
  std::vector<std::string> ids;
  for (int i = 0; i < a.sources; ++i) {
    handoff::v1::CreateSourceRequest req;
    const std::string id = absl::StrCat("e2e-", i);
    *req.mutable_spec() = Spec(id, a, absl::StrCat("s", i));
    req.set_start(false);
    absl::StatusOr<handoff::v1::Source> src = engine.manager->CreateSource(req);
    if (!src.ok()) return Error("create source", src.status());
    ids.push_back(id);
  }
  const int64_t target = a.events * a.sources;
  obs.SnapshotAt(target / 2);
  const double cpu0 = CpuSeconds();
  const ConnectDelays delays0 = ReadConnectDelays();
  const absl::Time t0 = absl::Now();
  obs.TimelineEvery(target / 20, t0);
  // All sources start together, as at process start (Recover): one by one, each start
  // waits ~80 ms for a synced write behind the running sources' page commits, and the
  // last of 64 would begin ~5 s after the first.
  std::vector<absl::Status> started(ids.size());
  {
    std::vector<std::thread> starters;
    for (size_t i = 0; i < ids.size(); ++i) {
      starters.emplace_back([&, i] { started[i] = engine.manager->StartSource(ids[i]).status(); });
    }
    for (std::thread& t : starters) t.join();
  }
  const double start_secs = absl::ToDoubleSeconds(absl::Now() - t0);
  for (const absl::Status& st : started) {
    if (!st.ok()) return Error("start source", st);
  }
  const absl::Time deadline = t0 + absl::Minutes(10);
  const bool done = obs.WaitTotal(target, deadline);
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  const double cpu = CpuSeconds() - cpu0;
  if (!done) {
    return Error(absl::StrCat("incomplete: ", obs.total(), " of ", target, " events; ",
                              obs.error()));
  }
  const auto snapshot = obs.snapshot();
  const double half_secs = snapshot ? absl::ToDoubleSeconds(snapshot->first - t0) : secs;
  const std::map<std::string, int64_t> half = snapshot ? snapshot->second : obs.per_source();
  int64_t mn = target, mx = 0;
  for (const std::string& id : ids) {
    const auto it = half.find(id);
    const int64_t v = it != half.end() ? it->second : 0;
    mn = std::min(mn, v);
    mx = std::max(mx, v);
  }
  const std::vector<double> rates = obs.ActiveRates();
  const double rmin = rates.empty() ? 0 : *std::min_element(rates.begin(), rates.end());
  const double rmax = rates.empty() ? 0 : *std::max_element(rates.begin(), rates.end());
  json out{{"rate_min_eps", rmin},
              {"rate_max_eps", rmax},
              {"rate_fairness", rmax > 0 ? rmin / rmax : 0.0},
              {"started_by_half", std::count_if(half.begin(), half.end(),
                                                [](const auto& kv) { return kv.second > 0; })},
              {"start_seconds", start_secs},
              {"half_seconds", half_secs},
              {"refusals", obs.refusals()},
              {"listen_overflows", ReadConnectDelays().listen_overflows - delays0.listen_overflows},
              {"syn_retransmits", ReadConnectDelays().syn_retransmits - delays0.syn_retransmits},
              {"events", obs.total()},
              {"seconds", secs},
              {"events_per_s", obs.total() / secs},
              {"commits", obs.commits()},
              {"events_per_commit", static_cast<double>(obs.total()) / obs.commits()},
              // Share of the wall time spent inside Store::CommitStep (summed over
              // sources, so it can exceed 1 with many sources committing at once).
              {"commit_time_fraction", absl::ToDoubleSeconds(obs.commit_time()) / secs},
              {"cpu_seconds", cpu},
              {"per_source_min_eps", mn / half_secs},
              {"per_source_max_eps", mx / half_secs},
              {"fairness", mx > 0 ? static_cast<double>(mn) / mx : 0.0},
              {"timeline", obs.timeline()}};
  out.update(MemoryTerms(engine, a));
  return out;
}

// ---- the sample sink called directly: the delivery limit ----

// The request the engine would send for `row` (consumer::MakeDelivery's key format):
// the sink's cost depends on its keys (it looks each one up, then writes it) and rows.
void FillApply(handoff::v1::ApplyRequest* r, const handoff::v1::EventRow& row) {
  r->set_source_id("sink-direct");
  r->set_idempotency_key(consumer::IdempotencyKey("sink-direct", row));
  *r->mutable_event() = row;
  r->set_finality(handoff::v1::FINALITY_FINALIZED);
}

json SinkDirect(const ProbeArgs& a) {
  // The events the simulator serves the engine in the same scenario (WithSim's chain),
  // so the limit is the sink doing the same work: the same rows under the same keys.
  sim::ChainOptions co;
  co.logs_per_block = a.logs_per_block;
  co.initial_head = static_cast<uint64_t>(a.events / a.logs_per_block) - 1;
  sim::SyntheticChain chain(co);
  const std::vector<handoff::v1::EventRow> rows = chain.Canonical(0, co.initial_head);
  if (static_cast<int64_t>(rows.size()) < a.events) return Error("the chain is too short");
  auto channel = grpc::CreateChannel(a.sink_target, grpc::InsecureChannelCredentials());
  auto stub = handoff::v1::EventSink::NewStub(channel);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    return Error("cannot connect to the sink");
  }
  int64_t errors = 0;
  const absl::Time t0 = absl::Now();
  if (a.mode == "single") {
    handoff::v1::ApplyRequest req;
    handoff::v1::ApplyResponse resp;
    for (int64_t i = 0; i < a.events; ++i) {
      req.Clear();
      FillApply(&req, rows[i]);
      grpc::ClientContext ctx;
      if (!stub->Apply(&ctx, req, &resp).ok() ||
          resp.outcome() != handoff::v1::APPLY_OUTCOME_APPLIED) {
        ++errors;
      }
    }
  } else {
    handoff::v1::ApplyBatchRequest req;
    handoff::v1::ApplyBatchResponse resp;
    for (int64_t first = 0; first < a.events; first += 256) {
      req.Clear();
      for (int64_t i = first; i < std::min<int64_t>(a.events, first + 256); ++i) {
        FillApply(req.add_events(), rows[i]);
      }
      grpc::ClientContext ctx;
      if (!stub->ApplyBatch(&ctx, req, &resp).ok()) errors += req.events_size();
    }
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  if (errors > 0) return Error(absl::StrCat(errors, " failed deliveries"));
  return json{{"events", a.events}, {"seconds", secs}, {"events_per_s", a.events / secs}};
}

// ---- external deliveries through the engine ----

json SinkE2e(const ProbeArgs& a) {
  CountingObserver obs;
  Engine engine;
  absl::Status s = StartEngine(a.dir + "/db", a.sync, &obs, &engine);
  if (!s.ok()) return Error("engine", s);
  handoff::v1::CreateSourceRequest req;
  const std::string id = absl::StrCat("sink-", a.mode, "-", a.gate);
  handoff::v1::SourceSpec spec = Spec(id, a, "sink");
  auto* down = spec.mutable_sink()->mutable_downstream();
  down->set_target(a.sink_target);
  down->set_batch(a.mode == "batch");
  down->set_max_batch(256);
  spec.mutable_sink()->set_gate(a.gate == "finalized" ? handoff::v1::DELIVERY_GATE_FINALIZED
                                                      : handoff::v1::DELIVERY_GATE_IMMEDIATE);
  *req.mutable_spec() = spec;
  req.set_start(true);
  // Ingest commits `events` events; with a gate, deliveries commit the finalized prefix
  // again in the delivery stage.
  const int64_t head = a.events / a.logs_per_block - 1;
  const int64_t delivered = a.gate == "finalized" ? (head - a.finality_lag + 1) * a.logs_per_block
                                                  : a.events;
  const int64_t target = a.gate == "finalized" ? a.events + delivered : a.events;
  const absl::Time t0 = absl::Now();
  absl::StatusOr<handoff::v1::Source> src = engine.manager->CreateSource(req);
  if (!src.ok()) return Error("create source", src.status());
  const bool done = obs.WaitTotal(target, t0 + absl::Minutes(10));
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  if (!done) {
    return Error(absl::StrCat("incomplete: ", obs.total(), " of ", target, "; ", obs.error()));
  }
  return json{{"events", delivered},
              {"seconds", secs},
              {"events_per_s", delivered / secs},
              {"first_commit_seconds", absl::ToDoubleSeconds(obs.first_commit() - t0)}};
}

// ---- recovery: 100 sources, 10 million receipts on disk ----

handoff::v1::SourceSpec RecoverySpec(const std::string& id, const std::string& url) {
  ProbeArgs a;
  a.sim_url = url;
  return Spec(id, a, id);
}

std::string RecoveryId(int i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rec-%03d", i);
  return buf;
}

struct RawDb {
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  std::map<std::string, rocksdb::ColumnFamilyHandle*> cf;
  store::RocksOptions ro;
  ~RawDb() {
    if (db == nullptr) return;
    for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
    db->Close().PermitUncheckedError();
  }
};

absl::Status OpenRaw(const std::string& path, RawDb* out) {
  store::StoreOptions so;
  so.path = path;
  out->ro = store::StoreRocksOptions(so);
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(out->ro.db, path, out->ro.families, &out->handles, &raw);
  if (!s.ok()) return absl::InternalError(s.ToString());
  out->db.reset(raw);
  for (size_t i = 0; i < out->ro.families.size(); ++i) {
    out->cf[out->ro.families[i].name] = out->handles[i];
  }
  return absl::OkStatus();
}

// Writes the data set with a bulk loader: one sorted SST file of rows per source,
// ingested straight into the bottom level (no WAL, no memtable, no compaction).
absl::Status GenerateRecoveryData(const ProbeArgs& a, const std::string& db_path) {
  fs::remove_all(db_path);
  {
    store::StoreOptions so;
    so.path = db_path;
    absl::StatusOr<std::unique_ptr<store::Store>> st = store::Store::Open(so);  // schema
    if (!st.ok()) return st.status();
  }
  RawDb raw;
  absl::Status os = OpenRaw(db_path, &raw);
  if (!os.ok()) return os;
  const uint64_t blocks = a.rows / a.logs_per_block;
  size_t rows_cf_index = 0;
  for (size_t i = 0; i < raw.ro.families.size(); ++i) {
    if (raw.ro.families[i].name == "rows") rows_cf_index = i;
  }
  rocksdb::Options sst_options(raw.ro.db, raw.ro.families[rows_cf_index].options);
  handoff::v1::EventRow row;
  row.set_address("0x00000000000000000000000000000000deadbeef");
  row.add_topics("0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef");
  row.set_data(absl::StrCat("0x", std::string(128, 'a')));
  row.set_transaction_hash(absl::StrCat("0x", std::string(64, 'b')));
  for (int i = 0; i < a.sources; ++i) {
    const std::string id = RecoveryId(i);
    const std::string file = absl::StrCat(db_path, "/../ingest-", i, ".sst");
    rocksdb::SstFileWriter writer(rocksdb::EnvOptions(), sst_options);
    rocksdb::Status s = writer.Open(file);
    if (!s.ok()) return absl::InternalError(s.ToString());
    std::string value;
    for (uint64_t b = 0; b < blocks; ++b) {
      row.set_block_hash(absl::StrCat("0x", absl::Hex(b * 2654435761u + i, absl::kZeroPad16),
                                      std::string(48, '0')));
      row.set_block_number(b);
      for (int l = 0; l < a.logs_per_block; ++l) {
        row.set_log_index(l);
        row.set_transaction_index(l);
        value.clear();
        store::AppendEncodedRow(row, &value);
        s = writer.Put(store::keys::Positional(id, Position{b, static_cast<uint64_t>(l)}), value);
        if (!s.ok()) return absl::InternalError(s.ToString());
      }
    }
    s = writer.Finish();
    if (!s.ok()) return absl::InternalError(s.ToString());
    rocksdb::IngestExternalFileOptions io;
    io.move_files = true;
    s = raw.db->IngestExternalFile(raw.cf["rows"], {file}, io);
    if (!s.ok()) return absl::InternalError(s.ToString());
  }
  return absl::OkStatus();
}

// Points every source of the data set at this run's simulator and rewinds it to the end
// of the generated rows (dropping what an earlier run committed beyond them).
// Rows per source left in the WAL for the timed open to replay (PrepareRecoveryRun).
constexpr uint64_t kRecoveryTailRowsPerSource = 1500;

absl::Status PrepareRecoveryRun(const ProbeArgs& a, const std::string& db_path,
                                int64_t* wal_rows) {
  RawDb raw;
  absl::Status os = OpenRaw(db_path, &raw);
  if (!os.ok()) return os;
  const uint64_t blocks = a.rows / a.logs_per_block;
  rocksdb::WriteBatch batch;
  for (int i = 0; i < a.sources; ++i) {
    const std::string id = RecoveryId(i);
    handoff::v1::Source source;
    *source.mutable_spec() = RecoverySpec(id, a.sim_url);
    source.set_desired_running(true);
    source.mutable_progress()->set_state(handoff::v1::SOURCE_STATE_STOPPED);
    batch.Put(raw.cf["sources"], store::keys::Source(id), source.SerializeAsString());
    store::CheckpointRecord cp;
    cp.set_resume_cursor(std::to_string(blocks));
    cp.set_version(1);
    cp.set_has_applied(true);
    cp.set_applied_block(blocks - 1);
    cp.set_applied_log_index(a.logs_per_block - 1);
    cp.set_identity_hash(store::IdentityHash(source.spec()));
    cp.set_has_covered(true);
    cp.set_covered_through(blocks - 1);
    cp.mutable_counters()->set_applied(a.rows);
    batch.Put(raw.cf["checkpoints"], store::keys::Checkpoint(id, store::Stage::kIngest),
              cp.SerializeAsString());
    batch.DeleteRange(raw.cf["rows"], store::keys::Positional(id, Position{blocks, 0}),
                      store::keys::PrefixSuccessor(store::keys::SourcePrefix(id)));
    // The generated rows are of epoch 0 (the layout written without an epoch, store.h):
    // one segment from position 0, and none of an earlier run's above them.
    batch.Put(raw.cf["row_segments"], store::keys::Positional(id, Position{0, 0}),
              store::keys::RowEpochPrefix(0));
    batch.DeleteRange(raw.cf["row_segments"], store::keys::Positional(id, Position{blocks, 0}),
                      store::keys::PrefixSuccessor(store::keys::SourcePrefix(id)));
  }
  // Every row an earlier run committed has an epoch above 0.
  batch.DeleteRange(raw.cf["rows"], store::keys::RowEpochPrefix(1),
                    store::keys::RowEpochPrefix(store::keys::kMaxRowEpoch + 1));
  rocksdb::WriteOptions wo;
  wo.sync = true;
  rocksdb::Status s = raw.db->Write(wo, &batch);
  if (s.ok()) s = raw.db->Flush(rocksdb::FlushOptions(), raw.handles);
  if (!s.ok()) return absl::InternalError(s.ToString());
  // As a crash mid-ingest leaves it: the last rows of every source written again through
  // the WAL and never flushed (RocksDB does not flush at close when the WAL is on), so the
  // timed open replays them (~50 MB, most of a 64 MiB memtable) and flushes them to L0.
  const uint64_t tail_blocks =
      std::min<uint64_t>(blocks, kRecoveryTailRowsPerSource / a.logs_per_block);
  for (int i = 0; i < a.sources; ++i) {
    const std::string id = RecoveryId(i);
    rocksdb::WriteBatch tail;
    std::unique_ptr<rocksdb::Iterator> it(
        raw.db->NewIterator(rocksdb::ReadOptions(), raw.cf["rows"]));
    const std::string end = store::keys::Positional(id, Position{blocks, 0});
    for (it->Seek(store::keys::Positional(id, Position{blocks - tail_blocks, 0}));
         it->Valid() && it->key().compare(end) < 0; it->Next()) {
      tail.Put(raw.cf["rows"], it->key(), it->value());
      ++*wal_rows;
    }
    if (!it->status().ok()) return absl::InternalError(it->status().ToString());
    s = raw.db->Write(wo, &tail);
    if (!s.ok()) return absl::InternalError(s.ToString());
  }
  return absl::OkStatus();
}

// Calls fn(fd, size) for every non-empty regular file under `paths` (each a file, or a
// directory walked recursively); a file gone meanwhile is skipped.
void ForEachFile(const std::vector<std::string>& paths,
                 const std::function<void(int fd, uint64_t size)>& fn) {
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (!fs::is_directory(p, ec)) {
      files.push_back(p);
      continue;
    }
    for (auto it = fs::recursive_directory_iterator(p, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      files.push_back(it->path().string());
    }
  }
  for (const std::string& f : files) {
    const int fd = open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) fn(fd, st.st_size);
    close(fd);
  }
}

// Bytes of the files under `paths` (directories walked) the page cache holds now (mincore).
uint64_t ResidentBytes(const std::vector<std::string>& paths) {
  const long page = sysconf(_SC_PAGESIZE);
  uint64_t resident = 0;
  ForEachFile(paths, [&](int fd, uint64_t size) {
    void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) return;
    std::vector<unsigned char> in_core((size + page - 1) / page);
    if (mincore(map, size, in_core.data()) == 0) {
      for (unsigned char c : in_core) resident += (c & 1) ? page : 0;
    }
    munmap(map, size);
  });
  return resident;
}

// Drops the page cache's copy of every file under `paths` (directories walked), as after a
// reboot: the timed start then reads them from the disk. Only clean pages go, so the
// files must be durable already (the data set is written with sync and flushed).
// Returns the bytes of the files advised.
uint64_t EvictFromPageCache(const std::vector<std::string>& paths) {
  uint64_t bytes = 0;
  ForEachFile(paths, [&](int fd, uint64_t size) {
    if (posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0) bytes += size;
  });
  return bytes;
}

// The data set (generated once, then cached), rewound for this run and dropped from the
// page cache. Returns the set-up's figures, or an error.
json SetUpRecoveryRun(const ProbeArgs& a, const std::vector<std::string>& cold_files) {
  const std::string db_path = a.dir + "/db";
  const std::string marker = a.dir + "/dataset.json";
  const json want{{"sources", a.sources}, {"rows", a.rows}, {"lpb", a.logs_per_block},
                  {"format", 1}};
  double gen_secs = 0;
  bool cached = false;
  {
    std::ifstream in(marker);
    json have;
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      have = json::parse(ss.str(), nullptr, false);
    }
    cached = have == want;
  }
  if (!cached) {
    fs::create_directories(a.dir);
    fs::remove(marker);
    const absl::Time g0 = absl::Now();
    absl::Status s = GenerateRecoveryData(a, db_path);
    if (!s.ok()) return Error("generate data set", s);
    gen_secs = absl::ToDoubleSeconds(absl::Now() - g0);
    std::ofstream(marker) << want.dump();
  }
  int64_t wal_rows = 0;
  absl::Status s = PrepareRecoveryRun(a, db_path, &wal_rows);
  if (!s.ok()) return Error("prepare", s);
  // RocksDB may compact (delete SSTs) while we list them: a file gone since it was
  // listed counts 0, never an exception.
  uint64_t sst_bytes = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(db_path, ec)) {
    if (e.path().extension() != ".sst") continue;
    const uintmax_t size = fs::file_size(e.path(), ec);
    if (!ec) sst_bytes += size;
  }
  const uint64_t advised = EvictFromPageCache(cold_files);
  return json{{"sources", a.sources},
              {"receipts", a.rows * a.sources},
              {"dataset_cached", cached},
              {"generate_seconds", gen_secs},
              {"db_bytes", sst_bytes},
              {"wal_rows_replayed", wal_rows},
              {"evicted_mb", advised / 1e6},
              {"resident_after_eviction_mb", ResidentBytes(cold_files) / 1e6}};
}

// Recovery inside this process: the store opened and the manager's Recover timed apart.
json Recovery(const ProbeArgs& a) {
  const std::string db_path = a.dir + "/db";
  json figures = SetUpRecoveryRun(a, {db_path});
  if (figures.contains("error")) return figures;
  CountingObserver obs;
  const absl::Time t0 = absl::Now();
  store::StoreOptions so;
  so.path = db_path;
  absl::StatusOr<std::unique_ptr<store::Store>> st = store::Store::Open(so);
  if (!st.ok()) return Error("open", st.status());
  const absl::Time t_open = absl::Now();
  Engine engine;
  engine.store = *std::move(st);
  consumer::SourceManagerOptions mo;
  mo.store = engine.store.get();
  mo.factories = BenchFactories();
  mo.observer = &obs;
  absl::StatusOr<std::unique_ptr<consumer::SourceManager>> m =
      consumer::SourceManager::Create(std::move(mo));
  if (!m.ok()) return Error("create", m.status());
  engine.manager = *std::move(m);
  absl::Status s = engine.manager->Recover();
  if (!s.ok()) return Error("recover", s);
  const absl::Time t_recover = absl::Now();
  if (!obs.WaitFirstCommit(t0 + absl::Seconds(60))) {
    return Error(absl::StrCat("no commit after recovery; ", obs.error()));
  }
  const absl::Time t_commit = obs.first_commit();
  figures["open_seconds"] = absl::ToDoubleSeconds(t_open - t0);
  figures["recover_seconds"] = absl::ToDoubleSeconds(t_recover - t0);
  figures["first_commit_seconds"] = absl::ToDoubleSeconds(t_commit - t0);
  return figures;
}

// ---- admin latency: GetProgress over real gRPC while handoffd ingests ----

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

json LatencyJson(const std::vector<double>& us) {
  return json{{"calls", us.size()},
              {"p50_ms", Percentile(us, 0.5) / 1000},
              {"p99_ms", Percentile(us, 0.99) / 1000},
              {"max_ms", Percentile(us, 1.0) / 1000}};
}

json AdminInProcess(const ProbeArgs& a) {
  CountingObserver obs;
  Engine engine;
  absl::Status s = StartEngine(a.dir + "/db", a.sync, &obs, &engine);
  if (!s.ok()) return Error("engine", s);
  handoff::v1::CreateSourceRequest req;
  *req.mutable_spec() = Spec("admin-0", a, "admin");
  req.set_start(true);
  if (!engine.manager->CreateSource(req).ok()) return Error("create source");
  obs.WaitFirstCommit(absl::Now() + absl::Seconds(30));
  std::vector<double> us;
  const int64_t before = obs.total();
  const absl::Time end = absl::Now() + absl::Seconds(a.window_s);
  while (absl::Now() < end) {
    const absl::Time c0 = absl::Now();
    if (!engine.manager->GetProgress("admin-0").ok()) return Error("GetProgress failed");
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - c0));
    absl::SleepFor(absl::Milliseconds(1));
  }
  json out = LatencyJson(us);
  out["transport"] = "in-process SourceManager::GetProgress (no handoffd binary given)";
  out["ingest_events_per_s"] = (obs.total() - before) / a.window_s;
  return out;
}

// How many of process `pid`'s threads run under SCHED_RR (/proc/<pid>/task/*/stat).
int RealtimeThreads(pid_t pid) {
  int n = 0;
  std::error_code error;
  for (const auto& task : fs::directory_iterator(absl::StrCat("/proc/", pid, "/task"), error)) {
    std::ifstream in(task.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    const size_t name_end = stat.rfind(')');
    if (name_end == std::string::npos) continue;  // the thread ended meanwhile
    // After "pid (comm) " come the fields from 3 (state) on; the policy is field 41.
    const std::vector<absl::string_view> fields =
        absl::StrSplit(absl::string_view(stat).substr(name_end + 2), ' ');
    if (fields.size() > 38 && fields[38] == "2") ++n;  // 2: SCHED_RR
  }
  return n;
}

// A handoffd process a probe measures: started with handoffd's defaults plus `extra`
// flags, its gRPC port read from its port file; stopped (SIGTERM) and reaped on
// destruction.
class HandoffdProcess {
 public:
  // Starts handoffd over `data_dir` (default: a.dir + "/handoffd") and waits, polling each
  // millisecond, until it has written its port file: its admin API serves from then.
  static absl::StatusOr<std::unique_ptr<HandoffdProcess>> Start(
      const ProbeArgs& a, const std::vector<std::string>& extra, std::string data_dir = "") {
    if (data_dir.empty()) data_dir = a.dir + "/handoffd";
    fs::create_directories(data_dir);
    const std::string port_file = data_dir + "/ports";
    fs::remove(port_file);
    std::vector<std::string> args = {a.handoffd,
                                      "--listen=127.0.0.1:0",
                                      "--port_file=" + port_file,
                                      "--data_dir=" + data_dir,
                                      "--insecure_disable_auth",
                                      "--log_level=error"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const absl::Time started = absl::Now();
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
      return absl::UnavailableError("cannot start handoffd");
    }
    auto process = std::unique_ptr<HandoffdProcess>(new HandoffdProcess(pid, started));
    const absl::Time deadline = started + absl::Seconds(30);
    while (process->port_ == 0 && absl::Now() < deadline) {
      std::ifstream in(port_file);
      std::string name;
      int p = 0;
      while (in >> name >> p) {
        if (name == "grpc") process->port_ = p;
      }
      if (process->port_ == 0) absl::SleepFor(absl::Milliseconds(1));
    }
    if (process->port_ == 0) return absl::UnavailableError("handoffd wrote no port file");
    process->serving_ = absl::Now();
    return process;
  }
  ~HandoffdProcess() {
    kill(pid_, SIGTERM);
    int st = 0;
    waitpid(pid_, &st, 0);
  }
  pid_t pid() const { return pid_; }
  // When posix_spawn was called, and when the port file was first seen.
  absl::Time started() const { return started_; }
  absl::Time serving() const { return serving_; }
  std::unique_ptr<handoff::v1::ConsumerAdmin::Stub> Stub() const {
    return handoff::v1::ConsumerAdmin::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
  }

 private:
  HandoffdProcess(pid_t pid, absl::Time started) : pid_(pid), started_(started) {}
  const pid_t pid_;
  const absl::Time started_;
  absl::Time serving_;
  int port_ = 0;
};

// Recovery as an operator meets it: handoffd started as a process over the data set (its
// files and the binary dropped from the page cache), from posix_spawn to the first
// commit of a new event that its admin API reports. Workers start before the admin API
// serves, so a commit may come before the first answer can show it: the figure is an
// upper bound on start-to-first-commit.
json RecoveryOfHandoffd(const ProbeArgs& a) {
  if (a.handoffd.empty() || !fs::exists(a.handoffd)) return Error("no handoffd binary");
  json figures = SetUpRecoveryRun(a, {a.dir + "/db", a.handoffd});
  if (figures.contains("error")) return figures;
  absl::StatusOr<std::unique_ptr<HandoffdProcess>> handoffd =
      HandoffdProcess::Start(a, {}, a.dir);
  if (!handoffd.ok()) return Error("handoffd", handoffd.status());
  const absl::Time t0 = (*handoffd)->started();
  auto stub = (*handoffd)->Stub();
  const uint64_t generated_blocks = a.rows / a.logs_per_block;
  int64_t calls = 0;
  std::optional<absl::Time> seen;
  while (!seen && absl::Now() < t0 + absl::Seconds(60)) {
    handoff::v1::ListSourcesRequest req;
    req.set_page_size(1000);
    handoff::v1::ListSourcesResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status gs = stub->ListSources(&ctx, req, &resp);
    ++calls;
    if (!gs.ok()) return Error(absl::StrCat("ListSources: ", gs.error_message()));
    for (const handoff::v1::Source& source : resp.sources()) {
      const handoff::v1::Checkpoint& cp = source.progress().checkpoint();
      if (cp.has_applied() && cp.applied_block() >= generated_blocks) seen = absl::Now();
    }
  }
  if (!seen) return Error("handoffd reported no new commit within 60 s");
  figures["admin_serving_seconds"] = absl::ToDoubleSeconds((*handoffd)->serving() - t0);
  figures["first_commit_seconds"] = absl::ToDoubleSeconds(*seen - t0);
  figures["list_calls"] = calls;
  return figures;
}

// CreateSource over `stub`; the error as a probe reports it.
std::optional<json> CreateOver(handoff::v1::ConsumerAdmin::Stub* stub,
                               const handoff::v1::SourceSpec& spec, bool start) {
  handoff::v1::CreateSourceRequest req;
  *req.mutable_spec() = spec;
  req.set_start(start);
  handoff::v1::Source created;
  grpc::ClientContext ctx;
  grpc::Status gs = stub->CreateSource(&ctx, req, &created);
  if (!gs.ok()) return Error(absl::StrCat("CreateSource: ", gs.error_message()));
  return std::nullopt;
}

json Admin(const ProbeArgs& a) {
  if (a.handoffd.empty() || !fs::exists(a.handoffd)) return AdminInProcess(a);
  // Modes: "default" the defaults (admin threads real-time when permitted) and a caller that
  // stands in for one on another machine; "caller_normal" the same server and a caller
  // sharing the saturated cores at normal priority; "no_rt" admin threads at normal
  // priority (no CAP_SYS_NICE) and a normal caller, as before.
  std::vector<std::string> extra;
  if (a.mode == "no_rt") extra.push_back("--admin_realtime_priority=0");
  absl::StatusOr<std::unique_ptr<HandoffdProcess>> handoffd = HandoffdProcess::Start(a, extra);
  if (!handoffd.ok()) return Error("handoffd", handoffd.status());
  const pid_t pid = (*handoffd)->pid();
  auto stub = (*handoffd)->Stub();
  if (std::optional<json> e = CreateOver(stub.get(), Spec("admin-0", a, "admin"), false)) {
    return *e;
  }
  handoff::v1::Source created;
  handoff::v1::GetProgressRequest preq;
  preq.set_source_id("admin-0");
  handoff::v1::Progress progress;
  // A caller on another machine (a backend service, an operator's grpcurl) wakes for
  // its reply on a core handoffd's workers do not keep busy. Here the caller shares
  // the two saturated cores, so its own wake-up would queue behind the workers' slices:
  // it runs under SCHED_RR to stand in for the remote caller. "caller_normal" measures
  // the caller on the same cores at normal priority.
  std::string caller_policy = "normal";
  if (a.mode == "default") {
    absl::Status rt = handoff::UseRealtimeSchedulingForCurrentThread(1);
    caller_policy = rt.ok() ? "SCHED_RR 1" : absl::StrCat("normal (", rt.message(), ")");
  }
  // One GetProgress per millisecond until `end`, each call's latency in microseconds.
  auto sample = [&](absl::Time end, std::vector<double>* us) -> grpc::Status {
    while (absl::Now() < end) {
      grpc::ClientContext ctx;
      const absl::Time c0 = absl::Now();
      grpc::Status gs = stub->GetProgress(&ctx, preq, &progress);
      us->push_back(absl::ToDoubleMicroseconds(absl::Now() - c0));
      if (!gs.ok()) return gs;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return grpc::Status::OK;
  };
  // The same calls to the same server with nothing ingesting: the floor of this machine.
  std::vector<double> idle_us;
  const MachineTicks idle0 = ReadMachineTicks();
  grpc::Status gs = sample(absl::Now() + absl::Seconds(std::min(a.window_s, 3.0)), &idle_us);
  const double idle_steal = StealFraction(idle0, ReadMachineTicks());
  if (!gs.ok()) return Error(absl::StrCat("GetProgress: ", gs.error_message()));
  {
    grpc::ClientContext ctx;
    handoff::v1::StartSourceRequest start;
    start.set_source_id("admin-0");
    gs = stub->StartSource(&ctx, start, &created);
    if (!gs.ok()) return Error(absl::StrCat("StartSource: ", gs.error_message()));
  }
  auto applied = [&]() -> int64_t {
    grpc::ClientContext ctx;
    if (!stub->GetProgress(&ctx, preq, &progress).ok()) return -1;
    return progress.counters().applied();
  };
  // Wait until ingest runs at full speed.
  for (int i = 0; i < 1000 && applied() < 10000; ++i) absl::SleepFor(absl::Milliseconds(5));
  const int64_t before = applied();
  std::vector<double> us;
  const absl::Time t0 = absl::Now();
  const MachineTicks ticks0 = ReadMachineTicks();
  gs = sample(t0 + absl::Seconds(a.window_s), &us);
  const double steal = StealFraction(ticks0, ReadMachineTicks());
  if (!gs.ok()) return Error(absl::StrCat("GetProgress: ", gs.error_message()));
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  const int64_t after = progress.counters().applied();
  json out = LatencyJson(us);
  out["idle_server"] = LatencyJson(idle_us);
  out["idle_server"]["steal_fraction"] = idle_steal;
  // A vCPU the hypervisor deschedules for a millisecond or more delays every call that
  // needs it then: at a steal of ~1% of the time the p99 is exposed to it.
  out["steal_fraction"] = steal;
  out["transport"] = "gRPC loopback to handoffd";
  out["caller_policy"] = caller_policy;
  out["server_realtime_threads"] = RealtimeThreads(pid);
  out["ingest_events_per_s"] = (after - before) / secs;
  out["ingest_still_running"] = after < a.events;
  return out;
}

// ---- idle: many sources, nothing new upstream ----

// A process's CPU time (user + system), first page touches and context switches so far,
// from /proc (another process's: getrusage sees only this one and its reaped children).
ProcessUsage UsageOfPid(pid_t pid) {
  ProcessUsage u;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // Fields after the command (which may hold spaces) start after the last ')'.
  const size_t close = text.rfind(')');
  if (close != std::string::npos) {
    std::vector<std::string> f = absl::StrSplit(text.substr(close + 2), ' ');
    // f[0] is field 3 (state): minflt is field 10, utime 14, stime 15.
    if (f.size() > 12) {
      const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
      u.minor_faults = std::strtoll(f[7].c_str(), nullptr, 10);
      u.cpu_seconds = (std::strtod(f[11].c_str(), nullptr) + std::strtod(f[12].c_str(), nullptr)) /
                      tick;
    }
  }
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0 ||
        line.rfind("nonvoluntary_ctxt_switches:", 0) == 0) {
      u.context_switches += std::strtoll(line.c_str() + line.find(':') + 1, nullptr, 10);
    }
  }
  return u;
}

// A `/proc/PID/status` figure in MiB (VmRSS, VmHWM).
double StatusMb(pid_t pid, const std::string& field) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::strtod(line.c_str() + field.size() + 1, nullptr) / 1024.0;
    }
  }
  return 0;
}

// The simulator's requests served so far (its /sim/status), or -1.
int64_t SimRequests(const std::string& sim_url) {
  CURL* curl = curl_easy_init();
  std::string body;
  curl_easy_setopt(curl, CURLOPT_URL, (sim_url + "/sim/status").c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  const CURLcode rc = curl_easy_perform(curl);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK) return -1;
  const json status = json::parse(body, nullptr, false);
  return status.is_object() ? status.value("requests", int64_t{-1}) : -1;
}

// An idle window's figures: CPU over the window, and per poll what it cost besides
// instructions (wake-ups and first touches), with the hypervisor's share meanwhile.
json IdleFigures(int sources, double wall, const ProcessUsage& usage0,
                 const ProcessUsage& usage1, int64_t polls, const MachineTicks& ticks0) {
  const double cpu = usage1.cpu_seconds - usage0.cpu_seconds;
  const double per_poll = polls > 0 ? 1.0 / polls : 0.0;
  return json{{"sources", sources},
              {"window_seconds", wall},
              {"cpu_seconds", cpu},
              {"core_fraction", cpu / wall},
              {"polls_per_s", polls / wall},
              {"cpu_us_per_poll", cpu * 1e6 * per_poll},
              {"context_switches_per_poll",
               (usage1.context_switches - usage0.context_switches) * per_poll},
              {"minor_faults_per_poll", (usage1.minor_faults - usage0.minor_faults) * per_poll},
              {"steal_fraction", StealFraction(ticks0, ReadMachineTicks())}};
}

// Idle cost of handoffd itself: everything a production process runs for its sources
// (workers, the idle poller, the health reporter, the gRPC server, metrics), measured
// from /proc over the window.
json IdleHandoffd(const ProbeArgs& a) {
  absl::StatusOr<std::unique_ptr<HandoffdProcess>> handoffd = HandoffdProcess::Start(a, {});
  if (!handoffd.ok()) return Error("handoffd", handoffd.status());
  const pid_t pid = (*handoffd)->pid();
  auto stub = (*handoffd)->Stub();
  const double base_rss_mb = StatusMb(pid, "VmRSS");
  for (int i = 0; i < a.sources; ++i) {
    const handoff::v1::SourceSpec spec = Spec(absl::StrCat("idle-", i), a, absl::StrCat("s", i));
    if (std::optional<json> e = CreateOver(stub.get(), spec, true)) return *e;
  }
  // Caught up: every source applied its events (read through ListSources, 1000 a page).
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  int64_t caught_up = 0;
  while (absl::Now() < deadline) {
    caught_up = 0;
    handoff::v1::ListSourcesRequest list;
    list.set_page_size(1000);
    do {
      handoff::v1::ListSourcesResponse page;
      grpc::ClientContext ctx;
      grpc::Status gs = stub->ListSources(&ctx, list, &page);
      if (!gs.ok()) return Error(absl::StrCat("ListSources: ", gs.error_message()));
      for (const handoff::v1::Source& src : page.sources()) {
        if (static_cast<int64_t>(src.progress().counters().applied()) >= a.events) ++caught_up;
      }
      list.set_page_token(page.next_page_token());
    } while (!list.page_token().empty());
    if (caught_up == a.sources) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  if (caught_up != a.sources) {
    return Error(absl::StrCat("sources did not catch up: ", caught_up, " of ", a.sources));
  }
  // Settle: let every polling worker reach its capped idle backoff, as a long idle
  // period would (the 0.2 s -> 30 s growth takes ~40 s). SSE workers have no backoff.
  absl::SleepFor(a.transport == "sse" ? absl::Seconds(5) : absl::Seconds(a.window_s * 3));
  const ProcessUsage usage0 = UsageOfPid(pid);
  const int64_t requests0 = SimRequests(a.sim_url);
  const MachineTicks ticks0 = ReadMachineTicks();
  const absl::Time t0 = absl::Now();
  absl::SleepFor(absl::Seconds(a.window_s));
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  const ProcessUsage usage1 = UsageOfPid(pid);
  const int64_t requests = SimRequests(a.sim_url) - requests0;
  json out = IdleFigures(a.sources, wall, usage0, usage1, requests, ticks0);
  out["process"] = "handoffd";
  out["base_rss_mb"] = base_rss_mb;
  out["store_ceiling_mb"] = store::StoreMemoryCeiling(store::StoreOptions()) / double{1 << 20};
  // The measured process's peak, not this client's (RunChild keeps it).
  out["self_peak_rss_mb"] = StatusMb(pid, "VmHWM");
  return out;
}

json Idle(const ProbeArgs& a) {
  if (!a.handoffd.empty() && fs::exists(a.handoffd)) return IdleHandoffd(a);
  CountingObserver obs;
  Engine engine;
  absl::Status s = StartEngine(a.dir + "/db", a.sync, &obs, &engine);
  if (!s.ok()) return Error("engine", s);
  for (int i = 0; i < a.sources; ++i) {
    handoff::v1::CreateSourceRequest req;
    *req.mutable_spec() = Spec(absl::StrCat("idle-", i), a, absl::StrCat("s", i));
    req.set_start(true);
    absl::StatusOr<handoff::v1::Source> src = engine.manager->CreateSource(req);
    if (!src.ok()) return Error("create source", src.status());
  }
  const int64_t target = a.events * a.sources;
  if (!obs.WaitTotal(target, absl::Now() + absl::Minutes(5))) {
    return Error(absl::StrCat("sources did not catch up: ", obs.total(), " of ", target, "; ",
                              obs.error()));
  }
  // Settle: let every polling worker reach its capped idle backoff, as a long idle
  // period would (the 0.2 s -> 30 s growth takes ~40 s). SSE workers have no backoff.
  absl::SleepFor(a.transport == "sse" ? absl::Seconds(5) : absl::Seconds(a.window_s * 3));
  const ProcessUsage usage0 = ReadProcessUsage();
  const MachineTicks ticks0 = ReadMachineTicks();
  const int64_t fetches0 = g_fetches.load();
  const absl::Time t0 = absl::Now();
  absl::SleepFor(absl::Seconds(a.window_s));
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  const ProcessUsage usage1 = ReadProcessUsage();
  json out =
      IdleFigures(a.sources, wall, usage0, usage1, g_fetches.load() - fetches0, ticks0);
  out.update(MemoryTerms(engine, a));
  return out;
}

}  // namespace

json RunProbe(const ProbeArgs& a) {
  if (a.probe == "sim_alone") return SimAlone(a);
  if (a.probe == "bare_rocks") return BareRocks(a);
  if (a.probe == "e2e") return E2e(a);
  if (a.probe == "sink_direct") return SinkDirect(a);
  if (a.probe == "sink_e2e") return SinkE2e(a);
  if (a.probe == "recovery") return a.mode == "handoffd" ? RecoveryOfHandoffd(a) : Recovery(a);
  if (a.probe == "admin") return Admin(a);
  if (a.probe == "idle") return Idle(a);
  return Error(absl::StrCat("unknown probe '", a.probe, "'"));
}

}  // namespace handoff::bench
