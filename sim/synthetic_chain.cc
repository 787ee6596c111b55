#include "sim/synthetic_chain.h"

#include <algorithm>
#include <cmath>

namespace handoff::sim {

SyntheticChain::SyntheticChain(ChainOptions options, absl::Time start)
    : options_(options), renderer_(options.seed), start_(start), rng_(Mix64(options.seed)) {
  head_ = std::max(options_.initial_head, options_.genesis);
  versions_.assign(head_ - options_.genesis + 1, 0);
}

void SyntheticChain::AdvanceTo(absl::Time now) {
  if (options_.blocks_per_second <= 0) return;
  double elapsed = absl::ToDoubleSeconds(now - start_);
  if (elapsed < 0) return;
  uint64_t target = std::max(options_.initial_head, options_.genesis) +
                    static_cast<uint64_t>(elapsed * options_.blocks_per_second);
  absl::MutexLock lock(&mu_);
  if (target > head_) AddBlocksLocked(target - head_);
}

void SyntheticChain::AddBlocks(uint64_t count) {
  absl::MutexLock lock(&mu_);
  AddBlocksLocked(count);
}

void SyntheticChain::AddBlocksLocked(uint64_t count) {
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (uint64_t i = 0; i < count; ++i) {
    ++head_;
    versions_.push_back(static_cast<uint32_t>(epoch_));
    if (options_.reorg_probability > 0 && coin(rng_) < options_.reorg_probability) {
      ReorgLocked(options_.reorg_depth).IgnoreError();
    }
  }
  if (count > 0) ++changes_;
}

absl::StatusOr<uint64_t> SyntheticChain::Reorg(uint32_t depth) {
  absl::MutexLock lock(&mu_);
  return ReorgLocked(depth);
}

absl::StatusOr<uint64_t> SyntheticChain::ReorgLocked(uint32_t depth) {
  ChainView view = ViewLocked();
  uint64_t lowest = view.finalized ? *view.finalized + 1 : options_.genesis;
  if (depth == 0 || lowest > head_) {
    return absl::FailedPreconditionError("no non-final block to reorganise");
  }
  uint64_t fork = head_ + 1 >= depth ? head_ + 1 - depth : 0;
  fork = std::max(fork, lowest);
  ++epoch_;
  for (uint64_t b = fork; b <= head_; ++b) {
    versions_[b - options_.genesis] = static_cast<uint32_t>(epoch_);
  }
  reorgs_.emplace_back(epoch_, fork);
  ++changes_;
  return fork;
}

ChainView SyntheticChain::ViewLocked() const {
  ChainView v;
  v.head = head_;
  v.epoch = epoch_;
  if (head_ >= options_.genesis + options_.safe_lag) v.safe = head_ - options_.safe_lag;
  if (head_ >= options_.genesis + options_.finality_lag) {
    v.finalized = head_ - options_.finality_lag;
  }
  return v;
}

ChainView SyntheticChain::View() const {
  absl::ReaderMutexLock lock(&mu_);
  return ViewLocked();
}

uint64_t SyntheticChain::ChangeCount() const {
  absl::ReaderMutexLock lock(&mu_);
  return changes_;
}

PageContent SyntheticChain::BuildPage(CursorPosition cursor, uint32_t limit,
                                      PageFaults faults) const {
  absl::ReaderMutexLock lock(&mu_);
  PageContent page;
  page.view = ViewLocked();
  uint64_t start = std::max(cursor.block, options_.genesis);
  // The lowest fork of the reorgs this client has not seen.
  for (auto it = reorgs_.rbegin(); it != reorgs_.rend() && it->first > cursor.epoch; ++it) {
    if (it->second < start) {
      start = it->second;
      page.reorg = true;
    }
  }
  // Only a page with something new overlaps: at the head the unaltered page is empty,
  // and an overlap there would repeat applied blocks under the request cursor itself
  // (items with a cursor that does not advance, which breaks the contract). Found by
  // tests/torture.
  const uint64_t unshifted = start;
  if (faults.overlap && !page.reorg && start <= head_) {
    start = std::max(options_.genesis, start >= 2 ? start - 2 : 0);
  }
  page.from = start;
  page.next = CursorPosition{start, page.view.epoch};
  if (page.view.safe) page.safe_hash = renderer_.BlockHash(*page.view.safe, VersionLocked(*page.view.safe));
  if (page.view.finalized) {
    page.finalized_hash =
        renderer_.BlockHash(*page.view.finalized, VersionLocked(*page.view.finalized));
  }
  if (start > head_) return page;  // nothing new yet
  uint64_t per_block = options_.logs_per_block;
  uint64_t blocks = per_block == 0 ? options_.max_blocks_per_page
                                   : std::max<uint64_t>(1, limit / per_block);
  blocks = std::min<uint64_t>(blocks, std::max<uint32_t>(1, options_.max_blocks_per_page));
  // An overlapping page still advances: its span counts from the unshifted start (counted
  // from the shifted one, a page of at most two blocks ended just below the cursor: items
  // with next == the request cursor). Found by tests/provider:long_run_test.
  uint64_t through = std::min(head_, unshifted + blocks - 1);
  // A correction covers at least everything the client applied.
  if (page.reorg && cursor.block > 0) through = std::max(through, std::min(head_, cursor.block - 1));
  page.through = through;
  page.through_hash = renderer_.BlockHash(through, VersionLocked(through));
  page.next = CursorPosition{through + 1, page.view.epoch};
  // A rendered log is 700-800 bytes; reserving short would copy the page as it grows.
  page.items_json.reserve((through - start + 1) * per_block * 1024);
  bool comma = false;
  for (uint64_t b = start; b <= through; ++b) {
    uint32_t version = VersionLocked(b);
    if (faults.swap_items && b == start && per_block >= 2) {
      renderer_.AppendLogJson(b, version, 1, &page.items_json);
      page.items_json.push_back(',');
      renderer_.AppendLogJson(b, version, 0, &page.items_json);
      for (uint32_t i = 2; i < per_block; ++i) {
        page.items_json.push_back(',');
        renderer_.AppendLogJson(b, version, i, &page.items_json);
      }
      comma = true;
    } else if (per_block > 0) {
      renderer_.AppendBlockLogsJson(b, version, options_.logs_per_block, comma,
                                    &page.items_json);
      comma = true;
    }
    page.item_count += options_.logs_per_block;
  }
  return page;
}

std::vector<handoff::v1::EventRow> SyntheticChain::Canonical(uint64_t from, uint64_t to) const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<handoff::v1::EventRow> out;
  from = std::max(from, options_.genesis);
  to = std::min(to, head_);
  for (uint64_t b = from; b <= to; ++b) {
    for (uint32_t i = 0; i < options_.logs_per_block; ++i) {
      out.push_back(renderer_.Log(b, VersionLocked(b), i));
    }
  }
  return out;
}

