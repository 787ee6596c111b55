#include "base/heap_retention.h"

#include <malloc.h>

#include <algorithm>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"

namespace handoff {

absl::Status RetainFreedHeapMemory() {
#ifdef __GLIBC__
  const int arenas = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  struct Setting {
    int param;
    int value;
    const char* name;
  };
  const Setting settings[] = {
      // Fixed (not adjusted by glibc as blocks are freed): below it every block comes
      // from a heap.
      {M_MMAP_THRESHOLD, static_cast<int>(kLargestHeapBlockBytes), "M_MMAP_THRESHOLD"},
      // Never give a heap's free top back to the kernel.
      {M_TRIM_THRESHOLD, std::numeric_limits<int>::max(), "M_TRIM_THRESHOLD"},
      {M_ARENA_MAX, arenas, "M_ARENA_MAX"},
  };
  for (const Setting& s : settings) {
    if (mallopt(s.param, s.value) != 1) {
      return absl::InternalError(absl::StrCat("heap: mallopt(", s.name, ", ", s.value,
                                              ") refused"));
    }
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(
      "heap: not glibc's allocator; freed memory is handled by its defaults");
#endif
}

}  // namespace handoff
