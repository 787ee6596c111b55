#include "base/heap_retention.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

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
  char* block = TouchedBlock(kLargestHeapBlockBytes + (size_t{1} << 20));
  EXPECT_GT(mallinfo2().hblkhd, before.hblkhd);
  std::free(block);
  EXPECT_EQ(mallinfo2().hblkhd, before.hblkhd);
}

}  // namespace
}  // namespace handoff
