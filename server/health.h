// HealthReporter: keeps grpc.health.v1 statuses current.
//
// Service names and when they are SERVING:
//  * ""  and "handoff.v1.ConsumerAdmin": the process serves the admin API; NOT_SERVING
//    while the store is unusable (Store::health() not OK: a write or sync failed, which
//    is sticky until the process reopens the database) and once shutdown began.
//  * "<source id>" (each source is its own health service name; ids cannot contain a
//    '.', so they never collide with a gRPC service name): SERVING only while the source
//    advances or waits normally, i.e. in STARTING, RUNNING or BACKING_OFF (a transient
//    provider or sink failure being retried). Every other state is NOT_SERVING:
//    STOPPED and STOPPING (not advancing by request), BLOCKED_ON_HOLD (waiting for an
//    operator's ResolveHold), and the halted states (RESYNC_REQUIRED, FUNDING_REQUIRED,
//    AUTH_FAILED, CONFIG_INVALID, PROTOCOL_VIOLATION, STORAGE_FAILED). A deleted source
//    is set NOT_SERVING by the next pass, once, and the reporter forgets it; gRPC's
//    default health service cannot forget a name, so the name answers NOT_SERVING until
//    restart (an id never seen is NOT_FOUND). A source created again under the id
//    reports its own state from the next pass on.
//
// Statuses are refreshed by one ticker thread every `interval` (absl::Notification
// wait, not a busy loop), reading SourceManager::AllProgress() and the store's health.
// While the store is failed each pass also halts every running source
// (SourceManager::HaltOnStoreFailure): a caught-up source writes nothing that would
// meet the failure, and would poll its provider on.
//
// Thread-safe. Start() at most once; Stop() is safe when never started and idempotent.
#ifndef HANDOFF_SERVER_HEALTH_H_
#define HANDOFF_SERVER_HEALTH_H_

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "consumer/source_manager.h"
#include "server/logging.h"

namespace grpc {
class HealthCheckServiceInterface;
}

namespace handoff::server {

inline constexpr char kAdminServiceName[] = "handoff.v1.ConsumerAdmin";

// Whether a source in `state` reports SERVING (see above).
bool SourceServing(handoff::v1::SourceState state);

class HealthReporter {
 public:
  // None owned; all outlive the reporter. Every status goes to each of `health` (the
  // admin server's and the plaintext probe server's health services).
  HealthReporter(std::vector<grpc::HealthCheckServiceInterface*> health,
                 consumer::SourceManager* manager,
                 std::function<absl::Status()> store_health, Logger* logger,
                 absl::Duration interval);
  ~HealthReporter();

  HealthReporter(const HealthReporter&) = delete;
  HealthReporter& operator=(const HealthReporter&) = delete;

  // One refresh now, then the ticker thread.
  void Start();
  // Stops the ticker. Then marks everything NOT_SERVING and freezes the statuses
  // (HealthCheckServiceInterface::Shutdown) so probes see the server leaving.
  void Stop();

  // One refresh pass (the ticker calls it; tests may too).
  void Refresh() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();

  // Constant after construction.
  const std::vector<grpc::HealthCheckServiceInterface*> health_;
  consumer::SourceManager* const manager_;
  const std::function<absl::Status()> store_health_;
  Logger* const logger_;
  const absl::Duration interval_;

  absl::Notification stop_;
  std::thread ticker_;  // touched only by Start/Stop (the owner's thread)

  absl::Mutex mu_;
  // The sources of the last pass (a deleted one is marked NOT_SERVING once, then dropped).
  absl::flat_hash_set<std::string> reported_ ABSL_GUARDED_BY(mu_);
  bool store_ok_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_HEALTH_H_
