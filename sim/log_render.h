// LogRenderer: the deterministic synthetic logs of the provider simulator.
//
// A log is a pure function of (seed, block number, block version, log index): the same
// inputs always give the same JSON text and the same EventRow, so the simulator never
// stores logs, a reorg (a new block version) gives every position a new identity, and a
// test can recompute what any page must contain. Rendering only copies slices of a hex
// pool made once from the seed, so it costs about a memcpy per log.
//
// Invariant: block hashes are unique per (block, version); JSON and EventRow forms of a
// log always agree. Immutable after construction, so thread-safe.
#ifndef HANDOFF_SIM_LOG_RENDER_H_
#define HANDOFF_SIM_LOG_RENDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "handoff/v1/source.pb.h"

namespace handoff::sim {

// splitmix64's finaliser: a bijection on 64-bit values.
uint64_t Mix64(uint64_t x);

class LogRenderer {
 public:
  explicit LogRenderer(uint64_t seed);

  // "0x" + 64 hex digits, unique for each (block, version).
  std::string BlockHash(uint64_t block, uint32_t version) const;

  // Appends the JSON object of one log (no separators).
  void AppendLogJson(uint64_t block, uint32_t version, uint32_t log_index,
                     std::string* out) const;

  // Appends `count` logs of a block, comma-separated (a leading comma when `comma`).
  void AppendBlockLogsJson(uint64_t block, uint32_t version, uint32_t count, bool comma,
                           std::string* out) const;

  handoff::v1::EventRow Log(uint64_t block, uint32_t version, uint32_t log_index) const;

 private:
  struct Fields;
  Fields Make(uint64_t block, uint32_t version, uint32_t log_index) const;
  // `block_hash`: the 64 digits of BlockHash(f.block, f.version) without "0x".
  void AppendLogJson(const Fields& f, const char* block_hash, std::string* out) const;
  void AppendHex64(uint64_t block, uint32_t version, uint64_t salt, std::string* out) const;
  // The 64 hex digits of AppendHex64 into digits[0, 64).
  void WriteHex64(uint64_t block, uint32_t version, uint64_t salt, char* digits) const;

  const uint64_t seed_;
  std::string pool_;  // random hex digits
  std::vector<std::string> addresses_;
  std::vector<std::string> event_topics_;
};

}  // namespace handoff::sim

#endif  // HANDOFF_SIM_LOG_RENDER_H_
