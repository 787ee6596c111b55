// Server: handoffd's process. Owns every part and wires them together:
//
//   Store (RocksDB in <data_dir>/db) <- SourceManager (workers) <- AdminService (gRPC)
//   plus health (HealthReporter), metrics (MetricsObserver, ProgressCollector,
//   MetricsEndpoint), structured logs (Logger, LoggingObserver), bearer-token auth and
//   TLS credentials.
//
// Start-up (BuildAndStart): validate options, load tokens, TLS files and the sources
// config (fail fast, before touching the database), open the store, create the
// SourceManager, Recover() (restart the sources that were running), apply the declared
// sources, start the gRPC server (admin API, grpc.health.v1, reflection), health ticker
// and metrics, then write the port file. Any failure undoes what was built, in reverse.
//
// Shutdown (on SIGTERM/SIGINT, RequestShutdown, or destruction), in this order:
//   1. health: every service NOT_SERVING and frozen, so readiness fails first (the
//      plaintext probe server stops right after);
//   2. WatchProgress streams are told to end (within one recheck interval);
//   3. gRPC Shutdown with a deadline of shutdown_grace/4: stop accepting; in-flight
//      calls finish or are cancelled at the deadline;
//   4. the metrics endpoint stops (its scrapes read the SourceManager);
//   5. SourceManager::ShutdownBy: every worker stops at a safe point, never promoting a
//      barrier without durability, until 7/8 of shutdown_grace since shutdown began;
//   6. the SourceManager is destroyed, the store flushed and closed.
// So the whole shutdown fits in shutdown_grace (the Kubernetes grace period is set a
// little above it). A worker that has not stopped by step 5's deadline (a provider or
// sink call that ignores its cancellation) is abandoned: its source is logged (and
// listed by abandoned_sources()), and since its threads may still use the manager, the
// observers and the store, none of them is destroyed: the store is flushed but stays
// open. handoffd's main then ends the process with _exit (no destructor runs, as after a
// crash: the next start recovers from the WAL); destroying the Server instead waits for
// the abandoned workers to end before it destroys the store.
//
// Thread-safe: RequestShutdown from any thread; WaitForTermination from one thread.
#ifndef HANDOFF_SERVER_SERVER_H_
#define HANDOFF_SERVER_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "consumer/source_manager.h"
#include "server/admin_service.h"
#include "server/auth.h"
#include "server/fan_out_observer.h"
#include "server/health.h"
#include "server/logging.h"
#include "server/metrics.h"
#include "server/options.h"
#include "server/signals.h"
#include "store/store.h"

namespace grpc {
class Server;
}

namespace handoff::server {

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> BuildAndStart(ServerOptions options);

  // Shuts down (if not done yet) in the documented order.
  ~Server();

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Blocks until RequestShutdown() or, with handle_signals, SIGTERM/SIGINT; then shuts
  // down in order and returns.
  void WaitForTermination();
  // Makes WaitForTermination proceed. Any thread; idempotent.
  void RequestShutdown();
  // The ordered shutdown itself. Idempotent.
  void Shutdown();

  // The sources whose workers did not stop within shutdown_grace (see Shutdown above).
  std::vector<std::string> abandoned_sources() const ABSL_LOCKS_EXCLUDED(shutdown_mu_);

  int port() const { return port_; }
  int metrics_port() const { return metrics_ == nullptr ? 0 : metrics_->port(); }

 private:
  explicit Server(ServerOptions options);
  absl::Status Build();
  absl::Status StartGrpc();
  absl::Status StartHealthServer();
  absl::Status WritePortFile() const;

  const ServerOptions options_;

  // Parts in dependency order: each may use those above it, so the destructor's reverse
  // order stops users before what they use (signals and metrics first, the store last).
  std::unique_ptr<Logger> logger_;
  std::unique_ptr<store::Store> store_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsObserver> metrics_observer_;
  std::unique_ptr<LoggingObserver> logging_observer_;
  std::unique_ptr<FanOutObserver> observer_;  // the workers call it
  std::unique_ptr<consumer::SourceManager> manager_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<grpc::Server> health_server_;  // plaintext probes; may be null
  std::unique_ptr<HealthReporter> health_;  // uses both servers' health services
  std::shared_ptr<ProgressCollector> progress_collector_;
  std::unique_ptr<MetricsEndpoint> metrics_;
  std::unique_ptr<SignalWatcher> signals_;

  int port_ = 0;
  int health_port_ = 0;
  absl::Notification shutdown_requested_;
  mutable absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  std::vector<std::string> abandoned_sources_ ABSL_GUARDED_BY(shutdown_mu_);
};

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_SERVER_H_
