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

// Rows come back as they were (their users overwrite every field), with their memory,
// except that a row carrying fields this build does not know comes back cleared.
TEST(RowPoolTest, RowsComeBackWithTheirMemoryAndNoUnknownFields) {
  RowPool pool(2);
  EXPECT_TRUE(pool.Take().empty());
  std::vector<handoff::v1::EventRow> given = Rows(3);
  // Field 100 (varint 1): unknown to EventRow, kept by the parser as an unknown field.
  ASSERT_TRUE(given[1].ParseFromString(given[1].SerializeAsString() + "\xa0\x06\x01"));
  ASSERT_FALSE(given[1].GetReflection()->GetUnknownFields(given[1]).empty());
  pool.Give(std::move(given));
  std::vector<handoff::v1::EventRow> rows = pool.Take();
  ASSERT_EQ(rows.size(), 3u);
  for (const handoff::v1::EventRow& row : rows) {
    EXPECT_TRUE(row.GetReflection()->GetUnknownFields(row).empty());
    EXPECT_GE(row.data().capacity(), 200u);  // the memory is kept for reuse
  }
  EXPECT_EQ(rows[0].block_number(), 1u);  // not cleared: overwritten by the next user
  EXPECT_EQ(rows[1].SerializeAsString(), "");  // had unknown fields: cleared
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
