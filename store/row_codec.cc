#include "store/row_codec.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "store/records.pb.h"

namespace handoff::store {
namespace {

// The first byte of a value in the StoredRow format (a serialized EventRow never starts
// with it: its first byte is a tag, and field number 0 does not exist).
constexpr char kStoredRowFormat = '\0';

// StoredRow's field numbers (store/records.proto).
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
// The `verbatim` bit of a hex field: 1 block_hash, 2 address, 4 topics, 8 data,
// 16 transaction_hash (the hex fields are numbered 3 to 7).
constexpr uint32_t TextBit(Field hex_field) { return 1u << (hex_field - kBlockHash); }
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
// kHexPairs[2 * b], kHexPairs[2 * b + 1]: the two lower-case hex digits of byte b.
constexpr std::array<char, 512> kHexPairs = [] {
  std::array<char, 512> pairs{};
  for (int b = 0; b < 256; ++b) {
    pairs[2 * b] = kLowerHex[b >> 4];
    pairs[2 * b + 1] = kLowerHex[b & 15];
  }
  return pairs;
}();

// Decodes n_chars (even) lowercase hex digits at `in` into n_chars / 2 bytes at `out`.
// False if any character is not a lowercase hex digit (then `out` holds garbage).
bool DecodeLowerHex(const char* in, size_t n_chars, char* out) {
  size_t i = 0;
#if defined(__SSE2__)
  // 32 digits -> 16 bytes per step (baseline x86-64): classify each digit, turn it into
  // its nibble, then join the nibble pairs in 16-bit lanes and pack.
  const __m128i zero = _mm_set1_epi8('0'), nine = _mm_set1_epi8(9);
  const __m128i a = _mm_set1_epi8('a'), five = _mm_set1_epi8(5), ten = _mm_set1_epi8(10);
  const __m128i low_byte = _mm_set1_epi16(0x00FF);
  auto nibbles = [&](__m128i c, __m128i* ok) {
    const __m128i d = _mm_sub_epi8(c, zero);
    const __m128i is_digit = _mm_cmpeq_epi8(_mm_min_epu8(d, nine), d);
    const __m128i l = _mm_sub_epi8(c, a);
    const __m128i is_letter = _mm_cmpeq_epi8(_mm_min_epu8(l, five), l);
    *ok = _mm_and_si128(*ok, _mm_or_si128(is_digit, is_letter));
    return _mm_or_si128(_mm_and_si128(is_digit, d),
                        _mm_and_si128(is_letter, _mm_add_epi8(l, ten)));
  };
  auto pairs = [&](__m128i n) {  // 16 nibbles -> 8 bytes in 16-bit lanes
    return _mm_or_si128(_mm_slli_epi16(_mm_and_si128(n, low_byte), 4), _mm_srli_epi16(n, 8));
  };
  __m128i ok = _mm_set1_epi8(-1);
  for (; i + 32 <= n_chars; i += 32) {
    const __m128i n0 =
        nibbles(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)), &ok);
    const __m128i n1 =
        nibbles(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 16)), &ok);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i / 2),
                     _mm_packus_epi16(pairs(n0), pairs(n1)));
  }
  if (_mm_movemask_epi8(ok) != 0xFFFF) return false;
#endif
  int bad = 0;
  for (; i + 1 < n_chars; i += 2) {
    const int hi = kDigits.value[static_cast<uint8_t>(in[i])];
    const int lo = kDigits.value[static_cast<uint8_t>(in[i + 1])];
    bad |= hi | lo;  // negative if either is not a digit
    out[i / 2] = static_cast<char>(((hi & 15) << 4) | (lo & 15));
  }
  return bad >= 0;
}

// Writes the 2 * n lowercase hex digits of the n bytes at `in` to `out`.
void EncodeLowerHex(const unsigned char* in, size_t n, char* out) {
  size_t i = 0;
#if defined(__SSE2__)
  // 16 bytes -> 32 digits per step: split each byte into its nibbles, interleave them
  // (high first) and map 0..9 to '0'..'9', 10..15 to 'a'..'f'.
  const __m128i low_nibble = _mm_set1_epi8(0x0F), nine = _mm_set1_epi8(9);
  const __m128i zero = _mm_set1_epi8('0'), letter_gap = _mm_set1_epi8('a' - '0' - 10);
  auto digits = [&](__m128i v) {
    return _mm_add_epi8(_mm_add_epi8(v, zero),
                        _mm_and_si128(_mm_cmpgt_epi8(v, nine), letter_gap));
  };
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low_nibble);
    const __m128i lo = _mm_and_si128(b, low_nibble);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i),
                     digits(_mm_unpacklo_epi8(hi, lo)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i + 16),
                     digits(_mm_unpackhi_epi8(hi, lo)));
  }
#endif
  for (; i < n; ++i) std::memcpy(out + 2 * i, &kHexPairs[2 * in[i]], 2);
}

// Writes a StoredRow into memory reserved beforehand (MaxEncodedSize), so that no field
// checks or grows the string.
class RowWriter {
 public:
  explicit RowWriter(char* p) : p_(p) {}
  char* position() const { return p_; }
  void Rewind(char* to) { p_ = to; }

