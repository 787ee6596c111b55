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
// no trim), allocates from one arena per core, and grows a heap kHeapGrowthBytes at a
// time. What it costs: the resident set does not shrink after a peak. The peak is what
// the memory bound already covers (consumer/memory_bound.h counts every buffer and
// memtable at its largest), and the memory is reused by the next memtable or page rather
// than lost; a block larger than kLargestHeapBlockBytes that the heap's free top cannot
// hold is still mapped and unmapped on its own. A heap's growth is address space: its
// pages become resident as they are first written, as before.
//
// Retention alone leaves the first pass: every page of the heap's peak is still faulted
// in once, 4 KiB at a time, and with many sources that pass is most of a short run (64
// sources took 40 thousand faults for a million events, one source 20 thousand, ~10 us
// each on the benchmark VM; the first 100 thousand events of 64 sources cost twice the
// CPU of one source's). RestartWithHugePageHeap asks glibc to back the heap with
// transparent huge pages (the tunable glibc.malloc.hugetlb=1: it marks the memory it
// takes from the kernel MADV_HUGEPAGE), so that a fault brings in 2 MiB; growing the heap
// by kHeapGrowthBytes at a time gives the kernel whole aligned 2 MiB ranges to map that
// way. Measured: faults per million events 38-40 thousand -> 0.8-1.1 thousand (64
// sources) and 19-20 thousand -> 0.1 thousand (one source), 15-25 % less CPU per event
// (bench/HISTORY.md item 115). glibc reads its tunables only when a process starts, so
// the process executes itself again, once, with the setting added to GLIBC_TUNABLES.
// The operator keeps the last word: a GLIBC_TUNABLES that already names
// glibc.malloc.hugetlb is left as it is (glibc.malloc.hugetlb=0 keeps 4 KiB pages), and
// where the kernel offers no transparent huge pages (`never` in
// /sys/kernel/mm/transparent_hugepage/enabled) nothing is restarted.
//
// Call both first thing in main, before any thread starts (RestartWithHugePageHeap
// first): threads take their arena on their first allocation, and the settings apply to
// blocks allocated afterwards.
#ifndef HANDOFF_BASE_HEAP_RETENTION_H_
#define HANDOFF_BASE_HEAP_RETENTION_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace handoff {

// The largest block the heap keeps after it is freed (glibc's upper limit for the mmap
// threshold on 64-bit systems).
inline constexpr size_t kLargestHeapBlockBytes = size_t{32} << 20;

// How far a heap grows at once when it must (glibc's M_TOP_PAD): a multiple of 2 MiB
// huge pages, and of a memtable's 8 MiB arena block.
inline constexpr size_t kHeapGrowthBytes = size_t{64} << 20;

// Applies the settings above to the process's allocator. FAILED_PRECONDITION where the
// allocator is not glibc's (nothing to tune; the process runs with its defaults),
// INTERNAL if glibc refuses a setting.
absl::Status RetainFreedHeapMemory();

// Executes `argv` again (the running binary, /proc/self/exe) with glibc.malloc.hugetlb=1
// added to GLIBC_TUNABLES, unless that is not needed: the setting is in place or the
// operator's GLIBC_TUNABLES names glibc.malloc.hugetlb (OK), the kernel offers no
// transparent huge pages, or the allocator is not glibc's (FAILED_PRECONDITION, the
// reason). It returns only then, or when the exec failed (INTERNAL, errno's text: the
// process goes on with 4 KiB pages). The process id, arguments and the rest of the
// environment stay as they were.
absl::Status RestartWithHugePageHeap(char** argv);

// GLIBC_TUNABLES with glibc.malloc.hugetlb=1 added to `current` (nullptr: unset), or
// nullopt when `current` already names glibc.malloc.hugetlb.
std::optional<std::string> TunablesWithHugePageHeap(const char* current);

}  // namespace handoff

#endif  // HANDOFF_BASE_HEAP_RETENTION_H_