std::string SyntheticChain::CanonicalJson(uint64_t from, uint64_t to, uint32_t* count) const {
  absl::ReaderMutexLock lock(&mu_);
  std::string out;
  *count = 0;
  from = std::max(from, options_.genesis);
  to = std::min(to, head_);
  for (uint64_t b = from; b <= to; ++b) {
    renderer_.AppendBlockLogsJson(b, VersionLocked(b), options_.logs_per_block, *count > 0,
                                  &out);
    *count += options_.logs_per_block;
  }
  return out;
}

std::string SyntheticChain::BlockHash(uint64_t block) const {
  absl::ReaderMutexLock lock(&mu_);
  if (block < options_.genesis || block > head_) return "";
  return renderer_.BlockHash(block, VersionLocked(block));
}

bool SyntheticChain::WaitForChange(uint64_t seen, absl::Time deadline,
                                   const std::atomic<bool>* stop) {
  while (true) {
    absl::Time now = absl::Now();
    AdvanceTo(now);
    absl::Time wake = deadline;
    if (options_.blocks_per_second > 0) {
      double s = absl::ToDoubleSeconds(now - start_);
      double next = (std::floor(s * options_.blocks_per_second) + 1) / options_.blocks_per_second;
      wake = std::min(wake, start_ + absl::Seconds(next));
    }
    absl::MutexLock lock(&mu_);
    WaitArgs args{this, seen, stop};
    mu_.AwaitWithDeadline(absl::Condition(&ChangedOrStopped, &args), wake);
    if (changes_ != seen) return true;
    if (stop != nullptr && stop->load()) return false;
    if (absl::Now() >= deadline) return false;
  }
}

bool SyntheticChain::ChangedOrStopped(WaitArgs* args) {
  return args->chain->changes_ != args->seen ||
         (args->stop != nullptr && args->stop->load());
}

void SyntheticChain::Touch() {
  absl::MutexLock lock(&mu_);
  ++changes_;
}

void SyntheticChain::Poke() { absl::MutexLock lock(&mu_); }

}  // namespace handoff::sim
