#include "sim/sample_sink/record_store.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace handoff::sim {
namespace {

std::string TestDb(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

SinkRecord Record(const std::string& key, uint64_t log_index, uint32_t attempts) {
  SinkRecord r;
  r.request.set_source_id("src");
  r.request.set_idempotency_key(key);
  r.request.mutable_event()->set_log_index(log_index);
  r.request.set_finality(handoff::v1::FINALITY_SAFE);
  r.attempts = attempts;
  return r;
}

TEST(RecordStoreTest, WritesAreReadBackAndSurviveReopen) {
  const std::string path = TestDb("reopen");
  {
    auto store = RecordStore::Open(path, /*sync=*/true);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ((*store)->size(), 0u);
    ASSERT_TRUE((*store)->Write({{"a", Record("a", 1, 1)}, {"b", Record("b", 2, 1)}}, 2).ok());
    auto missing = (*store)->Get("c");
    ASSERT_TRUE(missing.ok());
    EXPECT_FALSE(missing->has_value());
    ASSERT_TRUE((*store)->Write({{"a", Record("a", 1, 3)}}, 0).ok());
    EXPECT_EQ((*store)->size(), 2u);
  }
  auto store = RecordStore::Open(path, /*sync=*/true);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->size(), 2u);
  auto a = (*store)->Get("a");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->attempts, 3u);
  EXPECT_EQ((*a)->request.event().log_index(), 1u);
  EXPECT_EQ((*a)->request.finality(), handoff::v1::FINALITY_SAFE);
  auto all = (*store)->All();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ(all->at("b").request.idempotency_key(), "b");
}

TEST(RecordStoreTest, SecondOpenOfTheSameFolderFails) {
  const std::string path = TestDb("locked");
  auto first = RecordStore::Open(path, true);
  ASSERT_TRUE(first.ok());
  auto second = RecordStore::Open(path, true);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace handoff::sim
