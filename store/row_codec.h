// RowCodec: how an event row (handoff.v1.EventRow) is stored as a RocksDB value, in the
// rows and outbox column families.
//
// Rows are the bulk of every commit, so they are stored compactly: the hex text of the
// wire ("0x" + digits) as the bytes it spells (handoff.store.StoredRow, after a 0x00
// format byte). Measured with the bench's bare RocksDB loop: 652-byte rows (the text)
// 128-133k rows/s, 293-byte rows 223-249k rows/s on the same machine.
//
// Invariants:
//  - Lossless: DecodeRow(EncodeRow(r)) == r for every EventRow, whatever its text (a
//    field that is not canonical lowercase hex is kept verbatim).
//  - Values written before this format (a serialized EventRow, which never starts with
//    a 0x00 byte: that would be field number 0) still decode.
#ifndef HANDOFF_STORE_ROW_CODEC_H_
#define HANDOFF_STORE_ROW_CODEC_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "handoff/v1/source.pb.h"

namespace handoff::store {

// Appends the stored form of `row` to *out. Returns true when every hex field of `row`
// (block_hash, address, topics, data, transaction_hash) is canonical, "0x" followed by an
// even number of lowercase hex digits: their digits were then checked on the way, so a
// caller that must validate hex need not scan them again. False says only that some
// field is stored verbatim; whether it is hex at all is the caller's question.
bool AppendEncodedRow(const handoff::v1::EventRow& row, std::string* out);

// The stored form of `row`.
std::string EncodeRow(const handoff::v1::EventRow& row);

// Decodes a stored value into *row (cleared first). kDataLoss if it is unreadable.
absl::Status DecodeRow(absl::string_view value, handoff::v1::EventRow* row);

class StoredRow;

// Decodes stored values one after another, as DecodeRow does, reusing the parsed form's
// buffers: a scan that decodes many rows allocates them for its first row only (a fresh
// parse per row was ~8 heap blocks per row read; bench/HISTORY.md item 83). Holds the
// buffers of the largest row it decoded until destroyed: one per scan, not per process.
// Not thread-safe.
class RowDecoder {
 public:
  RowDecoder();
  ~RowDecoder();
  RowDecoder(const RowDecoder&) = delete;
  RowDecoder& operator=(const RowDecoder&) = delete;

  // As DecodeRow.
  absl::Status Decode(absl::string_view value, handoff::v1::EventRow* row);

 private:
  std::unique_ptr<StoredRow> stored_;
};

}  // namespace handoff::store

#endif  // HANDOFF_STORE_ROW_CODEC_H_
