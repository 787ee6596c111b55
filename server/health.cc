#include "server/health.h"

#include <grpcpp/health_check_service_interface.h>

#include <utility>

namespace handoff::server {

bool SourceServing(handoff::v1::SourceState state) {
  switch (state) {
    case handoff::v1::SOURCE_STATE_STARTING:
    case handoff::v1::SOURCE_STATE_RUNNING:
    case handoff::v1::SOURCE_STATE_BACKING_OFF:
      return true;
    default:
      return false;
  }
}

HealthReporter::HealthReporter(std::vector<grpc::HealthCheckServiceInterface*> health,
                               consumer::SourceManager* manager,
                               std::function<absl::Status()> store_health, Logger* logger,
                               absl::Duration interval)
    : health_(std::move(health)),
      manager_(manager),
      store_health_(std::move(store_health)),
      logger_(logger),
      interval_(interval) {}

HealthReporter::~HealthReporter() { Stop(); }

void HealthReporter::Start() {
  Refresh();
  ticker_ = std::thread([this] { Run(); });
}

void HealthReporter::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (ticker_.joinable()) ticker_.join();
  for (auto* health : health_) health->Shutdown();
}

void HealthReporter::Run() {
  while (!stop_.WaitForNotificationWithTimeout(interval_)) Refresh();
}

void HealthReporter::Refresh() {
  const absl::Status store = store_health_();
  // Sources that write nothing (caught up) would otherwise poll on over a failed store.
  if (!store.ok()) manager_->HaltOnStoreFailure(store);
  const std::vector<handoff::v1::Progress> all = manager_->AllProgress();

  absl::MutexLock lock(&mu_);
  if (store.ok() != store_ok_) {
    if (store.ok()) {
      logger_->Info("store healthy again: serving");
    } else {
      logger_->Error("store unusable: health NOT_SERVING",
                     {{"code", absl::StatusCodeToString(store.code())},
                      {"error", store.message()}});
    }
    store_ok_ = store.ok();
  }
  auto set = [this](const std::string& name, bool serving) {
    for (auto* health : health_) health->SetServingStatus(name, serving);
  };
  set("", store.ok());
  set(kAdminServiceName, store.ok());

  absl::flat_hash_set<std::string> seen;
  for (const handoff::v1::Progress& progress : all) {
    set(progress.source_id(), store.ok() && SourceServing(progress.state()));
    seen.insert(progress.source_id());
  }
  // A source reported before and gone now was deleted: NOT_SERVING, once (gRPC keeps
  // the status), then forgotten, so that passes do not grow with every id ever deleted.
  for (const std::string& id : reported_) {
    if (!seen.contains(id)) set(id, false);
  }
  reported_ = std::move(seen);
}

}  // namespace handoff::server
