// The test rig of tests/provider: the real engine against the provider simulator.
//
// A "process" is a Store on disk plus a SourceManager whose workers really run; its
// provider factory builds the production adapter (consumer::HttpProvider) from the
// SourceSpec the way server/factories.cc does (API key from the environment variable
// the spec names), wrapped in a RecordingProvider that journals every Fetch the engine
// makes and what came back. The simulator (sim::ProviderSim, loopback, port 0) lives
// outside the process and survives Restart().
//
// Synchronisation is by observable conditions only: WaitFor() blocks in WaitProgress
// (woken by every progress change) until a predicate holds or a deadline passes; the
// simulator produces blocks only when a test asks it to (AddBlocks, Reorg).
#ifndef HANDOFF_TESTS_PROVIDER_RIG_H_
#define HANDOFF_TESTS_PROVIDER_RIG_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "consumer/backoff.h"
#include "consumer/observer.h"
#include "consumer/page_budget.h"
#include "consumer/provider.h"
#include "consumer/source_manager.h"
#include "gtest/gtest.h"
#include "handoff/v1/source.pb.h"
#include "sim/provider_sim.h"
#include "store/store.h"

namespace handoff::tests {

// The bearer token the simulator requires, and the variables specs name it by.
inline constexpr char kToken[] = "sim-bearer-T0KEN-4d1e";
inline constexpr char kKeyEnv[] = "HANDOFF_PROVIDER_TEST_KEY";
inline constexpr char kWrongKeyEnv[] = "HANDOFF_PROVIDER_TEST_WRONG_KEY";
inline constexpr char kWrongKey[] = "not-the-right-token";

// One Fetch as the engine made it.
struct FetchRecord {
  std::string cursor;  // the committed cursor the engine passed
  absl::Time started;
  absl::Time ended;
  bool is_page = false;
  // Page fields.
  uint64_t from = 0;
  bool has_through = false;
  uint64_t through = 0;
  std::string next;
  bool reorg = false;
  size_t items = 0;
  bool has_finalized = false;
  uint64_t finalized = 0;
  // Refusal fields.
  consumer::RefusalKind kind = consumer::RefusalKind::kTransient;
  int http_status = 0;
  std::string code;
  std::optional<absl::Duration> retry_after;
};

class Journal {
 public:
  void Add(const std::string& id, FetchRecord r) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<FetchRecord> Of(const std::string& id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Every cursor the engine passed to Fetch, any source.
  std::vector<std::string> AllCursors() const ABSL_LOCKS_EXCLUDED(mu_);
  // When the engine first passed `cursor` to Fetch (any source), if it did.
  std::optional<absl::Time> FirstFetchOf(const std::string& cursor) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::vector<FetchRecord>> records_ ABSL_GUARDED_BY(mu_);
};

// Decorates the real adapter: forwards everything, journals each Fetch.
class RecordingProvider : public consumer::ProviderDecorator {
 public:
  RecordingProvider(std::unique_ptr<consumer::Provider> inner, Journal* journal, std::string id)
      : ProviderDecorator(std::move(inner)), journal_(journal), id_(std::move(id)) {}
  consumer::FetchResult Fetch(const std::string& committed_cursor) override;

 private:
  Journal* const journal_;
  const std::string id_;
};

// Everything the engine tells its observer (what logs and metrics would see).
class RecordingObserver : public consumer::EngineObserver {
 public:
  struct StateChange {
    std::string id;
    handoff::v1::SourceState state;
    std::string reason;
  };
  void OnRefusal(absl::string_view id, absl::string_view code) override ABSL_LOCKS_EXCLUDED(mu_);
  void OnStateChange(absl::string_view id, handoff::v1::SourceState state,
                     absl::string_view reason) override ABSL_LOCKS_EXCLUDED(mu_);
  void OnError(absl::string_view id, const absl::Status& status) override ABSL_LOCKS_EXCLUDED(mu_);
  void OnCorrection(absl::string_view id, uint64_t depth) override ABSL_LOCKS_EXCLUDED(mu_);

