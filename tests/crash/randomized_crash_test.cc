// Seeded randomized crash test: random page sequences (overlaps, corrections, empty
// pages, a non-advancing cursor at the end), random sink outcomes (applied, ignored,
// quarantined, retried, held for review and resolved), and random crash points. The
// same invariants as the crash-injection suite are checked after every crash and at
// the end. A failure prints its seed; replay one seed with
//   bazel test //tests/crash:randomized_crash_test --test_env=HANDOFF_SEED=<seed>
// and widen the run with --test_env=HANDOFF_SEEDS=<count>.
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "consumer/fault_points.h"
#include "gtest/gtest.h"
#include "tests/crash/harness.h"

namespace handoff::tests {
namespace {

using consumer::FaultPoints;
using consumer::PageAttempt;
using consumer::SinkAnswer;
using consumer::testing::MakePage;
using consumer::testing::MakeRow;
using Kind = PageAttempt::Result::Kind;

const char* const kPoints[] = {
    "ingest.after_fetch",          "ingest.before_event_commit",
    "ingest.after_event_commit",   "ingest.before_quarantine_commit",
    "ingest.after_quarantine_commit", "ingest.after_deliver",
    "ingest.before_barrier",       "ingest.after_barrier",
};

// A random chain and the pages a provider serves over it.
Script RandomScript(std::mt19937_64& rng, int pages) {
  Script s;
  std::vector<int> fork;       // fork id per block (from 100)
  std::vector<int> counts;     // events per block
  auto block_events = [&](uint64_t b) {
    while (fork.size() <= b - 100) {
      fork.push_back(0);
      counts.push_back(static_cast<int>(rng() % 3));
    }
  };
  uint64_t next_from = 100;
  uint64_t last_through = 99;
  for (int i = 0; i < pages; ++i) {
    int kind = static_cast<int>(rng() % 10);
    consumer::Page p;
    if (kind == 0 && last_through >= 101) {
      // Correction: blocks >= fork_at get a new fork (and new event counts).
      uint64_t depth = 1 + rng() % 3;
      uint64_t fork_at = std::max<uint64_t>(100, last_through + 1 - depth);
      for (uint64_t b = fork_at; b <= last_through; ++b) {
        block_events(b);
        fork[b - 100] += 1;
        counts[b - 100] = static_cast<int>(rng() % 3);
      }
      uint64_t through = last_through + rng() % 2;
      std::vector<handoff::v1::EventRow> items;
      for (uint64_t b = fork_at; b <= through; ++b) {
        block_events(b);
        for (int k = 0; k < counts[b - 100]; ++k) {
          items.push_back(MakeRow(b, k, std::string(1, static_cast<char>('a' + fork[b - 100] % 26))));
        }
      }
      p = MakePage(fork_at, through, std::move(items), "", /*reorg=*/true);
      last_through = std::max(last_through, through);
    } else if (kind == 1) {
      // Empty page advancing over blocks with no events (null through sometimes).
      uint64_t through = next_from + rng() % 3;
      for (uint64_t b = next_from; b <= through; ++b) {
        block_events(b);
        counts[b - 100] = 0;
      }
      if (rng() % 2 == 0) {
        p.from = next_from;
        // null through: the page covers nothing, so the next page may start anywhere;
        // keep it contiguous anyway.
        last_through = through;
      } else {
        p = MakePage(next_from, through, {}, "");
        last_through = through;
      }
    } else {
      // Normal page, sometimes overlapping the previous one.
      uint64_t from = next_from;
      if (kind <= 3 && from > 101) from -= 1 + rng() % 2;
      uint64_t through = std::max<uint64_t>(from, next_from) + rng() % 4;
      std::vector<handoff::v1::EventRow> items;
      for (uint64_t b = from; b <= through; ++b) {
        block_events(b);
        for (int k = 0; k < counts[b - 100]; ++k) {
          items.push_back(MakeRow(b, k, std::string(1, static_cast<char>('a' + fork[b - 100] % 26))));
        }
      }
      p = MakePage(from, through, std::move(items), "");
      last_through = std::max(last_through, through);
    }
    p.next = absl::StrCat("r", i + 1, "-", rng() % 1000);
    s.cursors.push_back(i == 0 ? "100" : s.pages.back().next);
    s.pages.push_back(std::move(p));
    next_from = last_through + 1;
  }
  return s;
}

SinkAnswer RandomAnswer(uint64_t seed, const std::string& key, int attempt) {
  std::seed_seq seq{seed, static_cast<uint64_t>(std::hash<std::string>()(key))};
  std::mt19937 rng(seq);
  int roll = static_cast<int>(rng() % 100);
  SinkAnswer a;
  a.kind = SinkAnswer::Kind::kApplied;
  if (roll < 6) {
    a.kind = SinkAnswer::Kind::kIgnored;
  } else if (roll < 12) {
    a.kind = SinkAnswer::Kind::kRejected;
  } else if (roll < 22 && attempt == 1) {
    a.kind = SinkAnswer::Kind::kRetryLater;
  } else if (roll < 26 && attempt == 1) {
    a.kind = SinkAnswer::Kind::kTransportError;
  } else if (roll < 31 && attempt <= 2) {
    a.kind = SinkAnswer::Kind::kNeedsReview;
  }
  return a;
}

void RunSeed(uint64_t seed) {
  SCOPED_TRACE(absl::StrCat("HANDOFF_SEED=", seed));
  std::mt19937_64 rng(seed);
  HarnessOptions o;
  o.external_sink = rng() % 2 == 0;
  o.sink_batch = 1 + static_cast<int>(rng() % 4);
  o.events_per_step = 1 + static_cast<int>(rng() % 3);
  o.fuse_barrier = rng() % 2 == 0;
  o.on_rejection = rng() % 2 == 0 ? handoff::v1::REJECTION_POLICY_QUARANTINE
                                  : handoff::v1::REJECTION_POLICY_HOLD;
  o.max_attempts = 2 + static_cast<uint32_t>(rng() % 3);
  const Script script = RandomScript(rng, 8 + static_cast<int>(rng() % 12));
  Harness h(consumer::testing::TestDir(absl::StrCat("random-", seed)), o);
  h.Open();
  h.Load(script);
  auto arm = [&] {
    FaultPoints::ArmNth(kPoints[rng() % (sizeof(kPoints) / sizeof(kPoints[0]))],
                        1 + static_cast<int>(rng() % 4));
  };
  auto set_script = [&] {
    h.sink().SetScript(
        [seed](const std::string& key, int attempt) { return RandomAnswer(seed, key, attempt); });
  };
  set_script();
  arm();
  int crashes = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  for (int step = 0;; ++step) {
    ASSERT_LT(absl::Now(), deadline) << "no progress";
    PageAttempt::Result r = h.Step();
    if (r.kind == Kind::kNothingNew) break;
    switch (r.kind) {
      case Kind::kCrashed:
        ++crashes;
        h.Crash();
        set_script();
        ASSERT_EQ(CheckInvariants(h, script), "") << "after crash " << crashes;
        if (crashes < 6) arm();
        break;
      case Kind::kBlockedOnHold: {
        std::vector<handoff::v1::Hold> holds = h.Holds();
        ASSERT_FALSE(holds.empty()) << r.detail;
        for (const handoff::v1::Hold& hold : holds) {
          handoff::v1::HoldDecision decision =
              static_cast<handoff::v1::HoldDecision>(1 + rng() % 3);
          absl::StatusOr<handoff::v1::ResolveHoldResponse> res =
              h.Resolve(Position{hold.event().block_number(), hold.event().log_index()},
                        decision);
          ASSERT_TRUE(res.ok()) << res.status();
        }
        break;
      }
      case Kind::kRetryLater:
        absl::SleepFor(std::max(absl::ZeroDuration(), r.retry_at - absl::Now()));
        break;
      case Kind::kPromoted:
      case Kind::kLostRace:
        break;
      default:
        FAIL() << "unexpected result " << static_cast<int>(r.kind) << ": " << r.detail;
    }
  }
  EXPECT_EQ(CheckComplete(h, script), "");
  EXPECT_TRUE(h.Holds().empty());
  if (o.external_sink) {
    // Every delivery of an event reused its key; the sink's dedupe kept effects at one.
    for (const auto& [pos, hash] : h.Rows()) {
      const std::string key = absl::StrCat(h.id(), "/", hash, "/", pos.log_index);
      EXPECT_LE(h.sink().effects(key), 1) << key;
    }
  }
  FaultPoints::DisarmAll();
}

TEST(RandomizedCrash, SeededRuns) {
  if (const char* one = getenv("HANDOFF_SEED")) {
    uint64_t seed = 0;
    ASSERT_TRUE(absl::SimpleAtoi(one, &seed));
    RunSeed(seed);
    return;
  }
  int seeds = 40;
  if (const char* n = getenv("HANDOFF_SEEDS")) {
    ASSERT_TRUE(absl::SimpleAtoi(n, &seeds));
  }
  const uint64_t base = 0x5eed0000;
  for (int i = 0; i < seeds && !HasFatalFailure(); ++i) RunSeed(base + i);
}

}  // namespace
}  // namespace handoff::tests
