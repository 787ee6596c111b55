#include "server/factories.h"

#include <algorithm>
#include <memory>
#include <thread>

#include "consumer/page_budget.h"
#include "consumer/provider/curl_session.h"
#include "consumer/provider/http_provider.h"
#include "consumer/sinks/grpc_event_sink.h"

namespace handoff::server {
namespace {

// Idle sessions (warm connections) kept for polled requests. A caught-up source polls
// every 15-30 s and a poll takes about a millisecond, so even thousands of idle sources
// keep only a few busy at once; busy sources lease more while they fetch.
constexpr size_t kIdlePollSessions = 16;

}  // namespace

size_t DefaultMaxPagesInFlight() {
  return std::max<size_t>(16, 8 * static_cast<size_t>(std::thread::hardware_concurrency()));
}

consumer::Factories ProductionFactories(size_t max_pages_in_flight, bool adaptive_page_slots,
                                        ApiKeyPolicy api_keys, size_t max_page_bytes) {
  consumer::Factories factories;
  // One pool for every source's polled requests: caught-up sources share a few warm
  // connections instead of reconnecting at each poll (consumer/provider/curl_session.h).
  auto pool = std::make_shared<consumer::CurlSessionPool>(kIdlePollSessions);
  // One cap on the pages every source holds: page memory does not grow with sources.
  consumer::PageBudget::Options budget_options;
  budget_options.slots = std::max<size_t>(1, max_pages_in_flight);
  if (adaptive_page_slots) budget_options.adaptive_min = kMinAdaptivePageSlots;
  auto budget = consumer::PageBudget::Create(std::move(budget_options));
  factories.provider = [pool, budget, api_keys,
                        max_page_bytes](const handoff::v1::SourceSpec& spec)
      -> absl::StatusOr<std::unique_ptr<consumer::Provider>> {
    absl::StatusOr<std::string> key = ResolveApiKey(spec, api_keys);
    if (!key.ok()) return key.status();
    consumer::HttpProviderOptions options = consumer::OptionsForSpec(spec);
    options.api_key = *std::move(key);
    options.session_pool = pool;
    options.page_budget = budget;
    options.max_page_bytes = max_page_bytes;
    return consumer::MakeHttpProvider(std::move(options));
  };
  factories.page_budget = budget;
  // The sink's TLS files and bearer token are read at each start of the source: an
  // unreadable one halts it as CONFIG_INVALID, the reason naming where, never what.
  factories.external_sink = [api_keys](const handoff::v1::SourceSpec& spec)
      -> absl::StatusOr<std::unique_ptr<consumer::ExternalSink>> {
    absl::StatusOr<std::string> token = ResolveSinkToken(spec, api_keys);
    if (!token.ok()) return token.status();
    return consumer::MakeExternalSink(spec, *token);
  };
  return factories;
}

absl::StatusOr<std::unique_ptr<consumer::SourceManager>> CreateProductionSourceManager(
    consumer::SourceManagerOptions options) {
  return consumer::SourceManager::Create(std::move(options));
}

}  // namespace handoff::server
