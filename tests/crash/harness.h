// Harness for the crash-injection suite: one source, a scripted provider, optional
// external sink, driven page by page on the test thread (deterministic), with
// Crash(): abandon everything in flight, close the database, and reopen it from disk in
// a fresh engine.
#ifndef HANDOFF_TESTS_CRASH_HARNESS_H_
#define HANDOFF_TESTS_CRASH_HARNESS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "consumer/page_attempt.h"
#include "consumer/source_manager.h"
#include "consumer/source_worker.h"
#include "consumer/testing/fakes.h"
#include "rocksdb/env.h"
#include "store/fault_injection_fs.h"
#include "store/store.h"

namespace handoff::tests {

struct HarnessOptions {
  bool external_sink = false;  // IMMEDIATE EventSink deliveries through FakeSink
  int sink_batch = 1;
  int events_per_step = 1;     // 1: each event commits on its own
  bool fuse_barrier = false;   // false: the barrier is a step of its own
  handoff::v1::RejectionPolicy on_rejection = handoff::v1::REJECTION_POLICY_QUARANTINE;
  uint32_t max_attempts = 3;
  uint32_t initial_backoff_ms = 1;
  uint64_t start_block = 100;
};

// A scripted chain of pages: cursor "<start>" serves pages[0], whose next is "c1", etc.
// The last page's next cursor serves an empty page (nothing new).
struct Script {
  std::vector<consumer::Page> pages;
  // cursor that requests pages[i]
  std::vector<std::string> cursors;
};

class Harness {
 public:
  Harness(std::string dir, HarnessOptions options);
  ~Harness();

  // Opens the database and the manager; creates the source on first open.
  void Open();
  // A crash: the worker in flight is abandoned (already returned kCrashed), nothing is
  // cleaned up, and the machine loses power: nothing more reaches the disk, the database
  // is closed, every file loses what was not synced (FaultInjectionFs), and Open()
  // reopens it. The harness commits every step synced, so the checkpoint must come back
  // as it was: lost_on_crash() says what a crash lost ("" when nothing).
  void Crash();
  const std::string& lost_on_crash() const { return lost_on_crash_; }

  // Loads pages into the provider: pages[i] served at cursors[i].
  void Load(const Script& script);

  // One page attempt from the durable checkpoint (or resumes a blocked attempt).
  consumer::PageAttempt::Result Step();
  // Steps until nothing new, a crash, a block or a halt. Returns the last result.
  consumer::PageAttempt::Result RunUntilIdle(int max_steps = 10000);

  store::CheckpointRecord Checkpoint();
  std::map<Position, std::string> Rows();  // position -> block hash
  std::vector<handoff::v1::Hold> Holds();
  absl::StatusOr<handoff::v1::ResolveHoldResponse> Resolve(Position pos,
                                                          handoff::v1::HoldDecision decision);

  consumer::testing::FakeProvider& provider() { return *provider_; }
  consumer::testing::FakeSink& sink() { return *sink_; }
  store::Store* store() { return store_.get(); }
  consumer::SourceManager* manager() { return manager_.get(); }
  const handoff::v1::SourceSpec& spec() const { return spec_; }
  const std::string& id() const { return spec_.id(); }

 private:
  const std::string dir_;
  const HarnessOptions options_;
  handoff::v1::SourceSpec spec_;
  // The provider and the sink live outside the process: they survive crashes.
  std::unique_ptr<consumer::testing::FakeProvider> provider_;
  std::unique_ptr<consumer::testing::FakeSink> sink_;
  // The disk: survives crashes, loses unsynced data at each (power loss).
  std::shared_ptr<store::FaultInjectionFs> fs_;
  std::unique_ptr<rocksdb::Env> env_;
  std::string lost_on_crash_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<consumer::testing::CountingEffect> effect_;
  std::unique_ptr<consumer::SourceManager> manager_;
  std::unique_ptr<consumer::PageAttempt> blocked_;
  std::atomic<bool> cancelled_{false};
};

// The derived rows a correct consumer holds after applying pages[0..k) (the contract's
// delete-and-insert rule).
std::map<Position, std::string> ModelAfter(const Script& script, size_t k);

// Checks the invariants of the durable state against the script. Returns "" when they
// hold, else a description of the violation.
std::string CheckInvariants(Harness& h, const Script& script);

// Asserts the end state: the checkpoint is past the last page, and the rows equal the
// model after every page.
std::string CheckComplete(Harness& h, const Script& script);

}  // namespace handoff::tests

#endif  // HANDOFF_TESTS_CRASH_HARNESS_H_
