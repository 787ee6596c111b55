#include "store/keys.h"

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace handoff::store::keys {

void AppendBigEndian64(std::string* out, uint64_t v) {
  char buf[8];
  for (int i = 7; i >= 0; --i) {
    buf[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  out->append(buf, 8);
}

uint64_t DecodeBigEndian64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string SourcePrefix(absl::string_view source_id) {
  std::string k(source_id);
  k.push_back('\0');
  return k;
}

std::string Source(absl::string_view source_id) { return std::string(source_id); }

std::string Checkpoint(absl::string_view source_id, Stage stage) {
  std::string k = SourcePrefix(source_id);
  k.push_back(static_cast<char>(stage));
  return k;
}

namespace {

// The one layout of a per-event key: "<id>\0", the stage byte for staged families,
// then the position big-endian (so keys sort in source order).
void AssignEventKey(absl::string_view source_id, std::optional<Stage> stage, Position pos,
                    std::string* out) {
  out->clear();
  out->reserve(source_id.size() + 2 + 16);
  out->append(source_id.data(), source_id.size());
  out->push_back('\0');
  if (stage.has_value()) out->push_back(static_cast<char>(*stage));
  AppendBigEndian64(out, pos.block);
  AppendBigEndian64(out, pos.log_index);
}

}  // namespace

void AssignPositional(absl::string_view source_id, Position pos, std::string* out) {
  AssignEventKey(source_id, std::nullopt, pos, out);
}

std::string Positional(absl::string_view source_id, Position pos) {
  std::string k;
  AssignPositional(source_id, pos, &k);
  return k;
}

void AssignRowKey(uint64_t epoch, absl::string_view source_id, Position pos, std::string* out) {
  if (epoch == 0) {
    AssignEventKey(source_id, std::nullopt, pos, out);
    return;
  }
  out->clear();
  out->reserve(8 + source_id.size() + 1 + 16);
  AppendBigEndian64(out, epoch);
  out->append(source_id.data(), source_id.size());
  out->push_back('\0');
  AppendBigEndian64(out, pos.block);
  AppendBigEndian64(out, pos.log_index);
}

std::string RowKey(uint64_t epoch, absl::string_view source_id, Position pos) {
  std::string k;
  AssignRowKey(epoch, source_id, pos, &k);
  return k;
}

std::string RowRangeBegin(uint64_t epoch, absl::string_view source_id) {
  std::string k = epoch == 0 ? std::string() : RowEpochPrefix(epoch);
  k.append(source_id.data(), source_id.size());
  k.push_back('\0');
  return k;
}

std::string RowRangeEnd(uint64_t epoch, absl::string_view source_id) {
  return PrefixSuccessor(RowRangeBegin(epoch, source_id));
}

uint64_t RowKeyEpoch(absl::string_view row_key) {
  if (row_key.size() < 8 || row_key[0] != '\0') return 0;
  return DecodeBigEndian64(row_key.data());
}

std::string RowEpochPrefix(uint64_t epoch) {
  std::string k;
  AppendBigEndian64(&k, epoch);
  return k;
}

std::string StagePrefix(absl::string_view source_id, Stage stage) {
  std::string k = SourcePrefix(source_id);
  k.push_back(static_cast<char>(stage));
  return k;
}

void AssignStaged(absl::string_view source_id, Stage stage, Position pos, std::string* out) {
  AssignEventKey(source_id, stage, pos, out);
}

std::string Staged(absl::string_view source_id, Stage stage, Position pos) {
  std::string k;
  AssignStaged(source_id, stage, pos, &k);
  return k;
}

absl::StatusOr<Position> DecodePosition(absl::string_view key) {
  if (key.size() < 17) {
    return absl::DataLossError(absl::StrCat("key too short for a position: ", key.size(), " bytes"));
  }
  const char* p = key.data() + key.size() - 16;
  return Position{DecodeBigEndian64(p), DecodeBigEndian64(p + 8)};
}

std::string PrefixSuccessor(absl::string_view prefix) {
  std::string s(prefix);
  while (!s.empty()) {
    unsigned char c = static_cast<unsigned char>(s.back());
    if (c != 0xff) {
      s.back() = static_cast<char>(c + 1);
      return s;
    }
    s.pop_back();
  }
  return s;  // empty: no upper bound
}

}  // namespace handoff::store::keys
