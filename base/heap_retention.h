// Heap retention: freed memory stays in the process for the next allocation of its size.
//
// Ingest allocates and frees the same large blocks over and over. Each memtable's arena
// (RocksDB allocates it in blocks of an eighth of the write buffer: 8 MiB by default) is
// freed when the memtable has been flushed, and the next memtable allocates as much
// again; write batches, page bodies and parser buffers do the same for every page.
// glibc's defaults give such memory back to the kernel: a block above the mmap threshold
// (128 KiB at start, then the largest block freed so far) is unmapped when freed, and a
// heap's free top is trimmed once it passes the trim threshold. With many threads the
// blocks are also spread over up to eight arenas per core, and a block freed into one
// arena is reused only by the threads allocating from that arena. Memory handed back
// returns as fresh pages: a page fault and a page of zeroing for every 4 KiB, each a trap
// to the hypervisor on the benchmark machine. There, a million events from 64 sources
// took 64-67 thousand page faults with glibc's defaults and 46-49 thousand with these
// settings, and ingest took 3-6 % less CPU (bench/HISTORY.md item 78).
//
// RetainFreedHeapMemory keeps blocks up to kLargestHeapBlockBytes in the heap (no mmap,
// no trim) and allocates from one arena per core. What it costs: the resident set does
// not shrink after a peak. The peak is what the memory bound already covers
// (consumer/memory_bound.h counts every buffer and memtable at its largest), and the
// memory is reused by the next memtable or page rather than lost; blocks larger than
// kLargestHeapBlockBytes are still mapped and unmapped on their own.
//
// Call it first thing in main, before any thread starts: threads take their arena on
// their first allocation, and the settings apply to blocks allocated afterwards.
#ifndef HANDOFF_BASE_HEAP_RETENTION_H_
#define HANDOFF_BASE_HEAP_RETENTION_H_

#include <cstddef>

#include "absl/status/status.h"

namespace handoff {

// The largest block the heap keeps after it is freed (glibc's upper limit for the mmap
// threshold on 64-bit systems).
inline constexpr size_t kLargestHeapBlockBytes = size_t{32} << 20;

// Applies the settings above to the process's allocator. FAILED_PRECONDITION where the
// allocator is not glibc's (nothing to tune; the process runs with its defaults),
// INTERNAL if glibc refuses a setting.
absl::Status RetainFreedHeapMemory();

}  // namespace handoff

#endif  // HANDOFF_BASE_HEAP_RETENTION_H_