  // Every text the observer received (reasons, error messages, refusal codes).
  std::vector<std::string> Texts() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<StateChange> States(const std::string& id) const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::string> Refusals(const std::string& id) const ABSL_LOCKS_EXCLUDED(mu_);
  bool SawState(const std::string& id, handoff::v1::SourceState state) const;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> texts_ ABSL_GUARDED_BY(mu_);
  std::vector<StateChange> states_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::string>> refusals_ ABSL_GUARDED_BY(mu_);
};

// The simulator options most tests use: an instant chain of 200 blocks with 3 logs each,
// finality 20 blocks behind the head, a bearer token, short heartbeats and delays.
sim::ProviderSimOptions DefaultSimOptions();

class ProviderRigTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // (Re)starts the simulator with `options` (a new instance; port 0 unless `port`).
  void StartSim(sim::ProviderSimOptions options, int port = 0);
  // Opens the store and the manager and recovers the sources.
  void Open();
  // A process restart: manager and store closed, reopened from disk, sources recovered.
  void Restart();

  consumer::SourceManager& manager() { return *manager_; }
  sim::ProviderSim& sim() { return *sim_; }
  uint64_t head() { return sim_->chain().View().head; }

  handoff::v1::SourceSpec Spec(const std::string& id, handoff::v1::Transport transport,
                               uint64_t start_block, uint32_t page_limit = 30);
  void Create(const handoff::v1::SourceSpec& spec);

  // Waits on progress changes until `done` holds; the last snapshot seen in `*last`.
  bool WaitFor(const std::string& id, const std::function<bool(const handoff::v1::Progress&)>& done,
               absl::Duration timeout = absl::Seconds(20), handoff::v1::Progress* last = nullptr);
  // Caught up to the simulator's head (every block holds logs): applied block and tip
  // both equal the head, in a running (or idle backing-off) state.
  bool WaitCaughtUp(const std::string& id, absl::Duration timeout = absl::Seconds(20));
  // Caught up and idle: the last fetch was a non-advancing empty page (polling: no
  // prefetch in flight; SSE: the stream waits for blocks).
  bool WaitIdle(const std::string& id, absl::Duration timeout = absl::Seconds(20));
  handoff::v1::Progress Progress(const std::string& id);

  // Every materialized row of the source, through QueryEvents pages.
  std::vector<handoff::v1::EventRow> Rows(const std::string& id);
  // The rows equal the simulator's canonical chain over [from, to], field for field.
  void ExpectRowsCanonical(const std::string& id, uint64_t from, uint64_t to);
  // Across every refusal the engine saw, the next Fetch asked for the same cursor.
  void ExpectRefusalsKeptTheCursor(const std::string& id);
  // Every SSE (re)connection carried a Last-Event-ID that the engine had passed to
  // Fetch (a durable cursor), never "latest".
  void ExpectStreamsResumedFromCommittedCursors();
  std::vector<sim::RequestRecord> StreamRequests();
  // Texts the operator-facing surfaces carry for a source other than funding_action.
  std::vector<std::string> PublicTexts(const std::string& id);

  std::string dir_;
  std::unique_ptr<sim::ProviderSim> sim_;
  Journal journal_;
  RecordingObserver observer_;
  // Adapter knobs read by the factory when a worker starts.
  absl::Duration sse_silence_ = absl::Seconds(60);
  std::map<std::string, std::string> filter_override_;  // source id -> filter sent
  absl::Duration fetch_backoff_initial_ = absl::Milliseconds(5);
  absl::Duration fetch_backoff_max_ = absl::Milliseconds(50);
  // The wait after a nothing-new page; unset: the fetch backoff above (short, so that
  // tests need not wait through the production idle backoff).
  std::optional<consumer::BackoffPolicy> idle_backoff_;
  // The PageBudget every adapter shares, as handoffd's; nullptr: each its own, uncapped.
  std::shared_ptr<consumer::PageBudget> page_budget_;

  std::unique_ptr<store::Store> store_;
  std::unique_ptr<consumer::SourceManager> manager_;
};

bool IsHalted(handoff::v1::SourceState s);

}  // namespace handoff::tests

#endif  // HANDOFF_TESTS_PROVIDER_RIG_H_
