#include "sim/sample_sink/sink_core.h"
#include "sim/sample_sink/sink_test_util.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace handoff::sim {
namespace {

using handoff::v1::ApplyRequest;
using handoff::v1::ApplyResponse;

std::unique_ptr<SinkCore> OpenCore(const std::string& name, v1::FaultConfig faults = {},
                                   std::function<void()> hook = nullptr) {
  SinkCore::Options options;
  options.db_path = TestDb(name);
  options.faults = faults;
  options.crash_hook = std::move(hook);
  auto core = SinkCore::Open(std::move(options));
  EXPECT_TRUE(core.ok()) << core.status();
  return core.ok() ? *std::move(core) : nullptr;
}

absl::StatusOr<std::vector<ApplyResponse>> ApplyAll(SinkCore* core,
                                                    const std::vector<ApplyRequest>& requests,
                                                    bool batch) {
  std::vector<const ApplyRequest*> ptrs;
  for (const auto& r : requests) ptrs.push_back(&r);
  return core->Apply(ptrs, batch);
}

TEST(SinkCoreTest, FirstApplyRecordsThenReplaysAreAlreadyApplied) {
  auto core = OpenCore("dedupe");
  ApplyRequest r = Request(10, 1);
  auto first = ApplyAll(core.get(), {r}, false);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*first)[0].outcome(), handoff::v1::APPLY_OUTCOME_APPLIED);
  for (int i = 0; i < 2; ++i) {
    auto again = ApplyAll(core.get(), {r}, false);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ((*again)[0].outcome(), handoff::v1::APPLY_OUTCOME_ALREADY_APPLIED);
  }
  auto records = core->Records();
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ(records->at(r.idempotency_key()).attempts, 3u);
  EXPECT_EQ(records->at(r.idempotency_key()).request.finality(), handoff::v1::FINALITY_FINALIZED);
  v1::Stats stats = core->stats();
  EXPECT_EQ(stats.applied(), 1u);
  EXPECT_EQ(stats.already_applied(), 2u);
  EXPECT_EQ(stats.records(), 1u);
}

TEST(SinkCoreTest, BatchAnswersInOrderAndDedupesWithinTheBatch) {
  auto core = OpenCore("batch");
  auto out = ApplyAll(core.get(), {Request(1, 0), Request(1, 1), Request(1, 0)}, true);
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->size(), 3u);
  EXPECT_EQ((*out)[0].outcome(), handoff::v1::APPLY_OUTCOME_APPLIED);
  EXPECT_EQ((*out)[1].outcome(), handoff::v1::APPLY_OUTCOME_APPLIED);
  EXPECT_EQ((*out)[2].outcome(), handoff::v1::APPLY_OUTCOME_ALREADY_APPLIED);
  auto records = core->Records();
  ASSERT_TRUE(records.ok());
  EXPECT_EQ(records->size(), 2u);
  EXPECT_EQ(records->at(Request(1, 0).idempotency_key()).attempts, 2u);
}

TEST(SinkCoreTest, PredicatesAnswerWithoutRecording) {
  v1::FaultConfig faults;
  faults.mutable_reject()->set_log_index_modulo(3);  // log 0, 3
  faults.mutable_review()->add_blocks(7);            // block 7
  faults.mutable_ignore()->add_idempotency_keys(Request(8, 1).idempotency_key());
  auto core = OpenCore("predicates", faults);
  auto out =
      ApplyAll(core.get(),
               {Request(5, 0), Request(5, 1), Request(7, 2), Request(8, 1), Request(9, 3)}, true);
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->size(), 5u);
  EXPECT_EQ((*out)[0].outcome(), handoff::v1::APPLY_OUTCOME_REJECTED);
  EXPECT_EQ((*out)[1].outcome(), handoff::v1::APPLY_OUTCOME_APPLIED);
  EXPECT_EQ((*out)[2].outcome(), handoff::v1::APPLY_OUTCOME_NEEDS_REVIEW);
  EXPECT_EQ((*out)[3].outcome(), handoff::v1::APPLY_OUTCOME_IGNORED);
  EXPECT_EQ((*out)[4].outcome(), handoff::v1::APPLY_OUTCOME_REJECTED);
  auto records = core->Records();
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ(records->count(Request(5, 1).idempotency_key()), 1u);
}

TEST(SinkCoreTest, FailNextCallsRetryLaterThenUnavailable) {
  v1::FaultConfig faults;
  faults.set_fail_next_calls(2);
  faults.set_fail_mode(v1::FAIL_MODE_RETRY_LATER);
  faults.set_retry_after_ms(1500);
  auto core = OpenCore("fail_next", faults);
  for (int i = 0; i < 2; ++i) {
    auto out = ApplyAll(core.get(), {Request(1, 0), Request(1, 1)}, true);
    ASSERT_TRUE(out.ok());
    ASSERT_EQ(out->size(), 2u);
    EXPECT_EQ((*out)[1].outcome(), handoff::v1::APPLY_OUTCOME_RETRY_LATER);
    EXPECT_EQ((*out)[1].retry_after_ms(), 1500u);
  }
  auto ok = ApplyAll(core.get(), {Request(1, 0)}, false);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)[0].outcome(), handoff::v1::APPLY_OUTCOME_APPLIED);

  faults.set_fail_next_calls(1);
  faults.set_fail_mode(v1::FAIL_MODE_UNAVAILABLE);
  core->SetFaults(faults);
  EXPECT_EQ(ApplyAll(core.get(), {Request(2, 0)}, false).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(ApplyAll(core.get(), {Request(2, 0)}, false).ok());
  auto records = core->Records();
  ASSERT_TRUE(records.ok());
  EXPECT_EQ(records->size(), 2u);
  EXPECT_EQ(core->stats().failed_calls(), 1u);
  EXPECT_EQ(core->stats().retry_later(), 4u);
}

