#include "server/flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "base/thread_priority.h"
#include "consumer/source_worker.h"
#include "server/factories.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7443",
          "gRPC listen address host:port (port 0: any free port). Loopback by default; "
          "use 0.0.0.0:7443 in a container.");
ABSL_FLAG(std::string, health_listen, "",
          "Plaintext host:port serving only grpc.health.v1, for Kubernetes gRPC probes "
          "(the kubelet cannot speak TLS); empty: none.");
ABSL_FLAG(std::string, port_file, "",
          "If set, write `grpc <port>`, `metrics <port>`, `health <port>` lines here once "
          "serving.");
ABSL_FLAG(std::string, data_dir, "", "Data directory (required); the database is DATA_DIR/db.");
ABSL_FLAG(int, write_buffer_mb, handoff::store::StoreOptions().write_buffer_bytes >> 20,
          "RocksDB memtable size (MiB, 4..1024) of the rows, outbox and receipts column "
          "families; with --block_cache_mb it sets the database's memory ceiling (logged at "
          "start; README, Memory).");
ABSL_FLAG(int, block_cache_mb, handoff::store::StoreOptions().block_cache_bytes >> 20,
          "RocksDB block cache (MiB, 8..65536), shared by every column family.");
ABSL_FLAG(absl::Duration, wal_sync_interval, handoff::store::StoreOptions().wal_sync_interval,
          "Shortest time between the starts of two background WAL syncs (0..100ms) while "
          "no caller waits for one: the pages written meanwhile share one fsync. A page is "
          "reported only once synced, so this is also the longest it may wait for that "
          "beyond its own fsync under load; after a quiet spell a page is synced at once.");
ABSL_FLAG(std::string, metrics_listen, "",
          "Prometheus metrics address host:port (GET /metrics); empty disables metrics.");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate chain; enables TLS with --tls_key.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle; when set, clients must present a certificate it signed (mTLS).");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "Bearer token file, one `name role token` a line (role: reader|operator).");
ABSL_FLAG(bool, insecure_disable_auth, false,
          "Serve the admin API without authentication (development only; warns at start).");
ABSL_FLAG(std::string, sources_config, "",
          "Declared sources, protobuf text format of handoff.v1.SourcesConfig.");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error.");
ABSL_FLAG(int, max_sources, 10000, "Maximum number of sources (RESOURCE_EXHAUSTED beyond).");
ABSL_FLAG(int, max_message_bytes, 4 << 20, "Largest gRPC request accepted, in bytes.");
ABSL_FLAG(int, max_watchers, 256, "Maximum concurrent WatchProgress streams.");
ABSL_FLAG(int, admin_realtime_priority, handoff::server::ServerOptions().admin_realtime_priority,
          "SCHED_RR priority (1..99) of the gRPC threads while they wait for an admin call "
          "or answer a point read (GetProgress, GetSource, GetHold), so such calls answer "
          "at once while ingest keeps every core busy; other calls run at normal priority. "
          "Needs CAP_SYS_NICE (without it: a warning, and normal priority). 0: off.");
ABSL_FLAG(int, worker_nice, handoff::consumer::WorkerOptions().thread_nice,
          "Nice increment (0..19) of the source workers' threads, so that admin RPCs and "
          "health checks answer promptly while ingest uses every core; 0 keeps them at "
          "the process's priority.");
ABSL_FLAG(bool, worker_sched_idle, false,
          "Also run the source workers' threads under SCHED_IDLE: a woken admin or health "
          "thread preempts them at once (lower admin tail latency under full ingest), but "
          "a control plane that keeps the cores busy starves ingest.");
ABSL_FLAG(int, max_unsynced_pages, handoff::consumer::WorkerOptions().max_unsynced_pages,
          "Pages a source may have written whose WAL sync is still in flight (0..8): the "
          "source validates and writes its next pages meanwhile and reports a page only "
          "once it is synced. 0 makes every page wait for its own fsync.");
