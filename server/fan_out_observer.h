// FanOutObserver: forwards every EngineObserver callback to several observers (metrics
// and logs), since the core accepts one. Thread-safe if its observers are; the list is
// fixed at construction and the observers (not owned) outlive it.
#ifndef HANDOFF_SERVER_FAN_OUT_OBSERVER_H_
#define HANDOFF_SERVER_FAN_OUT_OBSERVER_H_

#include <utility>
#include <vector>

#include "consumer/observer.h"

namespace handoff::server {

class FanOutObserver final : public consumer::EngineObserver {
 public:
  explicit FanOutObserver(std::vector<consumer::EngineObserver*> observers)
      : observers_(std::move(observers)) {}

  void OnCommit(absl::string_view source_id, int events, absl::Duration latency) override {
    for (auto* o : observers_) o->OnCommit(source_id, events, latency);
  }
  void OnPageCommitted(absl::string_view source_id) override {
    for (auto* o : observers_) o->OnPageCommitted(source_id);
  }
  void OnRefusal(absl::string_view source_id, absl::string_view code) override {
    for (auto* o : observers_) o->OnRefusal(source_id, code);
  }
  void OnRetry(absl::string_view source_id) override {
    for (auto* o : observers_) o->OnRetry(source_id);
  }
  void OnCorrection(absl::string_view source_id, uint64_t depth) override {
    for (auto* o : observers_) o->OnCorrection(source_id, depth);
  }
  void OnStateChange(absl::string_view source_id, handoff::v1::SourceState state,
                     absl::string_view reason) override {
    for (auto* o : observers_) o->OnStateChange(source_id, state, reason);
  }
  void OnError(absl::string_view source_id, const absl::Status& status) override {
    for (auto* o : observers_) o->OnError(source_id, status);
  }
  void OnSourceDeleted(absl::string_view source_id) override {
    for (auto* o : observers_) o->OnSourceDeleted(source_id);
  }

 private:
  const std::vector<consumer::EngineObserver*> observers_;
};

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_FAN_OUT_OBSERVER_H_
