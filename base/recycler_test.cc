#include "base/recycler.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace handoff {
namespace {

// Records its id in `freed` when destroyed; may look at its recycler from its destructor.
struct Tracked {
  Tracked(int id, std::vector<int>* freed, const Recycler<Tracked>* owner = nullptr)
      : id(id), freed(freed), owner(owner) {}
  ~Tracked() {
    if (owner != nullptr) owner->held();  // would deadlock if freed under the lock
    freed->push_back(id);
  }
  int id;
  std::vector<int>* freed;
  const Recycler<Tracked>* owner;
};

TEST(RecyclerTest, HandsOutTheNewestFirstAndEachOnce) {
  std::vector<int> freed;
  Recycler<Tracked> r(3);
  EXPECT_EQ(r.Take(), nullptr);
  r.Give(std::make_unique<Tracked>(1, &freed));
  r.Give(std::make_unique<Tracked>(2, &freed));
  r.Give(nullptr);  // ignored
  EXPECT_EQ(r.held(), 2u);
  std::unique_ptr<Tracked> a = r.Take();
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->id, 2);
  std::unique_ptr<Tracked> b = r.Take();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->id, 1);
  EXPECT_EQ(r.Take(), nullptr);
  EXPECT_TRUE(freed.empty());
}

TEST(RecyclerTest, BeyondTheBoundTheOldestIsFreedOutsideTheLock) {
  std::vector<int> freed;
  Recycler<Tracked> r(2);
  for (int id = 1; id <= 4; ++id) r.Give(std::make_unique<Tracked>(id, &freed, &r));
  EXPECT_EQ(r.held(), 2u);
  EXPECT_EQ(freed, (std::vector<int>{1, 2}));
  EXPECT_EQ(r.Take()->id, 4);
  EXPECT_EQ(r.Take()->id, 3);
}

TEST(RecyclerTest, ABoundOfZeroKeepsNothing) {
  std::vector<int> freed;
  Recycler<Tracked> r(0);
  r.Give(std::make_unique<Tracked>(7, &freed, &r));
  EXPECT_EQ(r.held(), 0u);
  EXPECT_EQ(freed, std::vector<int>{7});
  EXPECT_EQ(r.Take(), nullptr);
}

}  // namespace
}  // namespace handoff
