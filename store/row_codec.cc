#include "store/row_codec.h"

#include <cstdint>

#include "store/records.pb.h"

namespace handoff::store {
namespace {

// The first byte of a value in the StoredRow format (a serialized EventRow never starts
// with it: its first byte is a tag, and field number 0 does not exist).
constexpr char kStoredRowFormat = '\0';

// StoredRow's field numbers and `verbatim` bits (store/records.proto).
enum Field : uint32_t {
  kBlockNumber = 1,
  kLogIndex = 2,
  kBlockHash = 3,
  kAddress = 4,
  kTopics = 5,
  kData = 6,
  kTransactionHash = 7,
  kTransactionIndex = 8,
  kVerbatim = 9,
};
enum VerbatimBit : uint32_t {
  kBlockHashText = 1,
  kAddressText = 2,
  kTopicsText = 4,
  kDataText = 8,
  kTransactionHashText = 16,
};
constexpr uint32_t kVarint = 0;
constexpr uint32_t kLengthDelimited = 2;

// Lowercase hex digits only: anything else is stored verbatim, so that decoding (which
// writes lowercase) gives back the exact text.
struct HexDigits {
  int8_t value[256];
  constexpr HexDigits() : value() {
    for (int i = 0; i < 256; ++i) value[i] = -1;
    for (int i = 0; i < 10; ++i) value['0' + i] = static_cast<int8_t>(i);
    for (int i = 0; i < 6; ++i) value['a' + i] = static_cast<int8_t>(10 + i);
  }
};
constexpr HexDigits kDigits;
constexpr char kLowerHex[] = "0123456789abcdef";

// "0x" followed by an even number of lowercase hex digits.
bool IsCanonicalHex(absl::string_view text) {
  if (text.size() < 2 || text[0] != '0' || text[1] != 'x' || text.size() % 2 != 0) {
    return false;
  }
  for (size_t i = 2; i < text.size(); ++i) {
    if (kDigits.value[static_cast<uint8_t>(text[i])] < 0) return false;
  }
  return true;
}

void AppendVarint(uint64_t v, std::string* out) {
  char buf[10];
  int n = 0;
  while (v >= 0x80) {
    buf[n++] = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  buf[n++] = static_cast<char>(v);
  out->append(buf, n);
}

void AppendTag(uint32_t field, uint32_t wire_type, std::string* out) {
  AppendVarint((field << 3) | wire_type, out);
}

void AppendUint(uint32_t field, uint64_t v, std::string* out) {
  if (v == 0) return;  // proto3 default
  AppendTag(field, kVarint, out);
  AppendVarint(v, out);
}

void AppendBytes(uint32_t field, absl::string_view bytes, std::string* out) {
  AppendTag(field, kLengthDelimited, out);
  AppendVarint(bytes.size(), out);
  out->append(bytes.data(), bytes.size());
}

// `hex` is canonical: appends the bytes it spells as field `field`.
void AppendHexAsBytes(uint32_t field, absl::string_view hex, std::string* out) {
  const size_t n = (hex.size() - 2) / 2;
  AppendTag(field, kLengthDelimited, out);
  AppendVarint(n, out);
  const size_t at = out->size();
  out->resize(at + n);
  char* p = out->data() + at;
  const char* d = hex.data() + 2;
  for (size_t i = 0; i < n; ++i) {
    p[i] = static_cast<char>((kDigits.value[static_cast<uint8_t>(d[2 * i])] << 4) |
                             kDigits.value[static_cast<uint8_t>(d[2 * i + 1])]);
  }
}

// One singular hex field. Left out when it decodes to the same text anyway.
void AppendHexField(uint32_t field, uint32_t text_bit, absl::string_view text,
                    uint32_t* verbatim, std::string* out) {
  if (IsCanonicalHex(text)) {
    if (text.size() > 2) AppendHexAsBytes(field, text, out);
    return;
  }
  *verbatim |= text_bit;
  if (!text.empty()) AppendBytes(field, text, out);
}

// The text a stored field stands for.
void DecodeHexField(const std::string& stored, bool verbatim, std::string* text) {
  if (verbatim) {
    *text = stored;
    return;
  }
  text->resize(2 + 2 * stored.size());
  char* p = text->data();
  *p++ = '0';
  *p++ = 'x';
  for (unsigned char c : stored) {
    *p++ = kLowerHex[c >> 4];
    *p++ = kLowerHex[c & 15];
  }
}

}  // namespace

void AppendEncodedRow(const handoff::v1::EventRow& row, std::string* out) {
  out->push_back(kStoredRowFormat);
  uint32_t verbatim = 0;
  AppendUint(kBlockNumber, row.block_number(), out);
  AppendUint(kLogIndex, row.log_index(), out);
  AppendHexField(kBlockHash, kBlockHashText, row.block_hash(), &verbatim, out);
  AppendHexField(kAddress, kAddressText, row.address(), &verbatim, out);
  bool topics_canonical = true;
  for (const std::string& t : row.topics()) topics_canonical &= IsCanonicalHex(t);
  if (!topics_canonical) verbatim |= kTopicsText;
  for (const std::string& t : row.topics()) {
    // Repeated: every entry is written, empty or not, so that the count survives.
    if (topics_canonical) {
      AppendHexAsBytes(kTopics, t, out);
    } else {
      AppendBytes(kTopics, t, out);
    }
  }
  AppendHexField(kData, kDataText, row.data(), &verbatim, out);
  AppendHexField(kTransactionHash, kTransactionHashText, row.transaction_hash(), &verbatim,
                 out);
  AppendUint(kTransactionIndex, row.transaction_index(), out);
  AppendUint(kVerbatim, verbatim, out);
}

std::string EncodeRow(const handoff::v1::EventRow& row) {
  std::string out;
  AppendEncodedRow(row, &out);
  return out;
}

absl::Status DecodeRow(absl::string_view value, handoff::v1::EventRow* row) {
  row->Clear();
  if (value.empty() || value[0] != kStoredRowFormat) {
    // Written before the StoredRow format: a serialized EventRow.
    if (!row->ParseFromArray(value.data(), static_cast<int>(value.size()))) {
      return absl::DataLossError("unreadable row (EventRow format)");
    }
    return absl::OkStatus();
  }
  StoredRow stored;
  if (!stored.ParseFromArray(value.data() + 1, static_cast<int>(value.size() - 1))) {
    return absl::DataLossError("unreadable row (StoredRow format)");
  }
  const uint32_t verbatim = stored.verbatim();
  row->set_block_number(stored.block_number());
  row->set_log_index(stored.log_index());
  DecodeHexField(stored.block_hash(), verbatim & kBlockHashText, row->mutable_block_hash());
  DecodeHexField(stored.address(), verbatim & kAddressText, row->mutable_address());
  for (const std::string& t : stored.topics()) {
    DecodeHexField(t, verbatim & kTopicsText, row->add_topics());
  }
  DecodeHexField(stored.data(), verbatim & kDataText, row->mutable_data());
  DecodeHexField(stored.transaction_hash(), verbatim & kTransactionHashText,
                 row->mutable_transaction_hash());
  row->set_transaction_index(stored.transaction_index());
  return absl::OkStatus();
}

}  // namespace handoff::store