  void Byte(char c) { *p_++ = c; }
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      *p_++ = static_cast<char>(v | 0x80);
      v >>= 7;
    }
    *p_++ = static_cast<char>(v);
  }
  void Tag(uint32_t field, uint32_t wire_type) { Varint((field << 3) | wire_type); }
  void Uint(uint32_t field, uint64_t v) {
    if (v == 0) return;  // proto3 default
    Tag(field, kVarint);
    Varint(v);
  }
  void Bytes(uint32_t field, absl::string_view bytes) {
    Tag(field, kLengthDelimited);
    Varint(bytes.size());
    std::memcpy(p_, bytes.data(), bytes.size());
    p_ += bytes.size();
  }
  // Writes `text` as the bytes it spells when it is canonical ("0x" + an even number of
  // lowercase hex digits; an empty result is left out when `omit_empty`). False, with
  // nothing written, when it is not canonical.
  bool HexAsBytes(uint32_t field, absl::string_view text, bool omit_empty) {
    if (text.size() < 2 || text[0] != '0' || text[1] != 'x' || text.size() % 2 != 0) {
      return false;
    }
    const size_t n = (text.size() - 2) / 2;
    if (n == 0 && omit_empty) return true;
    char* const mark = p_;
    Tag(field, kLengthDelimited);
    Varint(n);
    if (!DecodeLowerHex(text.data() + 2, text.size() - 2, p_)) {
      p_ = mark;
      return false;
    }
    p_ += n;
    return true;
  }
  // One singular hex field; stored as its text, and flagged, when not canonical.
  void HexField(Field field, absl::string_view text, uint32_t* verbatim) {
    if (HexAsBytes(field, text, /*omit_empty=*/true)) return;
    *verbatim |= TextBit(field);
    if (!text.empty()) Bytes(field, text);
  }

 private:
  char* p_;
};

// The most AppendEncodedRow writes for `row`: every hex field at its text length (the
// verbatim case) after a tag and a length, every number as a tag and a 10-byte varint.
size_t MaxEncodedSize(const handoff::v1::EventRow& row) {
  constexpr size_t kHeader = 1 + 10;
  size_t n = 1 + 4 * kHeader;  // format byte; block, log index, tx index, verbatim
  for (const std::string* f : {&row.block_hash(), &row.address(), &row.data(),
                               &row.transaction_hash()}) {
    n += kHeader + f->size();
  }
  for (const std::string& t : row.topics()) n += kHeader + t.size();
  return n;
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
  // The data field is most of a row: nibble by nibble, this was a fifth of the delivery
  // stage's CPU (reading the outbox).
  EncodeLowerHex(reinterpret_cast<const unsigned char*>(stored.data()), stored.size(), p);
}

}  // namespace

bool AppendEncodedRow(const handoff::v1::EventRow& row, std::string* out) {
  const size_t at = out->size();
  out->resize(at + MaxEncodedSize(row));
  RowWriter w(out->data() + at);
  w.Byte(kStoredRowFormat);
  uint32_t verbatim = 0;
  w.Uint(kBlockNumber, row.block_number());
  w.Uint(kLogIndex, row.log_index());
  w.HexField(kBlockHash, row.block_hash(), &verbatim);
  w.HexField(kAddress, row.address(), &verbatim);
  // Topics are all stored as bytes, or all as text. Repeated: every entry is written,
  // empty or not, so that the count survives.
  char* const topics_at = w.position();
  for (const std::string& t : row.topics()) {
    if (!w.HexAsBytes(kTopics, t, /*omit_empty=*/false)) {
      w.Rewind(topics_at);
      verbatim |= TextBit(kTopics);
      for (const std::string& text : row.topics()) w.Bytes(kTopics, text);
      break;
    }
  }
  w.HexField(kData, row.data(), &verbatim);
  w.HexField(kTransactionHash, row.transaction_hash(), &verbatim);
  w.Uint(kTransactionIndex, row.transaction_index());
  w.Uint(kVerbatim, verbatim);
  out->resize(static_cast<size_t>(w.position() - out->data()));
  return verbatim == 0;
}

std::string EncodeRow(const handoff::v1::EventRow& row) {
  std::string out;
  AppendEncodedRow(row, &out);
  return out;
}

namespace {

// Decodes `value` into *row through *stored_row, the parsed form (parsing clears it
// first and keeps its strings' memory).
absl::Status DecodeRowWith(absl::string_view value, StoredRow* stored_row,
                           handoff::v1::EventRow* row) {
  row->Clear();
  if (value.empty() || value[0] != kStoredRowFormat) {
    // Written before the StoredRow format: a serialized EventRow.
    if (!row->ParseFromArray(value.data(), static_cast<int>(value.size()))) {
      return absl::DataLossError("unreadable row (EventRow format)");
    }
    return absl::OkStatus();
  }
  StoredRow& stored = *stored_row;
  if (!stored.ParseFromArray(value.data() + 1, static_cast<int>(value.size() - 1))) {
    return absl::DataLossError("unreadable row (StoredRow format)");
  }
  const uint32_t verbatim = stored.verbatim();
  row->set_block_number(stored.block_number());
  row->set_log_index(stored.log_index());
  DecodeHexField(stored.block_hash(), verbatim & TextBit(kBlockHash), row->mutable_block_hash());
  DecodeHexField(stored.address(), verbatim & TextBit(kAddress), row->mutable_address());
  for (const std::string& t : stored.topics()) {
    DecodeHexField(t, verbatim & TextBit(kTopics), row->add_topics());
  }
  DecodeHexField(stored.data(), verbatim & TextBit(kData), row->mutable_data());
  DecodeHexField(stored.transaction_hash(), verbatim & TextBit(kTransactionHash),
                 row->mutable_transaction_hash());
  row->set_transaction_index(stored.transaction_index());
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeRow(absl::string_view value, handoff::v1::EventRow* row) {
  StoredRow stored;
  return DecodeRowWith(value, &stored, row);
}

RowDecoder::RowDecoder() : stored_(std::make_unique<StoredRow>()) {}

RowDecoder::~RowDecoder() = default;

absl::Status RowDecoder::Decode(absl::string_view value, handoff::v1::EventRow* row) {
  return DecodeRowWith(value, stored_.get(), row);
}

}  // namespace handoff::store
