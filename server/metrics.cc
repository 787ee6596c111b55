#include "server/metrics.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/client_metric.h"
#include "prometheus/labels.h"
#include "prometheus/metric_family.h"

namespace handoff::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

std::string Str(absl::string_view s) { return std::string(s.data(), s.size()); }

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
  return *buckets;
}

const prometheus::Histogram::BucketBoundaries& DepthBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  return *buckets;
}

MetricFamily NewFamily(const char* name, const char* help, MetricType type) {
  MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  return family;
}

void AddSample(MetricFamily* family, std::vector<ClientMetric::Label> labels, double value) {
  ClientMetric metric;
  metric.label = std::move(labels);
  if (family->type == MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family->metric.push_back(std::move(metric));
}

// The refusal codes RefusalCodeLabel keeps as they are.
constexpr absl::string_view kRefusalCodes[] = {
    // The provider contract's refusal table.
    "chain_unavailable", "rate_limited", "resync_required", "cursor_mismatch",
    "invalid_request", "unauthorized", "forbidden", "payment_required", "insufficient_credit",
    // Handoff's own (consumer/provider/http_provider.cc; the worker's "network" for a
    // refusal without a code). One missing here only counts as "other".
    "network", "timeout", "closed", "internal", "cancelled", "empty_cursor", "bad_url",
    "page_too_large", "malformed_page", "not_event_stream", "sse_silence", "stream_closed"};

// Removes the series of `family` with exactly `labels`, if there is one (`args`: what
// Family::Add passes to a new metric's constructor, unused when the series exists).
template <typename T, typename... Args>
void RemoveSeries(prometheus::Family<T>& family, const prometheus::Labels& labels,
                  const Args&... args) {
  if (family.Has(labels)) family.Remove(&family.Add(labels, args...));
}

}  // namespace

absl::string_view RefusalCodeLabel(absl::string_view code) {
  if (code.empty()) return code;
  for (absl::string_view label : kRefusalCodes) {
    if (code == label) return label;
  }
  return "other";
}

MetricsObserver::MetricsObserver(prometheus::Registry* registry)
    : pages_committed_(prometheus::BuildCounter()
                           .Name("handoff_pages_committed_total")
                           .Help("Page barriers committed (cursor promoted) since start")
                           .Register(*registry)),
      events_committed_(prometheus::BuildCounter()
                            .Name("handoff_step_events_total")
                            .Help("Events written by durable steps since start")
                            .Register(*registry)),
      commit_latency_(prometheus::BuildHistogram()
                          .Name("handoff_commit_latency_seconds")
                          .Help("Latency of one durable step (write + sync)")
                          .Register(*registry)),
      refusals_(prometheus::BuildCounter()
                    .Name("handoff_provider_refusals_total")
                    .Help("Fetches the provider refused, by code")
                    .Register(*registry)),
      retries_(prometheus::BuildCounter()
                   .Name("handoff_retries_total")
                   .Help("Retries scheduled (fetch or delivery)")
                   .Register(*registry)),
      corrections_(prometheus::BuildCounter()
                       .Name("handoff_corrections_total")
                       .Help("Correction (reorg) pages applied since start")
                       .Register(*registry)),
      correction_depth_(prometheus::BuildHistogram()
                            .Name("handoff_correction_depth_blocks")
                            .Help("How many blocks a correction page rewound")
                            .Register(*registry)) {}

void MetricsObserver::OnCommit(absl::string_view source_id, int events, absl::Duration latency) {
  commit_latency_.Add({{"source", Str(source_id)}}, LatencyBuckets())
      .Observe(absl::ToDoubleSeconds(latency));
  events_committed_.Add({{"source", Str(source_id)}}).Increment(events);
}

void MetricsObserver::OnPageCommitted(absl::string_view source_id) {
  pages_committed_.Add({{"source", Str(source_id)}}).Increment();
}

void MetricsObserver::OnRefusal(absl::string_view source_id, absl::string_view code) {
  refusals_.Add({{"source", Str(source_id)}, {"code", Str(RefusalCodeLabel(code))}}).Increment();
}

