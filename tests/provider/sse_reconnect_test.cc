// Issue 4, SSE: the real engine's stream reconnects from its committed cursor after a
// dropped connection, after silence, after an `event: error` control, and after a
// truncated or incomplete frame (discarded whole), as the simulator's request log shows
// (Last-Event-ID equals the durable cursor, never an id merely received); and nothing is
// lost or duplicated afterwards. And a stream at the head, which may wait minutes for
// the next block, shows its last page as soon as it is durable.
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/provider/rig.h"

namespace handoff::tests {
namespace {

using sim::Fault;

struct ReconnectCase {
  const char* name;
  Fault fault;
  const char* refusal_code;  // what the adapter reported (the observer's refusal code)
};

class SseReconnectTest : public ProviderRigTest,
                         public ::testing::WithParamInterface<ReconnectCase> {};

TEST_P(SseReconnectTest, ReconnectsFromTheCommittedCursor) {
  const ReconnectCase& c = GetParam();
  sse_silence_ = absl::Seconds(1);  // heartbeats come every 200 ms
  const std::string id = "stream";
  Create(Spec(id, handoff::v1::TRANSPORT_SSE, 150));
  ASSERT_TRUE(WaitIdle(id));
  const handoff::v1::Progress before = Progress(id);
  const std::string committed = before.checkpoint().resume_cursor();
  const size_t streams = StreamRequests().size();
  ASSERT_GE(streams, 1u);

  sim().ArmFault(c.fault);
  // The stream is dropped and a new one opens.
  ASSERT_TRUE(WaitFor(id, [&](const handoff::v1::Progress&) {
    return StreamRequests().size() > streams;
  })) << "no reconnection after " << c.name;
  const sim::RequestRecord again = StreamRequests()[streams];
  EXPECT_TRUE(again.has_last_event_id);
  EXPECT_EQ(again.last_event_id, committed) << "reconnected from an uncommitted id";
  bool reported = false;
  for (const std::string& code : observer_.Refusals(id)) {
    reported |= absl::StrContains(absl::StrCat("|", c.refusal_code, "|"), absl::StrCat("|", code, "|"));
  }
  EXPECT_TRUE(reported) << "no '" << c.refusal_code << "' refusal after " << c.name;
  const handoff::v1::Progress after_fault = Progress(id);
  EXPECT_EQ(after_fault.checkpoint().checkpoint_version(), before.checkpoint().checkpoint_version());

  // And the stream carries on: new blocks arrive whole, nothing lost or repeated.
  sim().chain().AddBlocks(12);
  ASSERT_TRUE(WaitCaughtUp(id));
  ExpectRowsCanonical(id, 150, head());
  EXPECT_EQ(Progress(id).counters().applied(), (head() - 150 + 1) * 3);
  ExpectRefusalsKeptTheCursor(id);
  ExpectStreamsResumedFromCommittedCursors();
}

// The worker writes a page's barrier and syncs it while it goes on to the next pages
// (WorkerOptions::max_unsynced_pages); at the head the next Fetch waits for a block
// that may be minutes away, so the last pages must be published before that wait, not
// after it.
// A drop in the middle of a catch-up, while the reader holds frames received ahead of
// what is committed: the new stream starts from the committed cursor, not from the last
// id received (every stream request's Last-Event-ID was passed to Fetch, i.e. committed,
// before the stream asked for it), and nothing is lost or repeated.
TEST_F(ProviderRigTest, ADropMidCatchUpResumesFromTheCommittedCursor) {
  const std::string id = "catching-up";
  sim().chain().AddBlocks(3000);  // a long catch-up: one block a page
  Create(Spec(id, handoff::v1::TRANSPORT_SSE, 0, /*page_limit=*/3));
  handoff::v1::Progress armed_at;
  ASSERT_TRUE(WaitFor(
      id, [](const handoff::v1::Progress& p) { return p.checkpoint().applied_block() >= 100; },
      absl::Seconds(20), &armed_at));
  const size_t streams = StreamRequests().size();
  sim().ArmFault(Fault::kDropConnection);
  ASSERT_TRUE(WaitFor(id, [&](const handoff::v1::Progress&) {
    return StreamRequests().size() > streams;
  })) << "the stream was not dropped";
  ASSERT_TRUE(WaitCaughtUp(id, absl::Seconds(60)));
  EXPECT_LT(armed_at.checkpoint().applied_block(), head()) << "dropped at the head, not mid-way";
  ExpectStreamsResumedFromCommittedCursors();
  ExpectRowsCanonical(id, 0, head());
  EXPECT_EQ(Progress(id).counters().applied(), (head() + 1) * 3);
}

TEST_F(ProviderRigTest, AStreamAtTheHeadPublishesItsLastPageWithoutWaitingForTheNext) {
  sim::ProviderSimOptions o = DefaultSimOptions();
  o.heartbeat = absl::Hours(1);  // nothing but pages ends the stream's wait
  StartSim(o);
  const std::string id = "stream";
  Create(Spec(id, handoff::v1::TRANSPORT_SSE, 150));
  ASSERT_TRUE(WaitCaughtUp(id, absl::Seconds(10))) << Progress(id).DebugString();
  EXPECT_EQ(Progress(id).counters().applied(), (head() - 150 + 1) * 3);
}

// A heartbeat (an empty page, `next` unchanged) asks for nothing on a stream: the next
// frame comes when the provider pushes it. So the worker goes straight back to reading
// the stream, and a page sent right behind a heartbeat is committed at once, not after
// the idle backoff that spaces out the polls of a caught-up polling source (15-30 s).
TEST_F(ProviderRigTest, APageBehindAHeartbeatDoesNotWaitForTheIdleBackoff) {
  consumer::BackoffPolicy idle = consumer::WorkerOptions().idle_backoff;
  idle.initial = idle.max;  // a caught-up polling source's steady wait: 15-30 s
  idle_backoff_ = idle;
  Restart();  // the manager takes the worker options when it opens
  const std::string id = "stream";
  Create(Spec(id, handoff::v1::TRANSPORT_SSE, 150));
  ASSERT_TRUE(WaitIdle(id));  // a heartbeat (every 200 ms) was read and applied as a no-op

  sim().chain().AddBlocks(1);
  const absl::Time added = absl::Now();
  ASSERT_TRUE(WaitCaughtUp(id, absl::Seconds(10)));
  EXPECT_LT(absl::Now() - added, idle.max * idle.jitter_floor)
      << "the page waited for the idle backoff";
  ExpectRowsCanonical(id, 150, head());

  // And heartbeats are read as they come, not one per backoff.
  const size_t fetches = journal_.Of(id).size();
  EXPECT_TRUE(WaitFor(
      id, [&](const handoff::v1::Progress&) { return journal_.Of(id).size() >= fetches + 3; },
      absl::Seconds(10)))
      << "heartbeats are read one per idle backoff";
  EXPECT_EQ(StreamRequests().size(), 1u);  // all on the one stream
}

INSTANTIATE_TEST_SUITE_P(
    Faults, SseReconnectTest,
    ::testing::Values(ReconnectCase{"drop", Fault::kDropConnection, "stream_closed|network"},
                      ReconnectCase{"silence", Fault::kSseSilence, "sse_silence"},
                      ReconnectCase{"error_control", Fault::kServerError, "internal"},
                      ReconnectCase{"incomplete_frame", Fault::kIncompleteSseFrame, "network"},
                      ReconnectCase{"truncated_body", Fault::kTruncatedBody, "network"}),
    [](const ::testing::TestParamInfo<ReconnectCase>& info) {
      return std::string(info.param.name);
    });

}  // namespace
}  // namespace handoff::tests
