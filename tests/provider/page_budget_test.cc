// The process-wide PageBudget (consumer/page_budget.h) under the real engine: sources
// polling and streaming over real HTTP share a budget far smaller than what they would
// hold each, and every one of them still catches up with the canonical chain. A source
// that waited for a slot while holding one, or a slot never released, would stall them.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "consumer/page_budget.h"
#include "gtest/gtest.h"
#include "tests/provider/rig.h"

namespace handoff::tests {
namespace {

class PageBudgetRigTest : public ProviderRigTest, public ::testing::WithParamInterface<size_t> {};

TEST_P(PageBudgetRigTest, SourcesSharingFewSlotsAllCatchUpCanonically) {
  page_budget_ = consumer::PageBudget::Create(GetParam());  // read as each worker starts
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i) {
    const handoff::v1::Transport t =
        i % 2 == 0 ? handoff::v1::TRANSPORT_POLL : handoff::v1::TRANSPORT_SSE;
    ids.push_back(absl::StrCat(t == handoff::v1::TRANSPORT_POLL ? "poll-" : "sse-", i));
    Create(Spec(ids.back(), t, 0, /*page_limit=*/30));  // 20 pages each to the head
  }
  for (const std::string& id : ids) {
    ASSERT_TRUE(WaitCaughtUp(id, absl::Seconds(60))) << id;
    ExpectRowsCanonical(id, 0, head());
  }
  EXPECT_LE(page_budget_->peak_held(), GetParam());
  EXPECT_GE(page_budget_->peak_held(), 1u);
  // The sources go on with new blocks, and stopping them releases what they held.
  sim().chain().AddBlocks(40);
  for (const std::string& id : ids) {
    ASSERT_TRUE(WaitCaughtUp(id, absl::Seconds(60))) << id;
    ExpectRowsCanonical(id, 0, head());
  }
  manager_.reset();
  EXPECT_EQ(page_budget_->held(), 0u);
  EXPECT_EQ(page_budget_->waiting(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Slots, PageBudgetRigTest, ::testing::Values(1, 3),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return absl::StrCat(info.param);
                         });

}  // namespace
}  // namespace handoff::tests
