#include "store/row_codec.h"

#include <cstdint>

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

// Appends `text` as the bytes it spells when it is canonical ("0x" + an even number of
// lowercase hex digits; an empty result is left out when `omit_empty`). False, with
// nothing appended, when it is not canonical.
bool AppendHexAsBytes(uint32_t field, absl::string_view text, bool omit_empty,
                      std::string* out) {
  if (text.size() < 2 || text[0] != '0' || text[1] != 'x' || text.size() % 2 != 0) {
    return false;
  }
  const size_t n = (text.size() - 2) / 2;
  if (n == 0 && omit_empty) return true;
  const size_t mark = out->size();
  AppendTag(field, kLengthDelimited, out);
  AppendVarint(n, out);
  const size_t at = out->size();
  out->resize(at + n);
  if (!DecodeLowerHex(text.data() + 2, text.size() - 2, out->data() + at)) {
    out->resize(mark);
    return false;
  }
  return true;
}

// One singular hex field; stored as its text, and flagged, when not canonical.
void AppendHexField(Field field, absl::string_view text, uint32_t* verbatim,
                    std::string* out) {
  if (AppendHexAsBytes(field, text, /*omit_empty=*/true, out)) return;
  *verbatim |= TextBit(field);
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
  AppendHexField(kBlockHash, row.block_hash(), &verbatim, out);
  AppendHexField(kAddress, row.address(), &verbatim, out);
  // Topics are all stored as bytes, or all as text. Repeated: every entry is written,
  // empty or not, so that the count survives.
  const size_t topics_at = out->size();
  for (const std::string& t : row.topics()) {
    if (!AppendHexAsBytes(kTopics, t, /*omit_empty=*/false, out)) {
      out->resize(topics_at);
      verbatim |= TextBit(kTopics);
      for (const std::string& text : row.topics()) AppendBytes(kTopics, text, out);
      break;
    }
  }
  AppendHexField(kData, row.data(), &verbatim, out);
  AppendHexField(kTransactionHash, row.transaction_hash(), &verbatim, out);
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

}  // namespace handoff::store
