#include "consumer/row_pool.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace handoff::consumer {
namespace {

std::vector<handoff::v1::EventRow> Rows(int n) {
  std::vector<handoff::v1::EventRow> rows(n);
  for (int i = 0; i < n; ++i) {
    rows[i].set_block_number(i + 1);
    rows[i].set_block_hash(std::string(66, 'a'));
    rows[i].add_topics(std::string(66, 'b'));
    rows[i].set_data(std::string(200, 'c'));
  }
  return rows;
}

TEST(RowPoolTest, RowsComeBackClearedWithTheirCapacity) {
  RowPool pool(2);
  EXPECT_TRUE(pool.Take().empty());
  pool.Give(Rows(3));
  std::vector<handoff::v1::EventRow> rows = pool.Take();
  ASSERT_EQ(rows.size(), 3u);
  for (const handoff::v1::EventRow& row : rows) {
    EXPECT_EQ(row.SerializeAsString(), "");  // equal to a default row
    EXPECT_GE(row.data().capacity(), 200u);  // the memory is kept for reuse
  }
  // A cleared repeated field hands its element back on Add().
  EXPECT_GE(rows[0].mutable_topics()->ClearedCount(), 1);
}

TEST(RowPoolTest, HoldsAtMostItsBound) {
  RowPool pool(2);
  pool.Give(Rows(1));
  pool.Give(Rows(1));
  pool.Give(Rows(1));  // freed
  pool.Give({});       // nothing to keep
  EXPECT_EQ(pool.held(), 2u);
  pool.Take();
  EXPECT_EQ(pool.held(), 1u);
}

}  // namespace
}  // namespace handoff::consumer
