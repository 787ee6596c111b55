// ServerOptions: everything handoffd is configured with. main.cc fills it from flags
// (flags.h documents each flag); tests fill it directly.
#ifndef HANDOFF_SERVER_OPTIONS_H_
#define HANDOFF_SERVER_OPTIONS_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "consumer/source_manager.h"
#include "server/logging.h"
#include "store/store.h"

namespace handoff::server {

using SourceManagerFactory =
    std::function<absl::StatusOr<std::unique_ptr<consumer::SourceManager>>(
        consumer::SourceManagerOptions)>;

// HttpProviderOptions::max_page_bytes's default (flags_test checks they agree).
inline constexpr size_t kDefaultMaxPageBytes = size_t{64} << 20;

struct ServerOptions {
  // ---- gRPC ----
  // host:port of the admin API; port 0 picks a free port (see port_file).
  std::string listen = "127.0.0.1:7443";
  // Plaintext host:port serving only grpc.health.v1, for Kubernetes' native gRPC
  // probes (the kubelet cannot speak TLS); empty: none. Health is also served on
  // `listen`.
  std::string health_listen;
  // If set, the bound ports are written here once the server accepts calls, one
  // `name port` a line: `grpc <port>`, then `metrics <port>` and `health <port>` when
  // those are on. Written atomically (temp file + rename).
  std::string port_file;
  int max_message_bytes = 4 << 20;
  int max_watchers = 256;
  // SCHED_RR priority of the threads answering admin calls while they wait for a call
  // or answer a point read (admin_call_scheduling.h), 1..99; 0: normal priority. Needs
  // CAP_SYS_NICE: without it handoffd warns once and runs them at normal priority.
  int admin_realtime_priority = 1;

  // ---- Storage ----
  // The RocksDB database lives in <data_dir>/db.
  std::string data_dir;
  // Memtable size of the per-event column families and the block cache: with them,
  // store::StoreMemoryCeiling is the database's share of the memory bound (README).
  size_t write_buffer_bytes = store::StoreOptions().write_buffer_bytes;
  size_t block_cache_bytes = store::StoreOptions().block_cache_bytes;
  // Pacing of the background WAL syncs nobody waits for (store::StoreOptions).
  absl::Duration wal_sync_interval = store::StoreOptions().wal_sync_interval;

  // ---- Security ----
  // PEM files. Both or neither of cert and key; client_ca (mTLS) requires them.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // Exactly one of these: a token file (auth.h) or the explicit opt-out.
  std::string auth_tokens_file;
  bool insecure_disable_auth = false;

  // ---- Sources ----
  std::string sources_config;  // optional, sources_config.h
  int max_sources = 10000;
  // Worker tuning: thread priority, idle polling (flags worker_nice, idle_poll_max).
  consumer::WorkerOptions worker;
  // The largest page the provider adapter accepts (--max_page_bytes): a polled body or
  // SSE frame above it (a frame: and 4 KiB of framing) is refused as page_too_large
  // (consumer/provider/http_provider.h). It caps `b` of the memory bound (README,
  // "Memory"). Enforced by the provider factory in `factories` (flags.cc builds both from
  // the flag); the server only logs it at start.
  size_t max_page_bytes = kDefaultMaxPageBytes;

  // ---- Observability ----
  std::string metrics_listen;  // host:port of /metrics; empty: no metrics endpoint
  LogLevel log_level = LogLevel::kInfo;
  absl::Duration health_interval = absl::Seconds(1);

  // ---- Life cycle ----
  // Upper bound of a graceful shutdown: a quarter for in-flight RPCs, then workers reach
  // safe points until 7/8 of it, the rest for the store's flush and close; a worker not
  // stopped by then is abandoned (see server.h).
  absl::Duration shutdown_grace = absl::Seconds(30);
  // WaitForTermination also returns on SIGTERM/SIGINT (handoffd sets it; tests call
  // RequestShutdown instead).
  bool handle_signals = false;

  // ---- Core wiring (production: factories.h; tests: fakes) ----
  SourceManagerFactory source_manager_factory;
  consumer::Factories factories;
  // Receives log lines; empty: stderr.
  Logger::LineWriter log_writer;
};

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_OPTIONS_H_
