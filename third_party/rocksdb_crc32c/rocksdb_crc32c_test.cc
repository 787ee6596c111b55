#include "third_party/rocksdb_crc32c/rocksdb_crc32c.h"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"

// RocksDB's own entry point (util/crc32c.h, not installed by Debian): a call from here
// is wrapped like RocksDB's.
namespace rocksdb::crc32c {
uint32_t Extend(uint32_t init_crc, const char* data, size_t n);
}  // namespace rocksdb::crc32c

namespace handoff::rocksdb_crc32c {
namespace {

TEST(RocksDbCrc32c, KnownValues) {
  // The CRC-32C check value, and RocksDB's own test vectors (util/crc32c_test.cc).
  EXPECT_EQ(Extend(0, "123456789", 9), 0xe3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(Extend(0, zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(Extend(0, ones.data(), ones.size()), 0x62a8ab43u);
  EXPECT_EQ(Extend(Extend(0, "hello ", 6), "world", 5), Extend(0, "hello world", 11));
}

TEST(RocksDbCrc32c, MatchesRocksDbsOwnOnRandomInputs) {
  std::mt19937_64 rng(7);
  std::string buffer(8192 + 8, '\0');
  for (char& c : buffer) c = static_cast<char>(rng());
  for (int i = 0; i < 5000; ++i) {
    const size_t offset = rng() % 8;             // every alignment
    const size_t n = rng() % (i < 1000 ? 64 : 8192);  // short tails, then long runs
    const auto crc = static_cast<uint32_t>(rng());
    const char* data = buffer.data() + offset;
    ASSERT_EQ(Extend(crc, data, n), PortableExtend(crc, data, n))
        << "offset " << offset << " length " << n << " crc " << crc;
    ASSERT_EQ(rocksdb::crc32c::Extend(crc, data, n), PortableExtend(crc, data, n));
  }
}

TEST(RocksDbCrc32c, UsesTheInstructionWhereTheCpuHasIt) {
  EXPECT_EQ(UsesCrc32Instruction(), static_cast<bool>(__builtin_cpu_supports("sse4.2")));
}

// RocksDB's WAL writer calls the wrapped function, and a database reopened from disk
// replays its WAL (every record's CRC checked on the way) to the same contents.
TEST(RocksDbCrc32c, RocksDbsWalWritesAndReplayGoThroughIt) {
  const char* sanitizer = std::getenv("HANDOFF_SANITIZER");
  if (sanitizer != nullptr && std::string(sanitizer) == "tsan") {
    GTEST_SKIP() << "--config=tsan links RocksDB as a shared library, whose own calls "
                    "are not wrapped";
  }
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/crc32c_db";
  std::filesystem::remove_all(dir);
  rocksdb::Options options;
  options.create_if_missing = true;
  rocksdb::WriteOptions synced;
  synced.sync = true;
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(options, dir, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    const uint64_t before = WrappedCalls();
    for (int i = 0; i < 100; ++i) {
      ASSERT_TRUE(db->Put(synced, "key" + std::to_string(i), std::string(1000 + i, 'a' + i % 26)).ok());
    }
    EXPECT_GE(WrappedCalls() - before, 100u);
    // Closed without a flush: the rows live only in the WAL.
  }
  rocksdb::DB* raw = nullptr;
  options.paranoid_checks = true;
  ASSERT_TRUE(rocksdb::DB::Open(options, dir, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  for (int i = 0; i < 100; ++i) {
    std::string value;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), "key" + std::to_string(i), &value).ok()) << i;
    EXPECT_EQ(value, std::string(1000 + i, 'a' + i % 26));
  }
}

}  // namespace
}  // namespace handoff::rocksdb_crc32c
