#include "sim/synthetic_chain.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "consumer/provider/page_parser.h"
#include "gtest/gtest.h"

namespace handoff::sim {
namespace {

ChainOptions Small() {
  ChainOptions o;
  o.seed = 9;
  o.initial_head = 100;
  o.logs_per_block = 4;
  o.safe_lag = 2;
  o.finality_lag = 10;
  return o;
}

// The page's items parsed back, through the production parser.
std::vector<handoff::v1::EventRow> Items(const PageContent& page) {
  std::string json = absl::StrCat(R"({"from":0,"through":null,"next":"x","reorg":false,)"
                                   R"("safe":null,"finalized":null,"tip":null,"items":[)",
                                   page.items_json, "]}");
  absl::StatusOr<consumer::Page> parsed = consumer::ParsePage(json);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed.ok() ? parsed->items : std::vector<handoff::v1::EventRow>{};
}

void ExpectSameRows(const std::vector<handoff::v1::EventRow>& a,
                    const std::vector<handoff::v1::EventRow>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].SerializeAsString(), b[i].SerializeAsString()) << i;
  }
}

TEST(SyntheticChainTest, PagesCoverWholeBlocksAndMatchCanonical) {
  SyntheticChain chain(Small());
  std::vector<handoff::v1::EventRow> all;
  CursorPosition pos{0, 0};
  int pages = 0;
  while (true) {
    PageContent page = chain.BuildPage(pos, 10);
    if (!page.through) break;
    EXPECT_FALSE(page.reorg);
    EXPECT_EQ(page.from, pos.block);
    EXPECT_EQ(*page.through, std::min<uint64_t>(pos.block + 1, 100));  // 10/4 logs: 2 blocks
    EXPECT_EQ(page.through_hash, chain.BlockHash(*page.through));
    auto items = Items(page);
    EXPECT_EQ(items.size(), page.item_count);
    all.insert(all.end(), items.begin(), items.end());
    pos = page.next;
    ++pages;
  }
  EXPECT_EQ(pages, 51);
  EXPECT_EQ(pos.block, 101u);
  ExpectSameRows(all, chain.Canonical(0, 100));
  // Deterministic across instances.
  SyntheticChain again(Small());
  ExpectSameRows(again.Canonical(0, 100), chain.Canonical(0, 100));
  EXPECT_EQ(chain.View().finalized, 90u);
  EXPECT_EQ(chain.View().safe, 98u);
}

TEST(SyntheticChainTest, ReorgYieldsCorrectionPageFromFork) {
  SyntheticChain chain(Small());
  std::string old_hash = chain.BlockHash(99);
  auto before = chain.Canonical(98, 100);
  absl::StatusOr<uint64_t> fork = chain.Reorg(3);
  ASSERT_TRUE(fork.ok());
  EXPECT_EQ(*fork, 98u);
  EXPECT_NE(chain.BlockHash(99), old_hash);
  EXPECT_EQ(chain.View().epoch, 1u);
  auto after = chain.Canonical(98, 100);
  ASSERT_EQ(after.size(), before.size());
  EXPECT_NE(after[0].block_hash(), before[0].block_hash());
  EXPECT_EQ(after[0].log_index(), before[0].log_index());

  // A client that applied through 100 (cursor 101, epoch 0): correction from 98.
  PageContent page = chain.BuildPage(CursorPosition{101, 0}, 4);
  EXPECT_TRUE(page.reorg);
  EXPECT_EQ(page.from, 98u);
  EXPECT_EQ(*page.through, 100u);  // covers all it applied, beyond the limit
  ExpectSameRows(Items(page), after);
  EXPECT_EQ(page.next.epoch, 1u);
  // A client below the fork is unaffected; one with the new epoch too.
  EXPECT_FALSE(chain.BuildPage(CursorPosition{97, 0}, 4).reorg);
  EXPECT_FALSE(chain.BuildPage(CursorPosition{101, 1}, 4).reorg);
  EXPECT_FALSE(chain.BuildPage(CursorPosition{101, 1}, 4).through.has_value());
}

TEST(SyntheticChainTest, ReorgNeverTouchesFinalizedBlocks) {
  SyntheticChain chain(Small());
  std::string final_hash = chain.BlockHash(90);
  absl::StatusOr<uint64_t> fork = chain.Reorg(50);
  ASSERT_TRUE(fork.ok());
  EXPECT_EQ(*fork, 91u);
  EXPECT_EQ(chain.BlockHash(90), final_hash);
}

TEST(SyntheticChainTest, GrowsWithTimeAndRandomReorgsAreDeterministic) {
  ChainOptions o = Small();
  o.blocks_per_second = 10;
  o.reorg_probability = 0.3;
  absl::Time t0 = absl::FromUnixSeconds(1000);
  SyntheticChain a(o, t0), b(o, t0);
  a.AdvanceTo(t0 + absl::Seconds(10));
  b.AdvanceTo(t0 + absl::Seconds(10));
  EXPECT_EQ(a.View().head, 200u);
  EXPECT_GT(a.View().epoch, 0u);
  EXPECT_EQ(a.View().epoch, b.View().epoch);
  ExpectSameRows(a.Canonical(90, 200), b.Canonical(90, 200));
}

TEST(SyntheticChainTest, WaitForChangeWakesOnNewBlocks) {
  SyntheticChain chain(Small());
  uint64_t seen = chain.ChangeCount();
  std::atomic<bool> stop{false};
  EXPECT_FALSE(chain.WaitForChange(seen, absl::Now() + absl::Milliseconds(5), &stop));
  chain.AddBlocks(1);
  EXPECT_TRUE(chain.WaitForChange(seen, absl::Now() + absl::Seconds(30), &stop));
  stop = true;
  chain.Poke();
  EXPECT_FALSE(chain.WaitForChange(chain.ChangeCount(), absl::Now() + absl::Seconds(30), &stop));
}

}  // namespace
}  // namespace handoff::sim