ABSL_FLAG(int, max_pages_in_flight, static_cast<int>(handoff::server::DefaultMaxPagesInFlight()),
          "Pages all sources together hold at once, from fetch to release (1..4096; "
          "default 8 per core, at least 16): "
          "page memory is bounded by this, not by the number of sources. Sources wait "
          "for a page slot first come, first served; a source's prefetch uses a slot "
          "only when one is free.");
ABSL_FLAG(int, max_page_bytes, static_cast<int>(handoff::server::kDefaultMaxPageBytes),
          "Largest page a source accepts from its provider, in bytes (65536..268435456, "
          "default 64 MiB): a polled body (by its Content-Length, or once that many bytes "
          "arrived) or an SSE frame above it (and 4 KiB of framing) is refused as a "
          "malformed page (page_too_large: retried, then the source halts as "
          "PROTOCOL_VIOLATION; lower its page_limit). It caps b of the memory bound "
          "(README, Memory): set it to the largest page the memory limit was sized for.");
ABSL_FLAG(bool, adaptive_page_slots, true,
          "Adapt the page slots in use between 3 and --max_pages_in_flight to the latency "
          "of the fetches (TCP Vegas's rule): more while more pages in flight do not make "
          "each slower (a distant provider), fewer once they only share the CPU (a busy "
          "machine, a provider on it). false: all --max_pages_in_flight slots are used.");
ABSL_FLAG(std::string, api_key_dir, "",
          "If set, a source's api_key.file (and sink.downstream.token.file) must be a file "
          "inside this directory (symlinks resolved), e.g. the mounted Secret of provider "
          "keys: the admin API cannot point a source at another file of the process. Empty: "
          "any file.");
ABSL_FLAG(std::string, api_key_env_prefix, "",
          "If set, a source's api_key.env (and sink.downstream.token.env) must start with "
          "this prefix (e.g. HANDOFF_PROVIDER_KEY_). Empty: any variable.");
ABSL_FLAG(absl::Duration, idle_poll_max, handoff::consumer::WorkerOptions().idle_backoff.max,
          "Longest wait between two polls of a caught-up polling source (each wait is "
          "uniform in [half, all] of the growing ceiling). Longer costs less CPU per idle "
          "source and adds head latency; SSE sources are pushed to and do not poll.");
ABSL_FLAG(absl::Duration, idle_poll_coalesce,
          handoff::consumer::WorkerOptions().idle_backoff.coalesce,
          "Grid the idle polls of caught-up polling sources are aligned to (waits of at "
          "least four steps end on a multiple of it), so that one wake-up of the machine "
          "serves many sources' polls. Adds less than one step to a wait; 0 turns it off.");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(30),
          "Upper bound of a graceful shutdown (keep the Kubernetes "
          "terminationGracePeriodSeconds a little above it): a quarter for in-flight admin "
          "calls, then workers stop at safe points until 7/8 of it. A worker still running "
          "then (a provider or sink call ignoring its cancellation) is abandoned and logged, "
          "and handoffd exits with status 1 without closing the database under it "
          "(recovered at the next start, as after a crash).");