void MetricsObserver::OnRetry(absl::string_view source_id) {
  retries_.Add({{"source", Str(source_id)}}).Increment();
}

void MetricsObserver::OnCorrection(absl::string_view source_id, uint64_t depth) {
  corrections_.Add({{"source", Str(source_id)}}).Increment();
  correction_depth_.Add({{"source", Str(source_id)}}, DepthBuckets())
      .Observe(static_cast<double>(depth));
}

void MetricsObserver::OnSourceDeleted(absl::string_view source_id) {
  const std::string id = Str(source_id);
  const prometheus::Labels source = {{"source", id}};
  RemoveSeries(pages_committed_, source);
  RemoveSeries(events_committed_, source);
  RemoveSeries(commit_latency_, source, LatencyBuckets());
  RemoveSeries(retries_, source);
  RemoveSeries(corrections_, source);
  RemoveSeries(correction_depth_, source, DepthBuckets());
  // Every code RefusalCodeLabel may answer (a bounded set).
  RemoveSeries(refusals_, {{"source", id}, {"code", ""}});
  RemoveSeries(refusals_, {{"source", id}, {"code", "other"}});
  for (absl::string_view code : kRefusalCodes) {
    RemoveSeries(refusals_, {{"source", id}, {"code", Str(code)}});
  }
}

ProgressCollector::ProgressCollector(consumer::SourceManager* manager,
                                     std::function<absl::Status()> store_health,
                                     std::function<store::Store::MemoryUsage()> store_memory,
                                     std::shared_ptr<const consumer::PageBudget> page_budget)
    : manager_(manager),
      store_health_(std::move(store_health)),
      store_memory_(std::move(store_memory)),
      page_budget_(std::move(page_budget)) {}

