#include "store/keys.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace handoff::store::keys {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

// Positions around the byte and word boundaries where a wrong encoding (little-endian,
// decimal text, 32-bit truncation) would reorder keys.
std::vector<uint64_t> EdgeValues() {
  return {0,
          1,
          0xff,
          0x100,
          0xffff,
          0x10000,
          (uint64_t{1} << 31) - 1,
          uint64_t{1} << 31,
          (uint64_t{1} << 32) - 1,
          uint64_t{1} << 32,
          (uint64_t{1} << 32) + 1,
          uint64_t{1} << 48,
          (uint64_t{1} << 63) - 1,
          uint64_t{1} << 63,
          kMax - 1,
          kMax};
}

std::vector<Position> RandomPositions(int n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> edges = EdgeValues();
  auto pick = [&]() -> uint64_t {
    switch (rng() % 4) {
      case 0:
        return edges[rng() % edges.size()];
      case 1:
        return rng() % 1000;  // small, many ties
      case 2:
        return (uint64_t{1} << 32) + rng() % 1000;  // just above 2^32
      default:
        return rng();  // anywhere, including near 2^64
    }
  };
  std::vector<Position> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) out.push_back(Position{pick(), pick()});
  return out;
}

TEST(KeysTest, PositionalKeyOrderIsPositionOrder) {
  std::vector<Position> positions = RandomPositions(5000, 1);
  for (uint64_t b : EdgeValues()) {
    for (uint64_t i : EdgeValues()) positions.push_back(Position{b, i});
  }
  std::vector<std::pair<std::string, Position>> keyed;
  for (const Position& p : positions) keyed.emplace_back(Positional("src", p), p);
  std::sort(keyed.begin(), keyed.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < keyed.size(); ++i) {
    const Position& prev = keyed[i - 1].second;
    const Position& cur = keyed[i].second;
    ASSERT_LE(prev, cur) << prev.DebugString() << " sorted after " << cur.DebugString();
    ASSERT_EQ(keyed[i - 1].first == keyed[i].first, prev == cur);
  }
}

TEST(KeysTest, PairwiseComparisonMatchesForStagedKeys) {
  std::vector<Position> a = RandomPositions(3000, 2);
  std::vector<Position> b = RandomPositions(3000, 3);
  for (size_t i = 0; i < a.size(); ++i) {
    for (Stage stage : {Stage::kIngest, Stage::kDelivery}) {
      const std::string ka = Staged("src-1", stage, a[i]);
      const std::string kb = Staged("src-1", stage, b[i]);
      EXPECT_EQ(ka < kb, a[i] < b[i]) << a[i].DebugString() << " vs " << b[i].DebugString();
      EXPECT_EQ(ka == kb, a[i] == b[i]);
    }
  }
}

TEST(KeysTest, DecodePositionRoundTrips) {
  std::vector<Position> positions = RandomPositions(2000, 4);
  for (uint64_t b : EdgeValues()) positions.push_back(Position{b, kMax - b});
  for (const Position& p : positions) {
    absl::StatusOr<Position> from_positional = DecodePosition(Positional("a-b", p));
    ASSERT_TRUE(from_positional.ok()) << from_positional.status();
    EXPECT_EQ(*from_positional, p);
    absl::StatusOr<Position> from_staged = DecodePosition(Staged("a", Stage::kDelivery, p));
    ASSERT_TRUE(from_staged.ok()) << from_staged.status();
    EXPECT_EQ(*from_staged, p);
  }
}

