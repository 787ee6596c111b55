#include "consumer/memory_bound.h"

#include <algorithm>
#include <thread>

#include "gtest/gtest.h"

namespace handoff::consumer {
namespace {

// One shared parser per core the process sees, within [2, kMaxDomParsers].
TEST(MemoryBoundTest, DomParsersFollowTheCores) {
  const size_t cores = std::thread::hardware_concurrency();
  EXPECT_EQ(DomParsers(), std::clamp<size_t>(cores, 2, kMaxDomParsers));
  EXPECT_GE(DomParsers(), 2u);
  EXPECT_LE(DomParsers(), kMaxDomParsers);
}

// The DOM term counts one parser per source until the pool's size, then no more.
TEST(MemoryBoundTest, DomTermStopsGrowingAtTheParserCount) {
  EXPECT_DOUBLE_EQ(DomPageFactor(1), kDomBytesPerWireByte);
  EXPECT_DOUBLE_EQ(DomPageFactor(DomParsers()), DomParsers() * kDomBytesPerWireByte);
  EXPECT_DOUBLE_EQ(DomPageFactor(1000), DomPageFactor(DomParsers()));
}

// Every term of the bound scales with the largest page, and each source kind adds its
// factor.
TEST(MemoryBoundTest, BoundAddsEachTermTimesTheLargestPage) {
  PageMemoryInputs in;
  in.largest_page_bytes = 1000;
  in.page_slots = 16;
  in.poll_sources = 3;
  in.sse_sources = 2;
  in.waiting_sources = 1;
  const double expected =
      1000 * (16 * SlotPageFactor() + 3 * PollSourcePageFactor() + 2 * SseSourcePageFactor() +
              1 * WaitingSourcePageFactor() + DomPageFactor(5) + ProcessPageFactor());
  EXPECT_DOUBLE_EQ(PageMemoryBound(in), expected);
  in.largest_page_bytes = 2000;
  EXPECT_DOUBLE_EQ(PageMemoryBound(in), 2 * expected);
}

}  // namespace
}  // namespace handoff::consumer
