#include "base/heap_retention.h"

#include <malloc.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace handoff {
namespace {

// A block the size of a memtable's arena block (write buffer / 8 at 64 MiB).
constexpr size_t kBlockBytes = size_t{8} << 20;

char* TouchedBlock(size_t bytes) {
  char* block = static_cast<char*>(std::malloc(bytes));
  std::memset(block, 1, bytes);
  return block;
}

// With glibc's defaults the first 8 MiB block is mapped on its own (above the initial
// 128 KiB mmap threshold) and unmapped when freed: the assertions below fail without
// RetainFreedHeapMemory.
TEST(HeapRetentionTest, FreedLargeBlocksStayInTheHeapForReuse) {
  ASSERT_TRUE(RetainFreedHeapMemory().ok());

  const struct mallinfo2 before = mallinfo2();
  char* block = TouchedBlock(kBlockBytes);
  const struct mallinfo2 allocated = mallinfo2();
  EXPECT_EQ(allocated.hblkhd, before.hblkhd) << "the block was mapped on its own";
  EXPECT_GE(allocated.uordblks, before.uordblks + kBlockBytes);

  std::free(block);
  const struct mallinfo2 freed = mallinfo2();
  // Still part of the heap, as free space the next block of that size takes.
  EXPECT_GE(freed.arena, allocated.arena) << "the heap was trimmed";
  EXPECT_GE(freed.fordblks, kBlockBytes);

  char* again = TouchedBlock(kBlockBytes);
  const struct mallinfo2 reused = mallinfo2();
  EXPECT_EQ(reused.arena, freed.arena) << "the heap grew instead of reusing the block";
  std::free(again);
}

TEST(HeapRetentionTest, BlocksAboveTheLimitAreStillMappedOnTheirOwn) {
  ASSERT_TRUE(RetainFreedHeapMemory().ok());
  const struct mallinfo2 before = mallinfo2();
  // Larger than the heap's free top can hold, too (a heap grows kHeapGrowthBytes at a
  // time, so a block above the limit but within the free top is carved from it).
  char* block = TouchedBlock(kHeapGrowthBytes + kLargestHeapBlockBytes);
  EXPECT_GT(mallinfo2().hblkhd, before.hblkhd);
  std::free(block);
  EXPECT_EQ(mallinfo2().hblkhd, before.hblkhd);
}

TEST(HeapRetentionTest, TunablesGainTheHugePageSettingUnlessTheyNameIt) {
  EXPECT_EQ(TunablesWithHugePageHeap(nullptr), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(TunablesWithHugePageHeap(""), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(TunablesWithHugePageHeap("glibc.malloc.arena_max=2"),
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
  // The operator's own choice, either way, is kept.
  EXPECT_EQ(TunablesWithHugePageHeap("glibc.malloc.hugetlb=0"), std::nullopt);
  EXPECT_EQ(TunablesWithHugePageHeap("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2"),
            std::nullopt);
  // A longer name that merely starts the same is another tunable.
  EXPECT_EQ(TunablesWithHugePageHeap("glibc.malloc.hugetlbx=0"),
            "glibc.malloc.hugetlbx=0:glibc.malloc.hugetlb=1");
}

std::string ReadFile(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The kernel's count of huge page faults that fell back to 4 KiB pages (no free huge
// page at hand), so that the test below can tell a busy machine from a missing setting.
int64_t HugePageFallbacks() {
  std::istringstream vmstat(ReadFile("/proc/vmstat"));
  std::string name;
  int64_t value = 0;
  while (vmstat >> name >> value) {
    if (name == "thp_fault_fallback") return value;
  }
  return 0;
}

int64_t MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// main() below restarted this test binary as handoffd restarts itself:
// 16 MiB written into fresh heap memory must come in as huge pages (8 faults of 2 MiB,
// not 4096 of 4 KiB). Fails without the restart (GLIBC_TUNABLES=glibc.malloc.hugetlb=0:
// 2051 faults).
TEST(HeapRetentionTest, TheRestartedProcessFaultsItsHeapInHugePages) {
  if (!absl::StrContains(ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"), "[always]") &&
      !absl::StrContains(ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"), "[madvise]")) {
    GTEST_SKIP() << "the kernel offers no transparent huge pages";
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  ASSERT_NE(tunables, nullptr) << "main() did not restart the test";
  EXPECT_TRUE(absl::StrContains(tunables, "glibc.malloc.hugetlb=1")) << tunables;
  // Restarted from its own path, the process keeps its name ("exe" otherwise).
  const std::string name = ReadFile("/proc/self/comm");
  EXPECT_TRUE(absl::StartsWith(name, "heap_retention")) << name;
  ASSERT_TRUE(RetainFreedHeapMemory().ok());

  constexpr size_t kBytes = size_t{16} << 20;
  const int64_t fallbacks = HugePageFallbacks();
  const int64_t faults = MinorFaults();
  char* block = TouchedBlock(kBytes);
  const int64_t taken = MinorFaults() - faults;
  std::free(block);
  if (HugePageFallbacks() != fallbacks) GTEST_SKIP() << "the kernel had no free huge page";
  EXPECT_LT(taken, static_cast<int64_t>(kBytes / 4096 / 8))
      << "16 MiB took " << taken << " page faults";
}

}  // namespace
}  // namespace handoff

int main(int argc, char** argv) {
  // As handoffd's main does; the restarted process runs the tests.
  (void)handoff::RestartWithHugePageHeap(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
