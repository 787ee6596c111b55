// Prometheus metrics of handoffd, served on their own port (--metrics_listen).
//
// Two sources of figures:
//  * MetricsObserver counts what the engine reports as it happens (EngineObserver
//    hooks): pages committed, commit latency, provider refusals by code (a bounded set:
//    RefusalCodeLabel), retries, corrections and their depth. These are process-lifetime
//    counters per source: a deleted source's series leave every family
//    (OnSourceDeleted), so that /metrics stops exporting it and a source later created
//    under the same id counts from zero; a RebuildSource keeps them (the same source in
//    this process: a counter only grows while its source exists).
//  * ProgressCollector is read on every scrape from SourceManager::AllProgress(): the
//    durable per-source counters (events applied, replayed, ignored, quarantined,
//    delivered), open holds, the applied position, safe/finalized marks, tip, lag and the
//    worker state (one 0/1 series per state), plus the store's health and memory
//    (memtables, block cache: what store::StoreMemoryCeiling caps). A deleted source is
//    gone at the next scrape; a rebuilt one shows its reset checkpoint and counters.
// Every per-source series carries the label source="<id>". Nothing secret is exported.
//
// Thread-safe (prometheus-cpp metrics are; the collector only reads the core).
#ifndef HANDOFF_SERVER_METRICS_H_
#define HANDOFF_SERVER_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "consumer/observer.h"
#include "consumer/page_budget.h"
#include "consumer/source_manager.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "store/store.h"

namespace handoff::server {

// The `code` label of handoff_provider_refusals_total for a refusal's code: a code of the
// provider contract's refusal table (provider-contract.md, "Refusals") or one Handoff's
// provider adapter and worker assign themselves (network, timeout, ...) as it is, an
// empty code as it is, anything else "other". The code is whatever string the provider
// put in `error` (up to 64 KiB): a provider answering a new one each time would otherwise
// add a time series each time.
absl::string_view RefusalCodeLabel(absl::string_view code);

class MetricsObserver final : public consumer::EngineObserver {
 public:
  // Registers its families in `registry` (not owned, outlives this).
  explicit MetricsObserver(prometheus::Registry* registry);

  void OnCommit(absl::string_view source_id, int events, absl::Duration latency) override;
  void OnPageCommitted(absl::string_view source_id) override;
  void OnRefusal(absl::string_view source_id, absl::string_view code) override;
  void OnRetry(absl::string_view source_id) override;
  void OnCorrection(absl::string_view source_id, uint64_t depth) override;
  // Removes every series of the source from every family. REQUIRES (the manager
  // ensures it): no other callback for `source_id` runs meanwhile.
  void OnSourceDeleted(absl::string_view source_id) override;

 private:
  // Constant after construction (the families are owned by the registry).
  prometheus::Family<prometheus::Counter>& pages_committed_;
  prometheus::Family<prometheus::Counter>& events_committed_;
  prometheus::Family<prometheus::Histogram>& commit_latency_;
  prometheus::Family<prometheus::Counter>& refusals_;
  prometheus::Family<prometheus::Counter>& retries_;
  prometheus::Family<prometheus::Counter>& corrections_;
  prometheus::Family<prometheus::Histogram>& correction_depth_;
};

class ProgressCollector final : public prometheus::Collectable {
 public:
  // `manager` is not owned and outlives every Collect() call (the exposer is stopped
  // before the manager is destroyed). Without `store_memory` no memory gauges are served;
  // without `page_budget` no page-slot gauges.
  ProgressCollector(consumer::SourceManager* manager, std::function<absl::Status()> store_health,
                    std::function<store::Store::MemoryUsage()> store_memory = nullptr,
                    std::shared_ptr<const consumer::PageBudget> page_budget = nullptr);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  consumer::SourceManager* const manager_;
  const std::function<absl::Status()> store_health_;
  const std::function<store::Store::MemoryUsage()> store_memory_;
  const std::shared_ptr<const consumer::PageBudget> page_budget_;
};

// The HTTP endpoint (/metrics) serving `collectables`. `listen` is "host:port"; port 0
// picks a free port (see port()).
class MetricsEndpoint {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& listen, std::vector<std::shared_ptr<prometheus::Collectable>> collectables);
  ~MetricsEndpoint();  // stops serving; no Collect() runs after it returns

  int port() const { return port_; }

 private:
  MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer, int port)
      : exposer_(std::move(exposer)), port_(port) {}

  std::unique_ptr<prometheus::Exposer> exposer_;
  const int port_;
};

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_METRICS_H_
