#include "base/heap_retention.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "absl/base/config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace handoff {
namespace {

constexpr char kTunablesVariable[] = "GLIBC_TUNABLES";
constexpr char kHugePageTunable[] = "glibc.malloc.hugetlb";

// Whether the kernel maps transparent huge pages where a process asks for them
// (`always` or `madvise` selected; `never`, or no such file, means it does not).
bool KernelOffersTransparentHugePages() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::stringstream text;
  text << in.rdbuf();
  return in.good() && !absl::StrContains(text.str(), "[never]");
}

}  // namespace

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
      {M_TOP_PAD, static_cast<int>(kHeapGrowthBytes), "M_TOP_PAD"},
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

std::optional<std::string> TunablesWithHugePageHeap(const char* current) {
  const std::string setting = absl::StrCat(kHugePageTunable, "=1");
  if (current == nullptr || *current == '\0') return setting;
  // Tunables are `name=value` pairs separated by colons.
  for (absl::string_view pair : absl::StrSplit(current, ':')) {
    if (absl::StartsWith(pair, absl::StrCat(kHugePageTunable, "="))) return std::nullopt;
  }
  return absl::StrCat(current, ":", setting);
}

absl::Status RestartWithHugePageHeap(char** argv) {
#if !defined(__GLIBC__) || defined(ABSL_HAVE_ADDRESS_SANITIZER) || \
    defined(ABSL_HAVE_THREAD_SANITIZER) || defined(ABSL_HAVE_MEMORY_SANITIZER)
  (void)argv;
  return absl::FailedPreconditionError(
      "heap: not glibc's allocator; no huge pages asked for");
#else
  const char* current = std::getenv(kTunablesVariable);
  const std::optional<std::string> original =
      current != nullptr ? std::optional<std::string>(current) : std::nullopt;
  const std::optional<std::string> tunables = TunablesWithHugePageHeap(current);
  if (!tunables.has_value()) return absl::OkStatus();
  if (!KernelOffersTransparentHugePages()) {
    return absl::FailedPreconditionError(
        "heap: the kernel offers no transparent huge pages; 4 KiB pages kept");
  }
  if (setenv(kTunablesVariable, tunables->c_str(), /*overwrite=*/1) != 0) {
    return absl::InternalError(absl::StrCat("heap: setenv: ", std::strerror(errno)));
  }
  // The binary's own path, so that the process keeps its name (the kernel names it after
  // the file executed: /proc/self/exe would make it "exe"); /proc/self/exe itself if
  // the file was replaced or removed since the start.
  char path[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  std::string binary = "/proc/self/exe";
  if (length > 0) {
    binary.assign(path, static_cast<size_t>(length));
    if (absl::EndsWith(binary, " (deleted)") || access(binary.c_str(), X_OK) != 0) {
      binary = "/proc/self/exe";
    }
  }
  execv(binary.c_str(), argv);
  const int error = errno;
  // Not restarted: the process goes on as it started, and says so.
  if (original.has_value()) {
    setenv(kTunablesVariable, original->c_str(), /*overwrite=*/1);
  } else {
    unsetenv(kTunablesVariable);
  }
  return absl::InternalError(
      absl::StrCat("heap: re-executing with huge pages failed: ", std::strerror(error)));
#endif
}

}  // namespace handoff