TEST(SinkCoreTest, BatchKnobs) {
  v1::FaultConfig faults;
  faults.set_batch_unimplemented(true);
  auto core = OpenCore("batch_knobs", faults);
  EXPECT_EQ(ApplyAll(core.get(), {Request(1, 0)}, true).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(ApplyAll(core.get(), {Request(1, 0)}, false).ok());

  faults.set_batch_unimplemented(false);
  faults.set_batch_answer_limit(2);
  core->SetFaults(faults);
  auto out = ApplyAll(core.get(), {Request(2, 0), Request(2, 1), Request(2, 2)}, true);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->size(), 2u);
  auto records = core->Records();
  ASSERT_TRUE(records.ok());
  EXPECT_EQ(records->size(), 3u);  // 1/0, 2/0, 2/1: the unanswered one is not recorded
  EXPECT_EQ(records->count(Request(2, 2).idempotency_key()), 0u);
}

TEST(SinkCoreTest, DieAfterRecordsCrashesWithTheRecordDurable) {
  v1::FaultConfig faults;
  faults.set_die_after_records(2);
  std::atomic<int> crashes{0};
  const std::string name = "die_after";
  {
    auto core = OpenCore(name, faults, [&] { ++crashes; });
    auto out = ApplyAll(core.get(), {Request(1, 0), Request(1, 1), Request(1, 2)}, true);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(crashes.load(), 1);
    // Dead: later calls fail and record nothing.
    EXPECT_EQ(ApplyAll(core.get(), {Request(9, 9)}, false).status().code(),
              absl::StatusCode::kUnavailable);
  }
  auto core = OpenCore(name);  // the restart
  auto records = core->Records();
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ(records->count(Request(1, 1).idempotency_key()), 1u);
  auto replay = ApplyAll(core.get(), {Request(1, 0), Request(1, 1), Request(1, 2)}, true);
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ((*replay)[0].outcome(), handoff::v1::APPLY_OUTCOME_ALREADY_APPLIED);
  EXPECT_EQ((*replay)[1].outcome(), handoff::v1::APPLY_OUTCOME_ALREADY_APPLIED);
  EXPECT_EQ((*replay)[2].outcome(), handoff::v1::APPLY_OUTCOME_APPLIED);
}

TEST(SinkCoreTest, DieBeforeRecordsCrashesWithoutTheRecord) {
  v1::FaultConfig faults;
  faults.set_die_before_records(2);
  std::atomic<int> crashes{0};
  const std::string name = "die_before";
  {
    auto core = OpenCore(name, faults, [&] { ++crashes; });
    EXPECT_TRUE(ApplyAll(core.get(), {Request(1, 0)}, false).ok());
    EXPECT_EQ(ApplyAll(core.get(), {Request(1, 1)}, false).status().code(),
              absl::StatusCode::kUnavailable);
    EXPECT_EQ(crashes.load(), 1);
  }
  auto core = OpenCore(name);
  auto records = core->Records();
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ(records->count(Request(1, 0).idempotency_key()), 1u);
}

TEST(SinkCoreTest, ConcurrentAppliesOfOneKeyRecordItOnce) {
  auto core = OpenCore("concurrent");
  const ApplyRequest r = Request(3, 3);
  std::atomic<int> applied{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      auto out = ApplyAll(core.get(), {r}, false);
      if (out.ok() && (*out)[0].outcome() == handoff::v1::APPLY_OUTCOME_APPLIED) ++applied;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(applied.load(), 1);
  auto records = core->Records();
  ASSERT_TRUE(records.ok());
  EXPECT_EQ(records->at(r.idempotency_key()).attempts, 8u);
}

TEST(SinkCoreTest, ShutdownCutsASlowCallShort) {
  v1::FaultConfig faults;
  faults.set_delay_ms(60000);
  auto core = OpenCore("slow", faults);
  absl::StatusOr<std::vector<ApplyResponse>> out;
  std::thread caller([&] { out = ApplyAll(core.get(), {Request(1, 0)}, false); });
  ASSERT_TRUE(core->WaitForCalls(1, absl::Seconds(30)));
  const absl::Time start = absl::Now();
  core->Shutdown();
  caller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable);
  auto records = core->Records();
  ASSERT_TRUE(records.ok());
  EXPECT_TRUE(records->empty());
}

TEST(SinkCoreTest, OpenWithoutPathIsInvalid) {
  SinkCore::Options options;
  EXPECT_EQ(SinkCore::Open(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace handoff::sim
