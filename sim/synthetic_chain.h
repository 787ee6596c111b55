// SyntheticChain: the simulator's deterministic, seeded chain with reorgs.
//
// Blocks genesis..head exist; each has a version (the epoch in which it was last
// produced) and logs_per_block logs rendered by LogRenderer from (block, version). The
// head grows with time (blocks_per_second) or by AddBlocks; a reorg (random, per new
// block, or on demand) gives the last N non-final blocks new versions and bumps the
// epoch. A client cursor (block, epoch) whose epoch predates a reorg whose fork block is
// below the cursor's block has applied orphaned blocks: its next page is a correction
// page (reorg: true) starting at that fork block and covering at least what it applied.
//
// Invariants: blocks at or below `finalized` never change version; a page always covers
// whole blocks (all logs of every block in [from, through]); the canonical chain is what
// the latest versions render. Thread-safe (one mutex; rendering holds a reader lock).
#ifndef HANDOFF_SIM_SYNTHETIC_CHAIN_H_
#define HANDOFF_SIM_SYNTHETIC_CHAIN_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "handoff/v1/source.pb.h"
#include "sim/cursor.h"
#include "sim/log_render.h"

namespace handoff::sim {

struct ChainOptions {
  uint64_t seed = 1;
  uint64_t genesis = 0;
  // Blocks genesis..initial_head exist at start ("instant" mode when blocks_per_second
  // is 0: nothing else appears unless AddBlocks is called).
  uint64_t initial_head = 1000;
  double blocks_per_second = 0;
  uint32_t logs_per_block = 10;
  uint32_t safe_lag = 6;
  uint32_t finality_lag = 32;
  // Chance, per newly produced block, of a reorg of reorg_depth blocks.
  double reorg_probability = 0;
  uint32_t reorg_depth = 3;
  // Block span cap for pages of empty blocks.
  uint32_t max_blocks_per_page = 1000;
};

struct ChainView {
  uint64_t head = 0;
  uint64_t epoch = 0;
  std::optional<uint64_t> safe;
  std::optional<uint64_t> finalized;
};

// What one page covers, decided from a snapshot of the chain.
struct PageContent {
  ChainView view;
  uint64_t from = 0;
  std::optional<uint64_t> through;  // none: nothing to serve yet
  std::string through_hash, safe_hash, finalized_hash;
  bool reorg = false;
  CursorPosition next;            // where the following page starts
  std::string items_json;         // comma-separated log objects
  uint32_t item_count = 0;
};

struct PageFaults {
  bool overlap = false;        // start two blocks before the cursor
  bool swap_items = false;     // first two items out of order
};

class SyntheticChain {
 public:
  explicit SyntheticChain(ChainOptions options, absl::Time start = absl::Now());

  const ChainOptions& options() const { return options_; }
  const LogRenderer& renderer() const { return renderer_; }

  // Produces the blocks due at `now` (no-op when blocks_per_second is 0).
  void AdvanceTo(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  void AddBlocks(uint64_t count) ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces the last min(depth, non-final blocks) blocks. Returns the fork block, or
  // kFailedPrecondition when every block is final.
  absl::StatusOr<uint64_t> Reorg(uint32_t depth) ABSL_LOCKS_EXCLUDED(mu_);

  ChainView View() const ABSL_LOCKS_EXCLUDED(mu_);
  // Bumped by every change (new blocks, reorg).
  uint64_t ChangeCount() const ABSL_LOCKS_EXCLUDED(mu_);

  // The page for a client at `cursor`, at most `limit` items (whole blocks; a single
  // block or a correction's applied range may exceed it).
  PageContent BuildPage(CursorPosition cursor, uint32_t limit, PageFaults faults = {}) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The canonical logs of blocks [from, min(to, head)], in position order.
  std::vector<handoff::v1::EventRow> Canonical(uint64_t from, uint64_t to) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same as JSON log objects, comma-separated.
  std::string CanonicalJson(uint64_t from, uint64_t to, uint32_t* count) const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::string BlockHash(uint64_t block) const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until ChangeCount() != seen, `*stop`, or `deadline` (advancing with time).
  // Returns whether the chain changed.
  bool WaitForChange(uint64_t seen, absl::Time deadline, const std::atomic<bool>* stop)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Counts as a change without changing anything: waiting streams re-check their faults.
  void Touch() ABSL_LOCKS_EXCLUDED(mu_);
  // Wakes WaitForChange callers so that they re-check `stop`.
  void Poke() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct WaitArgs {
    const SyntheticChain* chain;
    uint64_t seen;
    const std::atomic<bool>* stop;
  };
  // REQUIRES: mu_ held (called by Mutex::Await).
  static bool ChangedOrStopped(WaitArgs* args) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void AddBlocksLocked(uint64_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint64_t> ReorgLocked(uint32_t depth) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ChainView ViewLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint32_t VersionLocked(uint64_t block) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return versions_[block - options_.genesis];
  }

  // Constant after construction.
  const ChainOptions options_;
  const LogRenderer renderer_;
  const absl::Time start_;

  mutable absl::Mutex mu_;
  std::vector<uint32_t> versions_ ABSL_GUARDED_BY(mu_);  // index: block - genesis
  uint64_t head_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // (epoch after the reorg, fork block), in epoch order.
  std::vector<std::pair<uint64_t, uint64_t>> reorgs_ ABSL_GUARDED_BY(mu_);
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace handoff::sim

#endif  // HANDOFF_SIM_SYNTHETIC_CHAIN_H_
