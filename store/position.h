// Position: where an event sits in its source's total order, (block number, log index).
//
// Positions compare lexicographically. They are event coordinates, never provider
// cursors: cursors are opaque and are never compared or incremented.
#ifndef HANDOFF_STORE_POSITION_H_
#define HANDOFF_STORE_POSITION_H_

#include <cstdint>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace handoff {

struct Position {
  uint64_t block = 0;
  uint64_t log_index = 0;

  friend bool operator==(const Position& a, const Position& b) {
    return a.block == b.block && a.log_index == b.log_index;
  }
  friend bool operator!=(const Position& a, const Position& b) { return !(a == b); }
  friend bool operator<(const Position& a, const Position& b) {
    return std::tie(a.block, a.log_index) < std::tie(b.block, b.log_index);
  }
  friend bool operator<=(const Position& a, const Position& b) { return !(b < a); }
  friend bool operator>(const Position& a, const Position& b) { return b < a; }
  friend bool operator>=(const Position& a, const Position& b) { return !(a < b); }

  std::string DebugString() const { return absl::StrCat(block, ":", log_index); }

  // The first position of `block`.
  static Position BlockStart(uint64_t block) { return Position{block, 0}; }
};

}  // namespace handoff

#endif  // HANDOFF_STORE_POSITION_H_
