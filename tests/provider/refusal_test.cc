// Issue 4, the contract's refusal table: every row, over real HTTP, mapped to the state
// the admin API reports (GetProgress), and never moving a position.
//
// Simulator faults cover the rows the provider chooses (503, 429, other 5xx, dropped
// connections, truncated bodies, 409 resync_required, 402); configuration covers the
// rows the consumer causes (400 unknown chain, 409 cursor_mismatch, 401 no token, 403 a
// wrong token). Each fault is met three ways: polling mid-run, an open SSE stream
// mid-run (an `event: error` control or a cut stream), and an SSE connect (the HTTP
// status before the first frame).
#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/provider/rig.h"

namespace handoff::tests {
namespace {

using handoff::v1::SourceState;
using sim::Fault;

enum class Path { kPollMidRun, kSseMidRun, kSseConnect };

struct RefusalCase {
  const char* name;
  const char* code;  // in the reason
  Fault fault;
  SourceState state;  // BACKING_OFF: recovers by itself
  // For BACKING_OFF with a provider-chosen delay: the delay in seconds (0: backoff).
  int retry_after_seconds;
};

const RefusalCase kCases[] = {
    {"chain_unavailable", "chain_unavailable", Fault::kChainUnavailable, handoff::v1::SOURCE_STATE_BACKING_OFF, 1},
    {"rate_limited", "rate_limited", Fault::kRateLimited, handoff::v1::SOURCE_STATE_BACKING_OFF, 2},
    {"server_error", "internal", Fault::kServerError, handoff::v1::SOURCE_STATE_BACKING_OFF, 0},
    {"drop_connection", "network", Fault::kDropConnection, handoff::v1::SOURCE_STATE_BACKING_OFF, 0},
    {"truncated_body", "network", Fault::kTruncatedBody, handoff::v1::SOURCE_STATE_BACKING_OFF, 0},
    {"resync_required", "resync_required", Fault::kResyncRequired, handoff::v1::SOURCE_STATE_RESYNC_REQUIRED, 0},
    {"payment_required", "insufficient_credit", Fault::kPaymentRequired, handoff::v1::SOURCE_STATE_FUNDING_REQUIRED, 0},
};

class RefusalTest : public ProviderRigTest,
                    public ::testing::WithParamInterface<std::tuple<RefusalCase, Path>> {};

TEST_P(RefusalTest, MapsToTheAdminStateAndNeverMovesThePosition) {
  const RefusalCase& c = std::get<0>(GetParam());
  const Path path = std::get<1>(GetParam());
  const std::string id = "src";
  const auto transport =
      path == Path::kPollMidRun ? handoff::v1::TRANSPORT_POLL : handoff::v1::TRANSPORT_SSE;

  handoff::v1::Progress before;
  absl::Time armed;
  if (path == Path::kSseConnect) {
    armed = absl::Now();
    sim().ArmFault(c.fault);
    Create(Spec(id, transport, 150));
    before.mutable_checkpoint()->set_resume_cursor("150");
  } else {
    Create(Spec(id, transport, 150));
    ASSERT_TRUE(WaitIdle(id));
    before = Progress(id);
    armed = absl::Now();
    sim().ArmFault(c.fault);
  }

  if (c.state != handoff::v1::SOURCE_STATE_BACKING_OFF) {
    // A halt: the state, with the reason, and nothing moved.
    handoff::v1::Progress p;
    ASSERT_TRUE(WaitFor(id, [&](const handoff::v1::Progress& pr) { return pr.state() == c.state; },
                        absl::Seconds(20), &p))
        << p.DebugString();
    EXPECT_TRUE(absl::StrContains(p.reason(), c.code)) << p.reason();
    EXPECT_EQ(p.checkpoint().resume_cursor(), before.checkpoint().resume_cursor());
    if (path != Path::kSseConnect) {
      EXPECT_EQ(p.checkpoint().checkpoint_version(), before.checkpoint().checkpoint_version());
      EXPECT_EQ(p.counters().applied(), before.counters().applied());
    } else {
      EXPECT_FALSE(p.checkpoint().has_applied());
    }
    EXPECT_EQ(p.retry_at_unix_ms(), 0);
    // The halt survives in the stored source (the admin API reads it after a restart).
    absl::StatusOr<handoff::v1::Source> stored = manager().GetSource(id);
    ASSERT_TRUE(stored.ok());
    EXPECT_EQ(stored->progress().state(), c.state);

    if (c.fault == Fault::kPaymentRequired) {
      // The funding action is kept for operators...
      EXPECT_TRUE(absl::StrContains(p.funding_action(), "\"next_action\"")) << p.funding_action();
      EXPECT_TRUE(absl::StrContains(p.funding_action(), "billing.example.invalid"));
      EXPECT_TRUE(absl::StrContains(p.funding_action(), "\"challenges\""));
      EXPECT_TRUE(absl::StrContains(p.funding_action(), "\"credit\""));
      EXPECT_EQ(stored->progress().funding_action(), p.funding_action());
      // ...and never in a reason, an error or anything the observer (logs) saw.
      for (const std::string& text : PublicTexts(id)) {
        EXPECT_FALSE(absl::StrContains(text, "billing.example.invalid")) << text;
        EXPECT_FALSE(absl::StrContains(text, "top-up")) << text;
        EXPECT_FALSE(absl::StrContains(text, "25.00")) << text;
      }
    } else {
      EXPECT_TRUE(p.funding_action().empty());
    }

    if (c.fault == Fault::kResyncRequired) {
      // The operator rebuilds from a numeric block; the source recovers.
      handoff::v1::RebuildSourceRequest rb;
      rb.set_source_id(id);
      rb.set_from_block(170);
      rb.set_start(true);
      // RESYNC_REQUIRED is published (and persisted) by the halting worker a moment
      // before its thread has exited; until then RebuildSource answers "is running:
      // StopSource first" (FAILED_PRECONDITION). An operator retries; so does the test.
      absl::StatusOr<handoff::v1::Source> rebuilt = manager().RebuildSource(rb);
      for (const absl::Time give_up = absl::Now() + absl::Seconds(5);
           !rebuilt.ok() && absl::IsFailedPrecondition(rebuilt.status()) && absl::Now() < give_up;) {
        WaitFor(id, [](const handoff::v1::Progress&) { return true; }, absl::Milliseconds(20));
        rebuilt = manager().RebuildSource(rb);
      }
      ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
      sim().chain().AddBlocks(4);
      ASSERT_TRUE(WaitCaughtUp(id));
      ExpectRowsCanonical(id, 170, head());
    }
    ExpectRefusalsKeptTheCursor(id);
    for (const std::string& text : PublicTexts(id)) {
      EXPECT_FALSE(absl::StrContains(text, kToken)) << text;
    }
    return;
  }

  if (c.retry_after_seconds > 0) {
    // BACKING_OFF until now + the provider's delay, the checkpoint untouched.
    handoff::v1::Progress p;
    ASSERT_TRUE(WaitFor(
        id,
        [&](const handoff::v1::Progress& pr) {
          return pr.state() == handoff::v1::SOURCE_STATE_BACKING_OFF &&
                 absl::StrContains(pr.reason(), c.code);
        },
        absl::Seconds(20), &p))
        << p.DebugString();
    const absl::Time seen = absl::Now();
    const absl::Time retry_at = absl::FromUnixMillis(p.retry_at_unix_ms());
    const absl::Duration delay = absl::Seconds(c.retry_after_seconds);
    EXPECT_GE(retry_at, armed + delay - absl::Milliseconds(5)) << "retry_at too early";
    EXPECT_LE(retry_at, seen + delay + absl::Milliseconds(5)) << "retry_at too late";
    EXPECT_EQ(p.checkpoint().resume_cursor(), before.checkpoint().resume_cursor());
    EXPECT_EQ(p.checkpoint().checkpoint_version(), before.checkpoint().checkpoint_version());
    // The refusal carried the delay; the next request waited for it.
    std::vector<FetchRecord> j;
    ASSERT_TRUE(WaitFor(id, [&](const handoff::v1::Progress&) {
      j = journal_.Of(id);
      for (size_t i = 0; i + 1 < j.size(); ++i) {
        if (!j[i].is_page && j[i].code == c.code) return true;
      }
      return false;
    }));
    for (size_t i = 0; i + 1 < j.size(); ++i) {
      if (j[i].is_page || j[i].code != c.code) continue;
      EXPECT_EQ(j[i].kind, consumer::RefusalKind::kRetryAfter);
      ASSERT_TRUE(j[i].retry_after.has_value());
      EXPECT_EQ(*j[i].retry_after, delay);
      EXPECT_GE(j[i + 1].started - j[i].ended, delay - absl::Milliseconds(5))
          << "retried before the provider's delay";
      break;
    }
  } else {
    // A transient failure: backoff, reported as BACKING_OFF with the reason.
    ASSERT_TRUE(WaitFor(id, [&](const handoff::v1::Progress&) {
      for (const auto& s : observer_.States(id)) {
        if (s.state == handoff::v1::SOURCE_STATE_BACKING_OFF &&
            absl::StartsWith(s.reason, "provider refused")) {
          return true;
        }
      }
      return false;
    })) << "no BACKING_OFF after " << c.name;
    bool transient = false;
    for (const FetchRecord& r : journal_.Of(id)) {
      if (!r.is_page) {
        EXPECT_EQ(r.kind, consumer::RefusalKind::kTransient) << r.code;
        transient = true;
      }
    }
    EXPECT_TRUE(transient);
  }

  // Recovers, with nothing lost or duplicated.
  sim().chain().AddBlocks(7);
  ASSERT_TRUE(WaitCaughtUp(id));
  handoff::v1::Progress after = Progress(id);
  EXPECT_FALSE(IsHalted(after.state()));
  ExpectRowsCanonical(id, 150, head());
  EXPECT_EQ(after.counters().applied(), (head() - 150 + 1) * 3);
  ExpectRefusalsKeptTheCursor(id);
  if (transport == handoff::v1::TRANSPORT_SSE) ExpectStreamsResumedFromCommittedCursors();
}

std::string CaseName(const ::testing::TestParamInfo<RefusalTest::ParamType>& info) {
  const char* paths[] = {"PollMidRun", "SseMidRun", "SseConnect"};
  return absl::StrCat(std::get<0>(info.param).name, "_",
                      paths[static_cast<int>(std::get<1>(info.param))]);
}

INSTANTIATE_TEST_SUITE_P(Table, RefusalTest,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(Path::kPollMidRun, Path::kSseMidRun,
                                                              Path::kSseConnect)),
                         CaseName);

// Rows the consumer's own configuration causes.
class ConfigRefusalTest : public ProviderRigTest,
                          public ::testing::WithParamInterface<handoff::v1::Transport> {
 protected:
  handoff::v1::Progress ExpectHalt(const std::string& id, SourceState state,
                                   absl::string_view reason_part) {
    handoff::v1::Progress p;
    EXPECT_TRUE(WaitFor(id, [&](const handoff::v1::Progress& pr) { return pr.state() == state; },
                        absl::Seconds(20), &p))
        << p.DebugString();
    EXPECT_TRUE(absl::StrContains(p.reason(), reason_part)) << p.reason();
    for (const std::string& text : PublicTexts(id)) {
      EXPECT_FALSE(absl::StrContains(text, kToken)) << text;
      EXPECT_FALSE(absl::StrContains(text, kWrongKey)) << text;
    }
    ExpectRefusalsKeptTheCursor(id);
    return p;
  }
};

TEST_P(ConfigRefusalTest, MissingTokenIs401AuthFailed) {
  handoff::v1::SourceSpec spec = Spec("noauth", GetParam(), 150);
  spec.clear_api_key();
  Create(spec);
  handoff::v1::Progress p = ExpectHalt("noauth", handoff::v1::SOURCE_STATE_AUTH_FAILED, "401");
  EXPECT_EQ(p.checkpoint().resume_cursor(), "150");
  EXPECT_FALSE(p.checkpoint().has_applied());
  std::vector<sim::RequestRecord> requests = sim().Requests();
  ASSERT_FALSE(requests.empty());
  EXPECT_FALSE(requests.back().had_authorization);
}

TEST_P(ConfigRefusalTest, WrongTokenIs403AuthFailed) {
  handoff::v1::SourceSpec spec = Spec("badauth", GetParam(), 150);
  spec.mutable_api_key()->set_env(kWrongKeyEnv);
  Create(spec);
  handoff::v1::Progress p = ExpectHalt("badauth", handoff::v1::SOURCE_STATE_AUTH_FAILED, "403");
  EXPECT_EQ(p.checkpoint().resume_cursor(), "150");
  std::vector<sim::RequestRecord> requests = sim().Requests();
  ASSERT_FALSE(requests.empty());
  EXPECT_TRUE(requests.back().had_authorization);
  EXPECT_FALSE(requests.back().authorized);
}

TEST_P(ConfigRefusalTest, BadRequestIs400ConfigInvalid) {
  handoff::v1::SourceSpec spec = Spec("badchain", GetParam(), 150);
  spec.set_chain("no-such-chain");
  Create(spec);
  handoff::v1::Progress p =
      ExpectHalt("badchain", handoff::v1::SOURCE_STATE_CONFIG_INVALID, "invalid_request");
  EXPECT_EQ(p.checkpoint().resume_cursor(), "150");
}

TEST_P(ConfigRefusalTest, CursorOfAnotherFilterIs409CursorMismatchConfigInvalid) {
  const std::string id = "mismatch";
  Create(Spec(id, GetParam(), 150));
  ASSERT_TRUE(WaitIdle(id));
  ASSERT_TRUE(manager().StopSource(id).ok());
  const handoff::v1::Progress before = Progress(id);
  // The adapter now sends another filter with the committed cursor (as a provider
  // alias or an edited deployment would): the cursor belongs to another source.
  filter_override_[id] = "some-other-filter";
  ASSERT_TRUE(manager().StartSource(id).ok());
  handoff::v1::Progress p =
      ExpectHalt(id, handoff::v1::SOURCE_STATE_CONFIG_INVALID, "cursor_mismatch");
  EXPECT_EQ(p.checkpoint().resume_cursor(), before.checkpoint().resume_cursor());
  EXPECT_EQ(p.checkpoint().checkpoint_version(), before.checkpoint().checkpoint_version());
  EXPECT_EQ(p.counters().applied(), before.counters().applied());
  ASSERT_FALSE(sim().Requests().empty());
  EXPECT_EQ(sim().Requests().back().status, 409);
}

// A page that breaks the contract stops the source for investigation.
TEST_P(ConfigRefusalTest, OutOfOrderItemsHaltAsProtocolViolation) {
  const std::string id = "disorder";
  Create(Spec(id, GetParam(), 150));
  ASSERT_TRUE(WaitIdle(id));
  const handoff::v1::Progress before = Progress(id);
  sim().ArmFault(Fault::kOutOfOrderItems);
  sim().chain().AddBlocks(5);
  handoff::v1::Progress p = ExpectHalt(id, handoff::v1::SOURCE_STATE_PROTOCOL_VIOLATION, "order");
  EXPECT_EQ(p.checkpoint().resume_cursor(), before.checkpoint().resume_cursor());
  EXPECT_EQ(p.checkpoint().applied_block(), before.checkpoint().applied_block());
  ExpectRowsCanonical(id, 150, 200);
}

INSTANTIATE_TEST_SUITE_P(Transports, ConfigRefusalTest,
                         ::testing::Values(handoff::v1::TRANSPORT_POLL, handoff::v1::TRANSPORT_SSE),
                         [](const ::testing::TestParamInfo<handoff::v1::Transport>& info) {
                           return std::string(info.param == handoff::v1::TRANSPORT_POLL ? "Poll"
                                                                                         : "Sse");
                         });

}  // namespace
}  // namespace handoff::tests
