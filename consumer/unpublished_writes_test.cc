#include "consumer/unpublished_writes.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace handoff::consumer {
namespace {

TEST(UnpublishedWritesTest, TheCapIsTheLowestWriteOfAPageNotYetPublished) {
  UnpublishedWrites w;
  EXPECT_FALSE(w.Current().below.has_value());
  w.Note(7, Position{150, 0});
  w.Note(7, Position{160, 2});  // a later step of the same page
  w.Note(8, Position{171, 0});
  ASSERT_TRUE(w.Current().below.has_value());
  EXPECT_EQ(*w.Current().below, (Position{150, 0}));
  w.Published(7);
  EXPECT_EQ(*w.Current().below, (Position{171, 0}));
  w.Published(9);  // a later page published: every earlier one is
  EXPECT_FALSE(w.Current().below.has_value());
}

TEST(UnpublishedWritesTest, ADiscardedPageNoLongerCaps) {
  UnpublishedWrites w;
  w.Note(4, Position{120, 0});
  w.Note(5, Position{100, 0});
  w.Discard(5);  // its attempt lost a race: nothing of it was written unsynced
  ASSERT_TRUE(w.Current().below.has_value());
  EXPECT_EQ(*w.Current().below, (Position{120, 0}));
  w.Discard(9);  // not noted: nothing changes
  EXPECT_EQ(*w.Current().below, (Position{120, 0}));
}

TEST(UnpublishedWritesTest, AReadDuringWhichAWriteWasNotedIsNotUnchanged) {
  UnpublishedWrites w;
  const UnpublishedWrites::Cap before = w.Current();
  EXPECT_TRUE(w.Unchanged(before));
  w.Published(3);  // publishing moves nothing a reader relies on
  EXPECT_TRUE(w.Unchanged(before));
  w.Note(4, Position{10, 0});
  EXPECT_FALSE(w.Unchanged(before));
  EXPECT_TRUE(w.Unchanged(w.Current()));
}

TEST(UnpublishedWritesTest, PositionBefore) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(*PositionBefore(Position{5, 3}), (Position{5, 2}));
  EXPECT_EQ(*PositionBefore(Position{5, 0}), (Position{4, kMax}));
  EXPECT_FALSE(PositionBefore(Position{0, 0}).has_value());
}

}  // namespace
}  // namespace handoff::consumer