std::vector<MetricFamily> ProgressCollector::Collect() const {
  const std::vector<handoff::v1::Progress> all = manager_->AllProgress();

  MetricFamily applied = NewFamily("handoff_events_applied_total",
                                   "Events applied (durable receipts)", MetricType::Counter);
  MetricFamily replayed = NewFamily("handoff_events_replayed_total",
                                    "Events seen again and skipped by their receipt",
                                    MetricType::Counter);
  MetricFamily ignored =
      NewFamily("handoff_events_ignored_total", "Events ignored (terminal)", MetricType::Counter);
  MetricFamily quarantined = NewFamily("handoff_events_quarantined_total",
                                       "Events quarantined (terminal)", MetricType::Counter);
  MetricFamily delivered = NewFamily("handoff_events_delivered_total",
                                     "Events delivered downstream", MetricType::Counter);
  MetricFamily holds = NewFamily("handoff_open_holds", "Open holds", MetricType::Gauge);
  MetricFamily applied_block = NewFamily(
      "handoff_applied_block", "Block of the applied position (ingest)", MetricType::Gauge);
  MetricFamily safe = NewFamily("handoff_safe_block", "Highest safe mark", MetricType::Gauge);
  MetricFamily finalized =
      NewFamily("handoff_finalized_block", "Highest finalized mark", MetricType::Gauge);
  MetricFamily tip = NewFamily("handoff_tip_block", "Provider tip", MetricType::Gauge);
  MetricFamily lag =
      NewFamily("handoff_lag_blocks", "Tip minus the applied block", MetricType::Gauge);
  MetricFamily state = NewFamily("handoff_source_state",
                                 "1 for the worker's current state, 0 for the others",
                                 MetricType::Gauge);

  const google::protobuf::EnumDescriptor* states = handoff::v1::SourceState_descriptor();
  for (const handoff::v1::Progress& p : all) {
    const std::string& id = p.source_id();
    AddSample(&applied, {{"source", id}}, p.counters().applied());
    AddSample(&replayed, {{"source", id}}, p.counters().replayed());
    AddSample(&ignored, {{"source", id}}, p.counters().ignored());
    AddSample(&quarantined, {{"source", id}}, p.counters().quarantined());
    AddSample(&delivered, {{"source", id}}, p.counters().delivered());
    AddSample(&holds, {{"source", id}}, p.counters().open_holds());
    AddSample(&applied_block, {{"source", id}}, p.checkpoint().applied_block());
    AddSample(&safe, {{"source", id}}, p.highest_safe().number());
    AddSample(&finalized, {{"source", id}}, p.highest_finalized().number());
    AddSample(&tip, {{"source", id}}, p.tip());
    AddSample(&lag, {{"source", id}}, p.lag_blocks());
    for (int i = 0; i < states->value_count(); ++i) {
      const google::protobuf::EnumValueDescriptor* value = states->value(i);
      if (value->number() == handoff::v1::SOURCE_STATE_UNSPECIFIED) continue;
      AddSample(&state, {{"source", id}, {"state", value->name()}},
                value->number() == p.state() ? 1 : 0);
    }
  }

  MetricFamily sources = NewFamily("handoff_sources", "Sources known", MetricType::Gauge);
  AddSample(&sources, {}, static_cast<double>(all.size()));
  MetricFamily store = NewFamily("handoff_store_healthy",
                                 "1 while the database accepts writes", MetricType::Gauge);
  AddSample(&store, {}, store_health_().ok() ? 1 : 0);

  std::vector<MetricFamily> out = {
      std::move(applied),       std::move(replayed), std::move(ignored),
      std::move(quarantined),   std::move(delivered), std::move(holds),
      std::move(applied_block), std::move(safe),     std::move(finalized),
      std::move(tip),           std::move(lag),      std::move(state),
      std::move(sources),       std::move(store)};
  if (store_memory_) {
    const store::Store::MemoryUsage memory = store_memory_();
    MetricFamily memtables = NewFamily("handoff_store_memtable_bytes",
                                       "Bytes in RocksDB memtables, mutable and immutable",
                                       MetricType::Gauge);
    AddSample(&memtables, {}, static_cast<double>(memory.memtable_bytes));
    MetricFamily cache = NewFamily("handoff_store_block_cache_bytes",
                                   "Bytes in the RocksDB block cache", MetricType::Gauge);
    AddSample(&cache, {}, static_cast<double>(memory.block_cache_bytes));
    out.push_back(std::move(memtables));
    out.push_back(std::move(cache));
  }
  if (page_budget_ != nullptr) {
    MetricFamily slots = NewFamily("handoff_page_slots",
                                   "Pages all sources may hold at once (--max_pages_in_flight)",
                                   MetricType::Gauge);
    AddSample(&slots, {}, static_cast<double>(page_budget_->slots()));
    MetricFamily held = NewFamily("handoff_page_slots_held",
                                  "Pages held now, from fetch to release", MetricType::Gauge);
    AddSample(&held, {}, static_cast<double>(page_budget_->held()));
    MetricFamily waiting = NewFamily("handoff_page_slot_waiters",
                                     "Sources waiting for a page slot", MetricType::Gauge);
    AddSample(&waiting, {}, static_cast<double>(page_budget_->waiting()));
    MetricFamily limit = NewFamily(
        "handoff_page_slots_limit",
        "Page slots that may be held now (below handoff_page_slots when they adapt)",
        MetricType::Gauge);
    AddSample(&limit, {}, static_cast<double>(page_budget_->limit()));
    out.push_back(std::move(slots));
    out.push_back(std::move(limit));
    out.push_back(std::move(held));
    out.push_back(std::move(waiting));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen, std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  std::unique_ptr<prometheus::Exposer> exposer;
  // prometheus-cpp (CivetWeb) reports a failed bind by throwing; this is the one place
  // Handoff meets an exception, and it becomes a status here.
  try {
    exposer = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics_listen: cannot listen on ", listen, ": ", e.what()));
  }
  for (const auto& collectable : collectables) exposer->RegisterCollectable(collectable);
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("metrics_listen: no port bound for ", listen));
  }
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(exposer), ports[0]));
}

MetricsEndpoint::~MetricsEndpoint() = default;

}  // namespace handoff::server