TEST(KeysTest, DecodePositionRejectsShortKeys) {
  EXPECT_EQ(DecodePosition("").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodePosition(std::string(16, 'x')).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(DecodePosition(std::string(17, 'x')).ok());
}

TEST(KeysTest, BigEndianRoundTripsAndOrders) {
  for (uint64_t v : EdgeValues()) {
    std::string s;
    AppendBigEndian64(&s, v);
    ASSERT_EQ(s.size(), 8u);
    EXPECT_EQ(DecodeBigEndian64(s.data()), v);
  }
  std::string one, two_to_32;
  AppendBigEndian64(&one, 1);
  AppendBigEndian64(&two_to_32, uint64_t{1} << 32);
  EXPECT_LT(one, two_to_32);
}

// "a" and "a-b" (or "a0"): no key of one source may fall in the other's prefix range.
TEST(KeysTest, SourcePrefixesDoNotCollide) {
  const std::vector<std::string> ids = {"a", "a-b", "a0", "ab", "a-", "b", "a-b-c"};
  for (const std::string& x : ids) {
    const std::string begin = SourcePrefix(x);
    const std::string end = PrefixSuccessor(begin);
    for (const std::string& y : ids) {
      std::vector<std::string> keys_of_y = {
          Checkpoint(y, Stage::kIngest),
          Checkpoint(y, Stage::kDelivery),
          Positional(y, Position{0, 0}),
          Positional(y, Position{kMax, kMax}),
          Staged(y, Stage::kIngest, Position{0, 0}),
          Staged(y, Stage::kDelivery, Position{kMax, kMax}),
          StagePrefix(y, Stage::kDelivery),
      };
      for (const std::string& k : keys_of_y) {
        const bool in_range = begin <= k && k < end;
        EXPECT_EQ(in_range, x == y) << "key of '" << y << "' vs range of '" << x << "'";
        EXPECT_EQ(k.compare(0, begin.size(), begin) == 0, x == y);
      }
    }
  }
}

TEST(KeysTest, StagesDoNotOverlap) {
  const std::string ingest = StagePrefix("s", Stage::kIngest);
  const std::string delivery = StagePrefix("s", Stage::kDelivery);
  EXPECT_LT(Staged("s", Stage::kIngest, Position{kMax, kMax}),
            Staged("s", Stage::kDelivery, Position{0, 0}));
  EXPECT_LE(PrefixSuccessor(ingest), delivery);
  EXPECT_EQ(Staged("s", Stage::kIngest, Position{3, 4}).compare(0, ingest.size(), ingest), 0);
}

TEST(KeysTest, PrefixSuccessor) {
  EXPECT_EQ(PrefixSuccessor("abc"), "abd");
  EXPECT_EQ(PrefixSuccessor(std::string("a\0", 2)), "a\x01");
  EXPECT_EQ(PrefixSuccessor("a\xff"), "b");
  EXPECT_EQ(PrefixSuccessor("a\xff\xff"), "b");
  EXPECT_EQ(PrefixSuccessor("\xff\xff"), "");
  EXPECT_EQ(PrefixSuccessor(""), "");
  // Every key with the prefix sorts below the successor; the successor itself does not
  // carry the prefix.
  const std::string prefix = SourcePrefix("src");
  const std::string succ = PrefixSuccessor(prefix);
  EXPECT_LT(Positional("src", Position{kMax, kMax}), succ);
  EXPECT_LT(prefix + std::string(64, '\xff'), succ);
  EXPECT_NE(succ.compare(0, prefix.size(), prefix), 0);
}

TEST(KeysTest, KeyLayout) {
  EXPECT_EQ(Source("s1"), "s1");
  EXPECT_EQ(SourcePrefix("s1"), std::string("s1\0", 3));
  EXPECT_EQ(Checkpoint("s1", Stage::kDelivery), std::string("s1\0\x02", 4));
  EXPECT_EQ(Positional("s1", Position{1, 2}).size(), 3u + 16u);
  EXPECT_EQ(Staged("s1", Stage::kIngest, Position{1, 2}).size(), 4u + 16u);
}

// The buffer-reusing forms write exactly the same keys, whatever the buffer held.
TEST(KeysTest, AssignFormsEqualTheAllocatingOnes) {
  std::string buf = "leftover bytes from an earlier, longer key of another source";
  for (const Position pos : {Position{0, 0}, Position{7, 3}, Position{~0ull, ~0ull}}) {
    AssignPositional("src-a", pos, &buf);
    EXPECT_EQ(buf, Positional("src-a", pos));
    AssignStaged("src-a", Stage::kDelivery, pos, &buf);
    EXPECT_EQ(buf, Staged("src-a", Stage::kDelivery, pos));
    AssignStaged("a-much-longer-source-identifier-than-the-small-string-buffer", Stage::kIngest,
                 pos, &buf);
    EXPECT_EQ(buf, Staged("a-much-longer-source-identifier-than-the-small-string-buffer",
                          Stage::kIngest, pos));
  }
}

}  // namespace
}  // namespace handoff::store::keys
