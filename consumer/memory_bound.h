// PageMemoryBound: the most memory the ingest path holds for pages, as a formula.
//
// Every buffer that grows with a page is listed here with its cap, in bytes per byte of
// the largest page body a source receives (`b`, at most the provider's max_page_bytes,
// 64 MiB by default; about 0.7 KB per event for the simulator's logs).
//
// With a PageBudget of P slots shared by every source (handoffd: --max_pages_in_flight),
// a page exists only under a slot, so pages are a per-process term:
//
//   per slot (P)                     5.25 b   a receive buffer (string growth) 2 b,
//                                             lent while fetching, and the page:
//                                             rows 2 b + encoded rows 1.25 b
//   per polling source               1.5 b    the step's WriteBatch
//   per SSE source                   4.5 b    stream buffers (line, data, frame) 3 b,
//                                             where a frame waits for room or a slot
//                                             (it is parsed only under one), the
//                                             step's WriteBatch 1.5 b
//   per source waiting with a page  3.25 b   an attempt blocked on a hold or waiting
//     (W)                                     for a retry gives its slot back (it may
//                                             wait for hours) and keeps its page
//   per process: the simdjson DOMs of the shared parsers, 13.7 b each (tape 8, strings
//   5/3, index 4), min(sources, DomParsers()) of them (one per core, 2-8); the
//   RowPool's pages of recycled rows (2 b each). The deleter's queued pages hold slots:
//   counted in P.
//
// A provider built without the shared budget (tests) is not bounded by this formula:
// handoffd always has one (--max_pages_in_flight).
//
// The rows and encoded-rows factors are asserted by page_parser_test
// (PageMemoryIsBoundedByItsWireBytes) over the smallest legal item, four topics and long
// data; the DOM's is simdjson's allocation for a document of b bytes (what it touches is
// less); string growth at most doubles a buffer. What does not grow with pages (threads,
// libcurl handles, the process itself) and the storage (store::StoreMemoryCeiling) are
// separate terms of the process bound, stated in bench/REPORT.md (scenario 5).
// Not a page term: a gated source's delivery stage holds at most two runs of decoded
// outbox rows (SourceWorker's current run and the one read ahead) and the request of its
// one sink call in flight (the lookahead's, or the run's own: never both), each row at
// most kRowBytesPerWireByte times its wire size (README.md, "Memory"); nor the ApplyBatch
// calls GrpcEventSink keeps for reuse (per process, BatchCallPool::kPooledBatchCalls sink
// batches).
#ifndef HANDOFF_CONSUMER_MEMORY_BOUND_H_
#define HANDOFF_CONSUMER_MEMORY_BOUND_H_

#include <cstddef>

namespace handoff::consumer {

// Bytes of memory per byte of page body, by holder (see the table above).
inline constexpr double kRowBytesPerWireByte = 2.0;
inline constexpr double kEncodedBytesPerWireByte = 1.25;
inline constexpr double kParsedPageBytesPerWireByte =
    kRowBytesPerWireByte + kEncodedBytesPerWireByte;
inline constexpr double kDomBytesPerWireByte = 8.0 + 5.0 / 3.0 + 4.0;
inline constexpr double kStepBatchBytesPerWireByte = 1.5;
inline constexpr double kPollBodyBytesPerWireByte = 2.0;
inline constexpr double kSseStreamBytesPerWireByte = 3.0;

// Pages the process-wide holders keep: RowPool::Default()'s recycled rows, and
// SourceManager's deleter's queue (its pages hold slots: no term of their own).
inline constexpr size_t kPooledRowPages = 32;
inline constexpr size_t kDeleterPages = 4;
// The most simdjson parsers the process shares (PageParser's pool).
inline constexpr size_t kMaxDomParsers = 8;

// How many simdjson parsers the process shares: one per core (at least 2, at most
// kMaxDomParsers); the DOMs of at most this many pages, or of one per source when fewer
// sources run. A parse is CPU work only, so more parsers than cores cannot parse more
// pages at once; each one keeps the DOM of the largest page it parsed, and rotating
// through more of them only makes the pages' working set larger and colder. On 2 vCPUs,
// 2 parsers against 8 gave 64 sources 4% less CPU per event, 6% fewer page faults and
// 9 MB less peak RSS, one source the same (bench/HISTORY.md 124). At least 2: a parser's
// holder that the scheduler preempts does not stop every other parse.
size_t DomParsers();

struct PageMemoryInputs {
  size_t poll_sources = 0;
  size_t sse_sources = 0;
  // The largest page body (or SSE frame data) any source receives, in bytes.
  size_t largest_page_bytes = 0;
  // Slots of the PageBudget every source shares (--max_pages_in_flight).
  size_t page_slots = 0;
  // Sources waiting with a page (blocked on a hold, or waiting to retry).
  size_t waiting_sources = 0;
};

// Bytes held per byte of the largest page: by one slot, one polling source, one SSE
// source, one source waiting with a page, and the process-wide holders but the parsers
// and slots.
double SlotPageFactor();
double PollSourcePageFactor();
double SseSourcePageFactor();
double WaitingSourcePageFactor();
double ProcessPageFactor();
// Bytes held by the shared parsers' DOMs per byte of the largest page, with `sources`
// sources running.
double DomPageFactor(size_t sources);

// The most bytes the ingest path holds for pages with `inputs`.
double PageMemoryBound(const PageMemoryInputs& inputs);

}  // namespace handoff::consumer

#endif  // HANDOFF_CONSUMER_MEMORY_BOUND_H_
