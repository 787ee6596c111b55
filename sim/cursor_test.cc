#include "sim/cursor.h"

#include "gtest/gtest.h"

namespace handoff::sim {
namespace {

TEST(CursorTest, RoundTripAndBinding) {
  CursorCodec codec(42);
  uint64_t a = SourceBinding("sim", "erc20", "all");
  uint64_t b = SourceBinding("sim", "erc20", "other");
  EXPECT_NE(a, b);
  EXPECT_NE(SourceBinding("sim", "ab", "c"), SourceBinding("sim", "a", "bc"));
  std::string c = codec.Encode(a, CursorPosition{1234567890123, 7});
  absl::StatusOr<CursorPosition> p = codec.Decode(a, c);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->block, 1234567890123u);
  EXPECT_EQ(p->epoch, 7u);
  EXPECT_EQ(codec.Decode(b, c).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CursorCodec(43).Decode(a, c).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(codec.Decode(a, "not a cursor!").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(codec.Decode(a, "YWJj").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.find_first_of("+/= "), std::string::npos) << c;  // URL and header safe
}

}  // namespace
}  // namespace handoff::sim
