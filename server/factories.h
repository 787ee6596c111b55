// The production wiring point of the core: which SourceManager handoffd runs and how it
// builds a source's provider (consumer/provider/: the libcurl polling and SSE adapters)
// and external sink (consumer/sinks/: the gRPC EventSink client).
//
// The provider API key is read here, from the environment variable or file the spec
// names; errors say where it was looked for, never what it is. Local-rows sources need
// no external sink (nullptr).
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

namespace handoff::server {

// Pages all sources together hold at once, by default (--max_pages_in_flight;
// consumer/page_budget.h): 4 per core, at least 8. Measured on two vCPUs (bench/
// HISTORY.md 75, 64 sources catching up): 8 was the fastest of 4, 6, 8, 12, 16 and no
// cap, and one source, which holds at most ~6 (the page being committed, the prefetched
// one, the deleter's queue), kept its speed. The scaling with cores is an assumption,
// not measured here.
// With --adaptive_page_slots (the default) it is the most the sources may hold: how
// many they do adapts below it (consumer/slot_limit.h).
size_t DefaultMaxPagesInFlight();

// The fewest page slots an adaptive budget lets sources hold: the page a source commits
// and the two it prefetches. (Pages waiting in the deleter's queue keep their slots, so
// a lone source at the minimum may prefetch less for a moment; its flat latency grows the
// limit by one every window of four fetches.)
inline constexpr size_t kMinAdaptivePageSlots = 3;

// The providers share one PageBudget of `max_pages_in_flight` slots (at least 1) and
// one pool of warm connections. With `adaptive_page_slots` (--adaptive_page_slots), the
// slots in use adapt between kMinAdaptivePageSlots and `max_pages_in_flight` to the
// latency of the fetches (consumer/slot_limit.h).
consumer::Factories ProductionFactories(size_t max_pages_in_flight,
                                        bool adaptive_page_slots = true);

// consumer::SourceManager::Create.
absl::StatusOr<std::unique_ptr<consumer::SourceManager>> CreateProductionSourceManager(
    consumer::SourceManagerOptions options);

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_FACTORIES_H_
