// AdminService: the gRPC adapter of handoff.v1.ConsumerAdmin over consumer::SourceManager.
//
// Each handler (0) enters its scheduling scope (admin_call_scheduling.h: GetProgress,
// GetSource and GetHold are point reads, every other call is not), (1) authorizes the
// caller (auth.h; reader RPCs vs operator RPCs),
// (2) refuses a call whose deadline already passed, (3) calls the core, which validates
// the request and names the bad field, and (4) maps the status with ToGrpcStatus. The
// adapter holds no source state of its own. Funding actions in Progress are only
// returned to operators.
//
// WatchProgress runs on its own sync-server thread: it sends the current progress, then
// one message per change (the core coalesces changes into generations) and a heartbeat
// after `heartbeat_ms` without change. It wakes at least every kWatchRecheck to notice a
// cancelled client or BeginShutdown(), so it never outlives either by more than that.
// At most `max_watchers` streams run at once; more are RESOURCE_EXHAUSTED.
//
// Thread-safe. `manager` and `auth` are not owned and outlive the service.
#ifndef HANDOFF_SERVER_ADMIN_SERVICE_H_
#define HANDOFF_SERVER_ADMIN_SERVICE_H_

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "consumer/source_manager.h"
#include "handoff/v1/consumer_admin.grpc.pb.h"
#include "server/admin_call_scheduling.h"
#include "server/auth.h"

namespace handoff::server {

struct AdminServiceOptions {
  int max_watchers = 256;
  // How often an idle WatchProgress re-checks for a cancelled client or a server stop.
  absl::Duration watch_recheck = absl::Milliseconds(200);
  // The policy of the threads that answer calls: point reads real-time when enabled
  // (admin_call_scheduling.h); disabled by default.
  AdminCallScheduling call_scheduling;
};

class AdminService final : public handoff::v1::ConsumerAdmin::Service {
 public:
  AdminService(consumer::SourceManager* manager, const Authenticator* auth,
               AdminServiceOptions options);

  // Ends every WatchProgress stream (with OK) within one recheck interval and makes new
  // ones end at once. Called before the gRPC server's Shutdown so streams do not hold
  // it up until its deadline. Idempotent, thread-safe.
  void BeginShutdown();

  int active_watchers() const { return watchers_.load(); }
  const AdminCallScheduling& call_scheduling() const { return options_.call_scheduling; }

  grpc::Status CreateSource(grpc::ServerContext* context,
                            const handoff::v1::CreateSourceRequest* request,
                            handoff::v1::Source* response) override;
  grpc::Status StartSource(grpc::ServerContext* context,
                           const handoff::v1::StartSourceRequest* request,
                           handoff::v1::Source* response) override;
  grpc::Status StopSource(grpc::ServerContext* context,
                          const handoff::v1::StopSourceRequest* request,
                          handoff::v1::Source* response) override;
  grpc::Status DeleteSource(grpc::ServerContext* context,
                            const handoff::v1::DeleteSourceRequest* request,
                            handoff::v1::DeleteSourceResponse* response) override;
  grpc::Status GetSource(grpc::ServerContext* context,
                         const handoff::v1::GetSourceRequest* request,
                         handoff::v1::Source* response) override;
  grpc::Status ListSources(grpc::ServerContext* context,
                           const handoff::v1::ListSourcesRequest* request,
                           handoff::v1::ListSourcesResponse* response) override;
  grpc::Status GetProgress(grpc::ServerContext* context,
                           const handoff::v1::GetProgressRequest* request,
                           handoff::v1::Progress* response) override;
  grpc::Status WatchProgress(grpc::ServerContext* context,
                             const handoff::v1::WatchProgressRequest* request,
                             grpc::ServerWriter<handoff::v1::Progress>* writer) override;
  grpc::Status ListHolds(grpc::ServerContext* context,
                         const handoff::v1::ListHoldsRequest* request,
                         handoff::v1::ListHoldsResponse* response) override;
  grpc::Status GetHold(grpc::ServerContext* context, const handoff::v1::GetHoldRequest* request,
                       handoff::v1::Hold* response) override;
  grpc::Status ResolveHold(grpc::ServerContext* context,
                           const handoff::v1::ResolveHoldRequest* request,
                           handoff::v1::ResolveHoldResponse* response) override;
  grpc::Status ListQuarantine(grpc::ServerContext* context,
                              const handoff::v1::ListQuarantineRequest* request,
                              handoff::v1::ListQuarantineResponse* response) override;
  grpc::Status RebuildSource(grpc::ServerContext* context,
                             const handoff::v1::RebuildSourceRequest* request,
                             handoff::v1::Source* response) override;
  grpc::Status QueryEvents(grpc::ServerContext* context,
                           const handoff::v1::QueryEventsRequest* request,
                           handoff::v1::QueryEventsResponse* response) override;

 private:
  // Authorizes the call and checks its deadline; the caller on success.
  absl::StatusOr<Caller> Admit(const grpc::ServerContext& context, Permission permission,
                               absl::string_view rpc) const;

  // Constant after construction.
  consumer::SourceManager* const manager_;
  const Authenticator* const auth_;
  const AdminServiceOptions options_;

  std::atomic<int> watchers_{0};
  absl::Notification shutting_down_;
};

// Clears operator-only fields (the funding action) of what a reader receives.
void RedactForCaller(const Caller& caller, handoff::v1::Progress* progress);

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_ADMIN_SERVICE_H_
