#include "server/admin_service.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/status_util.h"

namespace handoff::server {
namespace {

using handoff::v1::Progress;
using handoff::v1::Source;

constexpr uint32_t kDefaultHeartbeatMs = 5000;
constexpr uint32_t kMinHeartbeatMs = 100;

// Copies a core result into the response, or maps its error.
template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

// Releases a WatchProgress slot when the stream ends, however it ends.
class WatcherSlot {
 public:
  explicit WatcherSlot(std::atomic<int>* count) : count_(count), taken_(count->fetch_add(1) + 1) {}
  ~WatcherSlot() { count_->fetch_sub(1); }
  int taken() const { return taken_; }

 private:
  std::atomic<int>* const count_;
  const int taken_;
};

}  // namespace

void RedactForCaller(const Caller& caller, Progress* progress) {
  if (caller.role != Role::kOperator) progress->clear_funding_action();
}

AdminService::AdminService(consumer::SourceManager* manager, const Authenticator* auth,
                           AdminServiceOptions options)
    : manager_(manager), auth_(auth), options_(options) {}

void AdminService::BeginShutdown() {
  if (!shutting_down_.HasBeenNotified()) shutting_down_.Notify();
}

absl::StatusOr<Caller> AdminService::Admit(const grpc::ServerContext& context,
                                           Permission permission, absl::string_view rpc) const {
  absl::StatusOr<Caller> caller = auth_->Authorize(context, permission, rpc);
  if (!caller.ok()) return caller;
  // A call whose deadline already passed is not started (the core's operations are not
  // cancellable midway, so this is where the deadline is honoured).
  if (context.deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError(absl::StrCat(rpc, ": deadline exceeded before start"));
  }
  return caller;
}

grpc::Status AdminService::CreateSource(grpc::ServerContext* context,
                                        const handoff::v1::CreateSourceRequest* request,
                                        Source* response) {
  const AdminCallScheduling::Scope scheduling = options_.call_scheduling.OtherCall();
  absl::StatusOr<Caller> caller = Admit(*context, Permission::kOperate, "CreateSource");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(manager_->CreateSource(*request), response);
}

grpc::Status AdminService::StartSource(grpc::ServerContext* context,
                                       const handoff::v1::StartSourceRequest* request,
                                       Source* response) {
  const AdminCallScheduling::Scope scheduling = options_.call_scheduling.OtherCall();
  absl::StatusOr<Caller> caller = Admit(*context, Permission::kOperate, "StartSource");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(manager_->StartSource(request->source_id()), response);
}

grpc::Status AdminService::StopSource(grpc::ServerContext* context,
                                      const handoff::v1::StopSourceRequest* request,
                                      Source* response) {
  const AdminCallScheduling::Scope scheduling = options_.call_scheduling.OtherCall();
  absl::StatusOr<Caller> caller = Admit(*context, Permission::kOperate, "StopSource");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(manager_->StopSource(request->source_id()), response);
}

grpc::Status AdminService::DeleteSource(grpc::ServerContext* context,
                                        const handoff::v1::DeleteSourceRequest* request,
                                        handoff::v1::DeleteSourceResponse* response) {
  const AdminCallScheduling::Scope scheduling = options_.call_scheduling.OtherCall();
  absl::StatusOr<Caller> caller = Admit(*context, Permission::kOperate, "DeleteSource");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ToGrpcStatus(manager_->DeleteSource(request->source_id()));
}

grpc::Status AdminService::GetSource(grpc::ServerContext* context,
                                     const handoff::v1::GetSourceRequest* request,
                                     Source* response) {
  const AdminCallScheduling::Scope scheduling = options_.call_scheduling.PointRead();
  absl::StatusOr<Caller> caller = Admit(*context, Permission::kRead, "GetSource");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  grpc::Status status = Reply(manager_->GetSource(request->source_id()), response);
  RedactForCaller(*caller, response->mutable_progress());
  return status;
}

grpc::Status AdminService::ListSources(grpc::ServerContext* context,
                                       const handoff::v1::ListSourcesRequest* request,
                                       handoff::v1::ListSourcesResponse* response) {
  const AdminCallScheduling::Scope scheduling = options_.call_scheduling.OtherCall();
  absl::StatusOr<Caller> caller = Admit(*context, Permission::kRead, "ListSources");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  grpc::Status status = Reply(manager_->ListSources(*request), response);
  for (Source& source : *response->mutable_sources()) {
    RedactForCaller(*caller, source.mutable_progress());
  }
  return status;
}

grpc::Status AdminService::GetProgress(grpc::ServerContext* context,
                                       const handoff::v1::GetProgressRequest* request,
                                       Progress* response) {
  const AdminCallScheduling::Scope scheduling = options_.call_scheduling.PointRead();
  absl::StatusOr<Caller> caller = Admit(*context, Permission::kRead, "GetProgress");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  grpc::Status status = Reply(manager_->GetProgress(request->source_id()), response);
  RedactForCaller(*caller, response);
  return status;
}

grpc::Status AdminService::WatchProgress(grpc::ServerContext* context,
                                         const handoff::v1::WatchProgressRequest* request,
                                         grpc::ServerWriter<Progress>* writer) {
  const AdminCallScheduling::Scope scheduling = options_.call_scheduling.OtherCall();
  absl::StatusOr<Caller> caller = Admit(*context, Permission::kRead, "WatchProgress");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  const WatcherSlot slot(&watchers_);
  if (slot.taken() > options_.max_watchers) {
    return ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat(
        "WatchProgress: ", options_.max_watchers, " streams already open (max_watchers)")));
  }
  const absl::Duration heartbeat = absl::Milliseconds(
      request->heartbeat_ms() == 0 ? kDefaultHeartbeatMs
                                   : std::max(request->heartbeat_ms(), kMinHeartbeatMs));

  uint64_t generation = 0;
  absl::Time last_sent = absl::InfinitePast();
  bool sent_any = false;
  while (!context->IsCancelled() && !shutting_down_.HasBeenNotified()) {
    // Wake for the next heartbeat, but at least every recheck interval so a gone
    // client or a stopping server is noticed. The first call returns at once.
    const absl::Time now = absl::Now();
    const absl::Time wake =
        sent_any ? std::min(last_sent + heartbeat, now + options_.watch_recheck) : now;
    const uint64_t seen = generation;
    absl::StatusOr<Progress> progress = manager_->WaitProgress(request->source_id(),
                                                               &generation, wake);
    if (!progress.ok()) {
      // CANCELLED: the manager is shutting down, and the stream ends with OK.
      if (progress.status().code() == absl::StatusCode::kCancelled) break;
      return ToGrpcStatus(progress.status());
    }
    const bool changed = !sent_any || generation != seen;
    if (!changed && absl::Now() < last_sent + heartbeat) continue;
    RedactForCaller(*caller, &*progress);
    if (!writer->Write(*progress)) break;  // the client went away
    last_sent = absl::Now();
    sent_any = true;
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::ListHolds(grpc::ServerContext* context,
                                     const handoff::v1::ListHoldsRequest* request,
                                     handoff::v1::ListHoldsResponse* response) {
  const AdminCallScheduling::Scope scheduling = options_.call_scheduling.OtherCall();
  absl::StatusOr<Caller> caller = Admit(*context, Permission::kRead, "ListHolds");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(manager_->ListHolds(*request), response);
}

grpc::Status AdminService::GetHold(grpc::ServerContext* context,
                                   const handoff::v1::GetHoldRequest* request,
                                   handoff::v1::Hold* response) {
  const AdminCallScheduling::Scope scheduling = options_.call_scheduling.PointRead();
  absl::StatusOr<Caller> caller = Admit(*context, Permission::kRead, "GetHold");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(manager_->GetHold(*request), response);
}

grpc::Status AdminService::ResolveHold(grpc::ServerContext* context,
                                       const handoff::v1::ResolveHoldRequest* request,
                                       handoff::v1::ResolveHoldResponse* response) {
  const AdminCallScheduling::Scope scheduling = options_.call_scheduling.OtherCall();
  absl::StatusOr<Caller> caller = Admit(*context, Permission::kOperate, "ResolveHold");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  // The audit actor is the token's name, never the token.
  return Reply(manager_->ResolveHold(*request, caller->name), response);
}

grpc::Status AdminService::ListQuarantine(grpc::ServerContext* context,
                                          const handoff::v1::ListQuarantineRequest* request,
                                          handoff::v1::ListQuarantineResponse* response) {
  const AdminCallScheduling::Scope scheduling = options_.call_scheduling.OtherCall();
  absl::StatusOr<Caller> caller = Admit(*context, Permission::kRead, "ListQuarantine");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(manager_->ListQuarantine(*request), response);
}

grpc::Status AdminService::RebuildSource(grpc::ServerContext* context,
                                         const handoff::v1::RebuildSourceRequest* request,
                                         Source* response) {
  const AdminCallScheduling::Scope scheduling = options_.call_scheduling.OtherCall();
  absl::StatusOr<Caller> caller = Admit(*context, Permission::kOperate, "RebuildSource");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(manager_->RebuildSource(*request), response);
}

grpc::Status AdminService::QueryEvents(grpc::ServerContext* context,
                                       const handoff::v1::QueryEventsRequest* request,
                                       handoff::v1::QueryEventsResponse* response) {
  const AdminCallScheduling::Scope scheduling = options_.call_scheduling.OtherCall();
  absl::StatusOr<Caller> caller = Admit(*context, Permission::kRead, "QueryEvents");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return Reply(manager_->QueryEvents(*request), response);
}

}  // namespace handoff::server
