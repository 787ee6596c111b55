// The production wiring point of the core: which SourceManager handoffd runs and how it
// builds a source's provider (consumer/provider/: the libcurl polling and SSE adapters)
// and external sink (consumer/sinks/: the gRPC EventSink client).
//
// The provider API key is read here (server/api_keys.h), from the environment variable or
// file the spec names, under the process's ApiKeyPolicy; errors say where it was looked
// for, never what it is. So is a downstream sink's bearer token (sink.downstream.token),
// under the same policy; its TLS files are read by consumer::MakeExternalSink. Local-rows
// sources need no external sink (nullptr).
//
// Only handoffd's composition root (flags.cc) depends on this target, so the server
// library and its tests link no engine.
//
// Thread-safe (stateless).
#ifndef HANDOFF_SERVER_FACTORIES_H_
#define HANDOFF_SERVER_FACTORIES_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "consumer/source_manager.h"
#include "server/api_keys.h"
#include "server/options.h"

namespace handoff::server {

// Pages all sources together hold at once, by default (--max_pages_in_flight;
// consumer/page_budget.h): 8 per core, at least 16. With --adaptive_page_slots (the
// default) it is the most the sources may hold: how many they do adapts below it
// (consumer/slot_limit.h), so the cap matters where fetches wait on the network. Measured
// on two vCPUs (bench/HISTORY.md 119): 64 sources catching up from a provider 30 ms away
// reached 267-276k events/s with 16 against 196-197k with 8 (32: 259-283k); on the same
// machine as the provider the limit stays at 3-6 either way. (With fixed slots, before
// the limit adapted, 8 was the fastest of 4 to 16 there: 75.) The scaling with cores is
// an assumption, not measured here.
size_t DefaultMaxPagesInFlight();

// The fewest page slots an adaptive budget lets sources hold: the page a source commits
// and the two it prefetches. (Pages waiting in the deleter's queue keep their slots, so
// a lone source at the minimum may prefetch less for a moment; its flat latency grows the
// limit by one every window of six fetches.)
inline constexpr size_t kMinAdaptivePageSlots = 3;

// The providers share one PageBudget of `max_pages_in_flight` slots (at least 1) and
// one pool of warm connections. With `adaptive_page_slots` (--adaptive_page_slots), the
// slots in use adapt between kMinAdaptivePageSlots and `max_pages_in_flight` to the
// latency of the fetches (consumer/slot_limit.h). Provider keys are read under `api_keys`.
// Every source's provider refuses a page above `max_page_bytes` (--max_page_bytes;
// HttpProviderOptions::max_page_bytes, at least 1024) as page_too_large.
consumer::Factories ProductionFactories(size_t max_pages_in_flight,
                                        bool adaptive_page_slots = true,
                                        ApiKeyPolicy api_keys = {},
                                        size_t max_page_bytes = kDefaultMaxPageBytes);

// consumer::SourceManager::Create.
absl::StatusOr<std::unique_ptr<consumer::SourceManager>> CreateProductionSourceManager(
    consumer::SourceManagerOptions options);

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_FACTORIES_H_
