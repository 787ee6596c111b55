#include "consumer/fault_points.h"

#include <memory>

namespace handoff::consumer {
namespace {

struct Registry {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, std::function<bool()>> points ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, int> hits ABSL_GUARDED_BY(mu);
  bool counting ABSL_GUARDED_BY(mu) = false;
};

Registry& GetRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

}  // namespace

std::atomic<bool> FaultPoints::armed_{false};

bool FaultPoints::HitSlow(absl::string_view name) {
  Registry& r = GetRegistry();
  std::function<bool()> fire;
  {
    absl::MutexLock lock(&r.mu);
    if (r.counting) ++r.hits[name];
    auto it = r.points.find(name);
    if (it == r.points.end()) return false;
    fire = it->second;
  }
  return fire();
}

void FaultPoints::Arm(absl::string_view name, std::function<bool()> fire) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  r.points[name] = std::move(fire);
  armed_.store(true);
}

void FaultPoints::ArmNth(absl::string_view name, int n) {
  auto count = std::make_shared<std::atomic<int>>(0);
  Arm(name, [count, n] { return count->fetch_add(1) + 1 == n; });
}

void FaultPoints::CountHits(bool on) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  r.counting = on;
  if (on) armed_.store(true);
}

int FaultPoints::Hits(absl::string_view name) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  auto it = r.hits.find(name);
  return it == r.hits.end() ? 0 : it->second;
}

void FaultPoints::DisarmAll() {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  r.points.clear();
  r.hits.clear();
  r.counting = false;
  armed_.store(false);
}

}  // namespace handoff::consumer