namespace handoff::server {
namespace {

// --max_page_bytes: 64 KiB (about 80 logs) .. 256 MiB.
constexpr int kMinMaxPageBytes = 64 << 10;
constexpr int kMaxMaxPageBytes = 256 << 20;

}  // namespace

absl::StatusOr<ServerOptions> OptionsFromFlags() {
  ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.health_listen = absl::GetFlag(FLAGS_health_listen);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  const int write_buffer_mb = absl::GetFlag(FLAGS_write_buffer_mb);
  if (write_buffer_mb < 4 || write_buffer_mb > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--write_buffer_mb=", write_buffer_mb, " is outside 4..1024"));
  }
  options.write_buffer_bytes = static_cast<size_t>(write_buffer_mb) << 20;
  const int block_cache_mb = absl::GetFlag(FLAGS_block_cache_mb);
  if (block_cache_mb < 8 || block_cache_mb > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block_cache_mb=", block_cache_mb, " is outside 8..65536"));
  }
  options.block_cache_bytes = static_cast<size_t>(block_cache_mb) << 20;
  const absl::Duration sync_interval = absl::GetFlag(FLAGS_wal_sync_interval);
  if (sync_interval < absl::ZeroDuration() || sync_interval > absl::Milliseconds(100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--wal_sync_interval=", absl::FormatDuration(sync_interval),
                     " is outside 0..100ms"));
  }
  options.wal_sync_interval = sync_interval;
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  options.insecure_disable_auth = absl::GetFlag(FLAGS_insecure_disable_auth);
  options.sources_config = absl::GetFlag(FLAGS_sources_config);
  ASSIGN_OR_RETURN(options.log_level, ParseLogLevel(absl::GetFlag(FLAGS_log_level)));
  options.max_sources = absl::GetFlag(FLAGS_max_sources);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.max_watchers = absl::GetFlag(FLAGS_max_watchers);
  options.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  const int realtime = absl::GetFlag(FLAGS_admin_realtime_priority);
  if (realtime < 0 || realtime > handoff::kMaxRealtimePriority) {
    return absl::InvalidArgumentError(absl::StrCat("--admin_realtime_priority=", realtime,
                                                   " is outside 0..",
                                                   handoff::kMaxRealtimePriority));
  }
  options.admin_realtime_priority = realtime;
  const int nice = absl::GetFlag(FLAGS_worker_nice);
  if (nice < 0 || nice > 19) {
    return absl::InvalidArgumentError(absl::StrCat("--worker_nice=", nice, " is outside 0..19"));
  }
  options.worker.thread_nice = nice;
  options.worker.thread_sched_idle = absl::GetFlag(FLAGS_worker_sched_idle);
  const int unsynced = absl::GetFlag(FLAGS_max_unsynced_pages);
  if (unsynced < 0 || unsynced > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_unsynced_pages=", unsynced, " is outside 0..8"));
  }
  options.worker.max_unsynced_pages = unsynced;
  const absl::Duration idle_poll_max = absl::GetFlag(FLAGS_idle_poll_max);
  if (idle_poll_max < absl::Seconds(1) || idle_poll_max > absl::Minutes(10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--idle_poll_max=", absl::FormatDuration(idle_poll_max),
                     " is outside 1s..10m"));
  }
  options.worker.idle_backoff.max = idle_poll_max;
  const absl::Duration coalesce = absl::GetFlag(FLAGS_idle_poll_coalesce);
  if (coalesce < absl::ZeroDuration() || coalesce > absl::Seconds(5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--idle_poll_coalesce=", absl::FormatDuration(coalesce),
                     " is outside 0s..5s"));
  }
  options.worker.idle_backoff.coalesce = coalesce;
  options.handle_signals = true;
  options.source_manager_factory = CreateProductionSourceManager;
  const int pages_in_flight = absl::GetFlag(FLAGS_max_pages_in_flight);
  if (pages_in_flight < 1 || pages_in_flight > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_pages_in_flight=", pages_in_flight, " is outside 1..4096"));
  }
  const int max_page_bytes = absl::GetFlag(FLAGS_max_page_bytes);
  if (max_page_bytes < kMinMaxPageBytes || max_page_bytes > kMaxMaxPageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("--max_page_bytes=", max_page_bytes,
                                                   " is outside ", kMinMaxPageBytes, "..",
                                                   kMaxMaxPageBytes));
  }
  options.max_page_bytes = static_cast<size_t>(max_page_bytes);
  ApiKeyPolicy api_keys;
  api_keys.dir = absl::GetFlag(FLAGS_api_key_dir);
  api_keys.env_prefix = absl::GetFlag(FLAGS_api_key_env_prefix);
  options.factories = ProductionFactories(static_cast<size_t>(pages_in_flight),
                                          absl::GetFlag(FLAGS_adaptive_page_slots),
                                          std::move(api_keys), options.max_page_bytes);
  return options;
}

}  // namespace handoff::server
