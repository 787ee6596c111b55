// The one key-encoding module of the store.
//
// Every key starts with the source id and a NUL separator (ids are [a-z0-9-], so no id
// is a prefix of another's keys), then, where the column family is per position, a stage
// byte and the position as big-endian block and log index. Byte order is therefore
// source order, including positions above 2^32, so a range scan over a page's range
// visits its events in order.
//
//   sources:      <id>
//   checkpoints:  <id> 0x00 <stage>
//   rows:         <epoch:be64> <id> 0x00 <block:be64> <log_index:be64>
//                 (epoch >= 1, see RowKey; epoch 0 rows, written before schema 4, are
//                 keyed as outbox entries are)
//   row_segments: <id> 0x00 <block:be64> <log_index:be64> -> <epoch:be64>
//   outbox:       <id> 0x00 <block:be64> <log_index:be64>
//   receipts, quarantine, holds:
//                 <id> 0x00 <stage> <block:be64> <log_index:be64>
//   meta:         ascii names ("schema_version"; the floors "version_floor/<id>" and
//                 "hold_floor/<id>/<stage>/<block>:<log_index>", built in store.cc
//                 with the records they guard, store/README.md "Meta keys")
#ifndef HANDOFF_STORE_KEYS_H_
#define HANDOFF_STORE_KEYS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "store/position.h"

namespace handoff::store {

// Which consumer of a source a checkpoint, receipt or hold belongs to.
enum class Stage : uint8_t {
  kIngest = 1,    // the page procedure
  kDelivery = 2,  // the outbox dispatcher
};

namespace keys {

// The source's id prefix: "<id>\0". Every key of the source starts with it.
std::string SourcePrefix(absl::string_view source_id);

std::string Source(absl::string_view source_id);
std::string Checkpoint(absl::string_view source_id, Stage stage);

// rows and outbox.
std::string Positional(absl::string_view source_id, Position pos);
// receipts, quarantine and holds.
std::string Staged(absl::string_view source_id, Stage stage, Position pos);
// The same keys written over *out: the per-event form of the commit path, which reuses
// one buffer instead of allocating a key per event.
void AssignPositional(absl::string_view source_id, Position pos, std::string* out);
void AssignStaged(absl::string_view source_id, Stage stage, Position pos, std::string* out);
// The prefix of every staged key of (source, stage).
std::string StagePrefix(absl::string_view source_id, Stage stage);

// A row's key: its write epoch first, so that rows are keyed in the order they are
// written whichever source they belong to (store.h, "Row epochs"), then the positional
// key. Epoch 0 is the layout of rows written before schema 4: the positional key alone.
// Epoch keys begin with a zero byte (epochs stay below 2^56), which no source id does, so
// every epoch key sorts before every epoch-0 key.
std::string RowKey(uint64_t epoch, absl::string_view source_id, Position pos);
void AssignRowKey(uint64_t epoch, absl::string_view source_id, Position pos, std::string* out);
// The first key of epoch `epoch`'s rows of `source_id` and the key after its last.
std::string RowRangeBegin(uint64_t epoch, absl::string_view source_id);
std::string RowRangeEnd(uint64_t epoch, absl::string_view source_id);
// The epoch of a row key (0 for an epoch-0 key).
uint64_t RowKeyEpoch(absl::string_view row_key);
// The first key of epoch `epoch`, whatever the source: epoch keys of epochs below it sort
// before it. RowEpochPrefix(kMaxRowEpoch + 1) is the first key after every epoch key.
std::string RowEpochPrefix(uint64_t epoch);
inline constexpr uint64_t kMaxRowEpoch = (uint64_t{1} << 56) - 1;

// Decodes the position at the end of a positional, staged or row key.
absl::StatusOr<Position> DecodePosition(absl::string_view key);

// Appends `v` big-endian (8 bytes).
void AppendBigEndian64(std::string* out, uint64_t v);
uint64_t DecodeBigEndian64(const char* p);

// The smallest key greater than every key that starts with `prefix`.
std::string PrefixSuccessor(absl::string_view prefix);

}  // namespace keys
}  // namespace handoff::store

#endif  // HANDOFF_STORE_KEYS_H_
