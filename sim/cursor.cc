#include "sim/cursor.h"

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "sim/log_render.h"

namespace handoff::sim {

uint64_t SourceBinding(absl::string_view chain, absl::string_view source,
                       absl::string_view filter) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the three fields, NUL separated
  for (absl::string_view part : {chain, source, filter}) {
    for (char c : part) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
    h = (h ^ 0) * 0x100000001b3ULL;
  }
  return Mix64(h);
}

uint64_t CursorCodec::Check(uint64_t binding, CursorPosition p) const {
  return Mix64(Mix64(secret_ ^ binding) ^ Mix64(p.block) ^ Mix64(~p.epoch));
}

std::string CursorCodec::Encode(uint64_t binding, CursorPosition p) const {
  std::string raw = absl::StrCat("c:", p.block, ":", p.epoch, ":",
                                 absl::Hex(Check(binding, p), absl::kZeroPad16));
  std::string out;
  absl::WebSafeBase64Escape(raw, &out);
  return out;
}

absl::StatusOr<CursorPosition> CursorCodec::Decode(uint64_t binding,
                                                   absl::string_view cursor) const {
  std::string raw;
  if (cursor.size() > 200 || !absl::WebSafeBase64Unescape(cursor, &raw)) {
    return absl::InvalidArgumentError("malformed cursor");
  }
  std::vector<absl::string_view> parts = absl::StrSplit(raw, ':');
  CursorPosition p;
  uint64_t check = 0;
  if (parts.size() != 4 || parts[0] != "c" || !absl::SimpleAtoi(parts[1], &p.block) ||
      !absl::SimpleAtoi(parts[2], &p.epoch) || parts[3].size() != 16 ||
      !absl::SimpleHexAtoi(parts[3], &check)) {
    return absl::InvalidArgumentError("malformed cursor");
  }
  if (check != Check(binding, p)) {
    return absl::FailedPreconditionError("cursor belongs to another chain, source or filter");
  }
  return p;
}

}  // namespace handoff::sim
