// Issue 4, the long run: polling and SSE sources follow a growing chain with reorgs
// (random ones, per new block, and deep ones the test asks for) while the simulator
// drops connections, truncates bodies and frames, answers 500, serves overlapping pages
// and non-advancing cursors. When the chain stops at a fixed head and the consumers have
// caught up, every source's materialized rows equal the simulator's canonical chain
// from its start block to the applied position. Seeded; bounded well under a minute.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/provider/rig.h"

namespace handoff::tests {
namespace {

using sim::Fault;

TEST_F(ProviderRigTest, ReorgsAndFaultsConvergeOnTheCanonicalChain) {
  const absl::Time started = absl::Now();
  sim::ProviderSimOptions o = DefaultSimOptions();
  o.chain.seed = 29;
  o.chain.initial_head = 120;
  o.chain.finality_lag = 30;
  o.chain.reorg_probability = 0.04;  // per new block
  o.chain.reorg_depth = 4;
  o.fault_seed = 3;
  StartSim(o);

  struct Source {
    std::string id;
    handoff::v1::Transport transport;
    uint64_t start;
    uint32_t page_limit;
  };
  const std::vector<Source> sources = {
      {"poll-small", handoff::v1::TRANSPORT_POLL, 0, 7},     // two blocks a page
      {"poll-large", handoff::v1::TRANSPORT_POLL, 60, 1000},
      {"sse-small", handoff::v1::TRANSPORT_SSE, 20, 30},
      {"sse-large", handoff::v1::TRANSPORT_SSE, 100, 1000},
  };
  for (const Source& s : sources) Create(Spec(s.id, s.transport, s.start, s.page_limit));
  for (const Source& s : sources) ASSERT_TRUE(WaitCaughtUp(s.id));

  // Faults the consumer must ride out without losing or repeating anything.
  for (Fault f : {Fault::kDropConnection, Fault::kTruncatedBody, Fault::kIncompleteSseFrame,
                  Fault::kServerError, Fault::kOverlappingPage, Fault::kNonAdvancingCursor}) {
    sim().SetFaultProbability(f, 0.03);
  }

  std::mt19937_64 rng(20240601);
  int manual_reorgs = 0;
  for (int round = 0; round < 40; ++round) {
    sim().chain().AddBlocks(1 + rng() % 12);
    if (rng() % 10 < 3) {
      // A reorg of up to 10 blocks (never below finality), then at least one new block so
      // that "caught up" implies the correction was applied.
      if (sim().chain().Reorg(1 + rng() % 10).ok()) ++manual_reorgs;
      sim().chain().AddBlocks(1);
    }
    for (const Source& s : sources) {
      ASSERT_TRUE(WaitCaughtUp(s.id, absl::Seconds(15))) << "round " << round;
    }
    if (round % 10 == 9) {
      for (const Source& s : sources) ExpectRowsCanonical(s.id, s.start, head());
    }
  }

  // A fixed head: no more faults, everyone catches up, rows equal the surviving chain.
  sim().ClearFaults();
  sim().chain().AddBlocks(3);
  const uint64_t final_head = head();
  for (const Source& s : sources) {
    ASSERT_TRUE(WaitCaughtUp(s.id));
    const handoff::v1::Progress p = Progress(s.id);
    EXPECT_EQ(p.checkpoint().applied_block(), final_head);
    EXPECT_FALSE(IsHalted(p.state())) << s.id << ": " << p.reason();
    EXPECT_GT(p.counters().corrections(), 0u) << s.id;
    ExpectRowsCanonical(s.id, s.start, final_head);
    ExpectRefusalsKeptTheCursor(s.id);
    for (const auto& change : observer_.States(s.id)) {
      EXPECT_FALSE(IsHalted(change.state)) << s.id << " halted: " << change.reason;
    }
  }
  ExpectStreamsResumedFromCommittedCursors();
  EXPECT_GT(sim().chain().View().epoch, static_cast<uint64_t>(manual_reorgs));  // random ones too
  const absl::Duration took = absl::Now() - started;
  std::printf("long run: head %llu, %llu reorgs, %s\n",
              static_cast<unsigned long long>(final_head),
              static_cast<unsigned long long>(sim().chain().View().epoch),
              absl::FormatDuration(took).c_str());
}

}  // namespace
}  // namespace handoff::tests
