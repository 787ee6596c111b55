#include "consumer/provider/page_parser.h"

#include <simdjson.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "consumer/memory_bound.h"
#include "consumer/row_pool.h"

namespace handoff::consumer {
namespace {

namespace dom = simdjson::dom;

constexpr uint64_t kMaxDecimal = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
constexpr uint8_t kNotHex = 0xFF;

struct HexTable {
  uint8_t value[256];
  constexpr HexTable() : value() {
    for (int i = 0; i < 256; ++i) value[i] = kNotHex;
    for (int i = 0; i < 10; ++i) value['0' + i] = static_cast<uint8_t>(i);
    for (int i = 0; i < 6; ++i) {
      value['a' + i] = static_cast<uint8_t>(10 + i);
      value['A' + i] = static_cast<uint8_t>(10 + i);
    }
  }
};
constexpr HexTable kHex;



// A field path, rendered only when an error is reported.
struct Path {
  const char* field;          // e.g. "logIndex"; nullptr for the item itself
  int64_t item = -1;          // index in items, or -1 at the page level
  int64_t sub = -1;           // index in topics, or -1
  const char* parent = nullptr;  // e.g. "through" for "through.number"

  std::string Render() const {
    std::string out;
    if (item >= 0) absl::StrAppend(&out, "items[", item, "]");
    if (parent != nullptr) absl::StrAppend(&out, out.empty() ? "" : ".", parent);
    if (field != nullptr) absl::StrAppend(&out, out.empty() ? "" : ".", field);
    if (sub >= 0) absl::StrAppend(&out, "[", sub, "]");
    return out;
  }
};

absl::Status FieldError(const Path& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path.Render(), ": ", what));
}

absl::Status JsonError(const Path& path, simdjson::error_code e) {
  std::string where = path.Render();
  return absl::InvalidArgumentError(absl::StrCat(where.empty() ? "page" : where,
                                                 ": invalid JSON (",
                                                 simdjson::error_message(e), ")"));
}

bool IsHexByte(uint8_t c) {
  return static_cast<uint8_t>(c - '0') < 10 || static_cast<uint8_t>((c | 0x20) - 'a') < 6;
}

// Whether all n bytes are hex digits, 16 at a time with SSE2 (baseline x86-64).
bool AllHex(const uint8_t* p, size_t n) {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128i zero = _mm_set1_epi8('0'), nine = _mm_set1_epi8(9);
  const __m128i lower = _mm_set1_epi8(0x20), a = _mm_set1_epi8('a'), five = _mm_set1_epi8(5);
  __m128i ok_all = _mm_set1_epi8(-1);
  for (; i + 16 <= n; i += 16) {
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    __m128i d = _mm_sub_epi8(c, zero);
    __m128i is_digit = _mm_cmpeq_epi8(_mm_min_epu8(d, nine), d);
    __m128i l = _mm_sub_epi8(_mm_or_si128(c, lower), a);
    __m128i is_letter = _mm_cmpeq_epi8(_mm_min_epu8(l, five), l);
    ok_all = _mm_and_si128(ok_all, _mm_or_si128(is_digit, is_letter));
  }
  if (_mm_movemask_epi8(ok_all) != 0xFFFF) return false;
#endif
  for (; i < n; ++i) {
    if (!IsHexByte(p[i])) return false;
  }
  return true;
}

// Points [*begin, *begin + *len) at the string of `v` when it starts with "0x". Its
// digits are checked later: by the row encoder, which checks canonical (lowercase) hex
// as it decodes it, and by CheckHexDigits for a row the encoder stored verbatim.
bool HexText(dom::element v, const char** begin, size_t* len) {
  std::string_view s;
  if (v.get_string().get(s) != simdjson::SUCCESS) return false;
  if (s.size() < 2 || s[0] != '0' || s[1] != 'x') return false;
  *begin = s.data();
  *len = s.size();
  return true;
}

absl::Status FixedHexError(const Path& path, size_t digits) {
  return FieldError(path, absl::StrCat("expected 0x-prefixed ", digits, " hex digits"));
}
constexpr const char* kHexDataExpected = "expected 0x-prefixed even-length hex data";

// An item's "0x" + exactly `digits` characters (hex digits: see HexText).
absl::Status ReadFixedHexText(dom::element v, size_t digits, const Path& path,
                              std::string* out) {
  const char* p;
  size_t len;
  if (!HexText(v, &p, &len) || len != digits + 2) return FixedHexError(path, digits);
  out->assign(p, len);
  return absl::OkStatus();
}

// Whether `text` ("0x" + characters) has only hex digits after its prefix.
bool HexDigitsAfterPrefix(const std::string& text) {
  return AllHex(reinterpret_cast<const uint8_t*>(text.data()) + 2, text.size() - 2);
}

// "0x" + exactly `digits` hex digits, checked now (a page-level hash: no row encodes it).
absl::Status ReadFixedHex(dom::element v, size_t digits, const Path& path, std::string* out) {
  absl::Status s = ReadFixedHexText(v, digits, path, out);
  if (s.ok() && !HexDigitsAfterPrefix(*out)) return FixedHexError(path, digits);
  return s;
}

// "0x" + an even number of characters (hex digits: see HexText).
absl::Status ReadHexData(dom::element v, const Path& path, std::string* out) {
  const char* p;
  size_t len;
  if (!HexText(v, &p, &len) || (len % 2) != 0) return FieldError(path, kHexDataExpected);
  out->assign(p, len);
  return absl::OkStatus();
}

// The digit check for a row whose hex fields the encoder did not all decode (some are
// not lowercase): every hex field, in the row's field order.
absl::Status CheckHexDigits(const handoff::v1::EventRow& row, int64_t index) {
  if (!HexDigitsAfterPrefix(row.address())) return FixedHexError(Path{"address", index}, 40);
  for (int j = 0; j < row.topics_size(); ++j) {
    if (!HexDigitsAfterPrefix(row.topics(j))) {
      return FixedHexError(Path{"topics", index, j}, 64);
    }
  }
  if (!HexDigitsAfterPrefix(row.data())) return FieldError(Path{"data", index}, kHexDataExpected);
  if (!HexDigitsAfterPrefix(row.block_hash())) {
    return FixedHexError(Path{"blockHash", index}, 64);
  }
  if (!HexDigitsAfterPrefix(row.transaction_hash())) {
    return FixedHexError(Path{"transactionHash", index}, 64);
  }
  return absl::OkStatus();
}

// JSON-RPC quantity: "0x" + 1..16 hex digits (leading zeros tolerated).
absl::Status ReadQuantity(dom::element v, const Path& path, uint64_t* out) {
  const char* p;
  size_t len;
  if (!HexText(v, &p, &len) || len < 3) return FieldError(path, "expected hex quantity");
  const char* d = p + 2;
  size_t n = len - 2;
  while (n > 1 && *d == '0') {
    ++d;
    --n;
  }
  if (n > 16) {
    if (!AllHex(reinterpret_cast<const uint8_t*>(d), n)) {
      return FieldError(path, "expected hex quantity");
    }
    return FieldError(path, "hex quantity exceeds 64 bits");
  }
  uint64_t value = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t digit = kHex.value[static_cast<uint8_t>(d[i])];
    if (digit == kNotHex) return FieldError(path, "expected hex quantity");
    value = (value << 4) | digit;
  }
  *out = value;
  return absl::OkStatus();
}

constexpr const char* kDecimalExpected =
    "expected decimal number (JSON number or string) up to 2^63-1";

// A decimal page number; `*is_null` is set for a JSON null when `nullable`.
absl::Status ReadDecimal(dom::element v, const Path& path, bool nullable, uint64_t* out,
                         bool* is_null) {
  switch (v.type()) {
    case dom::element_type::INT64: {
      int64_t n = 0;
      if (v.get_int64().get(n) != simdjson::SUCCESS || n < 0) {
        return FieldError(path, kDecimalExpected);
      }
      *out = static_cast<uint64_t>(n);
      return absl::OkStatus();
    }
    case dom::element_type::UINT64: {
      uint64_t n = 0;
      if (v.get_uint64().get(n) != simdjson::SUCCESS || n > kMaxDecimal) {
        return FieldError(path, kDecimalExpected);
      }
      *out = n;
      return absl::OkStatus();
    }
    case dom::element_type::STRING: {
      std::string_view s;
      if (v.get_string().get(s) != simdjson::SUCCESS || s.empty() || s.size() > 19) {
        return FieldError(path, kDecimalExpected);
      }
      uint64_t n = 0;
      for (char c : s) {
        if (c < '0' || c > '9') return FieldError(path, kDecimalExpected);
        n = n * 10 + static_cast<uint64_t>(c - '0');  // 19 digits cannot overflow uint64
      }
      if (n > kMaxDecimal) return FieldError(path, kDecimalExpected);
      *out = n;
      return absl::OkStatus();
    }
    case dom::element_type::NULL_VALUE:
      if (nullable) {
        *is_null = true;
        return absl::OkStatus();
      }
      return FieldError(path, absl::StrCat(kDecimalExpected, ", got null"));
    default:
      return FieldError(path, kDecimalExpected);
  }
}

// {"number": decimal, "hash": "0x" + 64 hex} or null.
absl::Status ReadBlockMark(dom::element v, const char* name, std::optional<BlockMarkValue>* out) {
  Path path{name};
  if (v.is_null()) {
    out->reset();
    return absl::OkStatus();
  }
  dom::object obj;
  if (v.get_object().get(obj) != simdjson::SUCCESS) {
    return FieldError(path, "expected {\"number\",\"hash\"} object or null");
  }
  BlockMarkValue mark;
  bool have_number = false, have_hash = false;
  for (dom::key_value_pair f : obj) {
    std::string_view key = f.key;
    if (key == "number") {
      bool unused = false;
      if (have_number) return FieldError(Path{"number", -1, -1, name}, "duplicate field");
      absl::Status s =
          ReadDecimal(f.value, Path{"number", -1, -1, name}, false, &mark.number, &unused);
      if (!s.ok()) return s;
      have_number = true;
    } else if (key == "hash") {
      if (have_hash) return FieldError(Path{"hash", -1, -1, name}, "duplicate field");
      absl::Status s = ReadFixedHex(f.value, 64, Path{"hash", -1, -1, name}, &mark.hash);
      if (!s.ok()) return s;
      have_hash = true;
    }
  }
  if (!have_number) return FieldError(Path{"number", -1, -1, name}, "missing");
  if (!have_hash) return FieldError(Path{"hash", -1, -1, name}, "missing");
  *out = std::move(mark);
  return absl::OkStatus();
}

enum ItemField : uint32_t {
  kAddress = 1 << 0,
  kTopics = 1 << 1,
  kData = 1 << 2,
  kBlockNumber = 1 << 3,
  kBlockHash = 1 << 4,
  kTransactionHash = 1 << 5,
  kTransactionIndex = 1 << 6,
  kLogIndex = 1 << 7,
  kRemoved = 1 << 8,
};
constexpr uint32_t kRequiredItemFields = kAddress | kTopics | kData | kBlockNumber |
                                         kBlockHash | kTransactionHash |
                                         kTransactionIndex | kLogIndex;
constexpr struct {
  uint32_t bit;
  const char* name;
} kItemFieldNames[] = {
    {kAddress, "address"},         {kTopics, "topics"},
    {kData, "data"},               {kBlockNumber, "blockNumber"},
    {kBlockHash, "blockHash"},     {kTransactionHash, "transactionHash"},
    {kTransactionIndex, "transactionIndex"}, {kLogIndex, "logIndex"},
    {kRemoved, "removed"},
};

absl::Status ReadItem(dom::element v, int64_t index, handoff::v1::EventRow* row) {
  row->clear_topics();  // a recycled row keeps its last values until overwritten
  dom::object obj;
  if (v.get_object().get(obj) != simdjson::SUCCESS) {
    return FieldError(Path{nullptr, index}, "expected log object");
  }
  uint32_t seen = 0;
  for (dom::key_value_pair f : obj) {
    std::string_view key = f.key;
    uint32_t bit = 0;
    absl::Status s;
    uint64_t n = 0;
    if (key == "address") {
      bit = kAddress;
      s = ReadFixedHexText(f.value, 40, Path{"address", index}, row->mutable_address());
    } else if (key == "topics") {
      bit = kTopics;
      dom::array topics;
      if (f.value.get_array().get(topics) != simdjson::SUCCESS) {
        s = FieldError(Path{"topics", index}, "expected array of 64-hex-digit topics");
      } else {
        int64_t j = 0;
        for (dom::element t : topics) {
          s = ReadFixedHexText(t, 64, Path{"topics", index, j}, row->add_topics());
          if (!s.ok()) break;
          ++j;
        }
      }
    } else if (key == "data") {
      bit = kData;
      s = ReadHexData(f.value, Path{"data", index}, row->mutable_data());
    } else if (key == "blockNumber") {
      bit = kBlockNumber;
      s = ReadQuantity(f.value, Path{"blockNumber", index}, &n);
      row->set_block_number(n);
    } else if (key == "blockHash") {
      bit = kBlockHash;
      s = ReadFixedHexText(f.value, 64, Path{"blockHash", index}, row->mutable_block_hash());
    } else if (key == "transactionHash") {
      bit = kTransactionHash;
      s = ReadFixedHexText(f.value, 64, Path{"transactionHash", index},
                           row->mutable_transaction_hash());
    } else if (key == "transactionIndex") {
      bit = kTransactionIndex;
      s = ReadQuantity(f.value, Path{"transactionIndex", index}, &n);
      row->set_transaction_index(n);
    } else if (key == "logIndex") {
      bit = kLogIndex;
      s = ReadQuantity(f.value, Path{"logIndex", index}, &n);
      row->set_log_index(n);
    } else if (key == "removed") {
      bit = kRemoved;
      bool removed;
      if (f.value.get_bool().get(removed) != simdjson::SUCCESS) {
        s = FieldError(Path{"removed", index}, "expected boolean");
      } else if (removed) {
        // Reorgs arrive as correction pages; a removed log has no place in a page.
        s = FieldError(Path{"removed", index}, "removed logs are not allowed in a page");
      }
    } else {
      continue;  // unknown fields are ignored
    }
    if (!s.ok()) return s;
    if (seen & bit) {
      for (const auto& fn : kItemFieldNames) {
        if (fn.bit == bit) return FieldError(Path{fn.name, index}, "duplicate field");
      }
    }
    seen |= bit;
  }
  if ((seen & kRequiredItemFields) != kRequiredItemFields) {
    for (const auto& fn : kItemFieldNames) {
      if ((kRequiredItemFields & fn.bit) && !(seen & fn.bit)) {
        return FieldError(Path{fn.name, index}, "missing");
      }
    }
  }
  return absl::OkStatus();
}

enum PageField : uint32_t {
  kFrom = 1 << 0,
  kThrough = 1 << 1,
  kNext = 1 << 2,
  kReorg = 1 << 3,
  kSafe = 1 << 4,
  kFinalized = 1 << 5,
  kTip = 1 << 6,
  kItems = 1 << 7,
};
constexpr struct {
  uint32_t bit;
  const char* name;
} kPageFieldNames[] = {
    {kFrom, "from"}, {kThrough, "through"},     {kNext, "next"}, {kReorg, "reorg"},
    {kSafe, "safe"}, {kFinalized, "finalized"}, {kTip, "tip"},   {kItems, "items"},
};

absl::Status ReadPage(dom::element doc, Page* page) {
  dom::object root;
  if (doc.get_object().get(root) != simdjson::SUCCESS) {
    return FieldError(Path{"page"}, "expected JSON object");
  }
  uint32_t seen = 0;
  for (dom::key_value_pair f : root) {
    std::string_view key = f.key;
    uint32_t bit = 0;
    absl::Status s;
    if (key == "from") {
      bit = kFrom;
      bool unused = false;
      s = ReadDecimal(f.value, Path{"from"}, false, &page->from, &unused);
    } else if (key == "through") {
      bit = kThrough;
      s = ReadBlockMark(f.value, "through", &page->through);
    } else if (key == "next") {
      bit = kNext;
      std::string_view next;
      if (f.value.get_string().get(next) != simdjson::SUCCESS) {
        s = FieldError(Path{"next"}, "expected string cursor");
      } else if (next.empty()) {
        s = FieldError(Path{"next"}, "empty cursor");
      } else if (std::any_of(next.begin(), next.end(), [](char c) {
                   return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
                 })) {
        // The cursor goes back in a header (Last-Event-ID) as well as the query: a line
        // break in it would end the header and write the rest as headers of our own.
        s = FieldError(Path{"next"}, "control character in cursor");
      } else {
        page->next.assign(next.data(), next.size());
      }
    } else if (key == "reorg") {
      bit = kReorg;
      if (f.value.get_bool().get(page->reorg) != simdjson::SUCCESS) {
        s = FieldError(Path{"reorg"}, "expected boolean");
      }
    } else if (key == "safe") {
      bit = kSafe;
      s = ReadBlockMark(f.value, "safe", &page->safe);
    } else if (key == "finalized") {
      bit = kFinalized;
      s = ReadBlockMark(f.value, "finalized", &page->finalized);
    } else if (key == "tip") {
      bit = kTip;
      uint64_t tip = 0;
      bool is_null = false;
      s = ReadDecimal(f.value, Path{"tip"}, true, &tip, &is_null);
      if (s.ok()) {
        if (is_null) {
          page->tip.reset();
        } else {
          page->tip = tip;
        }
      }
    } else if (key == "items") {
      bit = kItems;
      dom::array items;
      if (f.value.get_array().get(items) != simdjson::SUCCESS) {
        s = FieldError(Path{"items"}, "expected array of logs");
      } else {
        // Rows of finished pages: filling them reuses their strings' memory. ReadItem
        // sets every field of a row it accepts (all are required), after clearing
        // `topics` (RowPool's contract). An empty page takes none: it would free a
        // pooled page's rows.
        std::vector<handoff::v1::EventRow> rows;
        if (items.size() > 0) rows = RowPool::Default().Take();
        rows.reserve(items.size());
        ReserveEncodedItems(items.size(), page);
        size_t used = 0;
        for (dom::element item : items) {
          if (used == rows.size()) rows.emplace_back();
          s = ReadItem(item, static_cast<int64_t>(used), &rows[used]);
          if (!s.ok()) break;  // the page is refused
          // Encoded on this (the fetching) thread, so the commit path only copies bytes,
          // and now, while the row is in this core's cache: a second pass over the
          // page's rows later would read ~0.6 MB back from memory beside the commit.
          // The encoder checks lowercase hex digits as it decodes them; a row it stored
          // verbatim (upper-case digits, or not hex at all) is checked here.
          if (!AppendEncodedItem(rows[used], page)) {
            s = CheckHexDigits(rows[used], static_cast<int64_t>(used));
            if (!s.ok()) break;
          }
          ++used;
        }
        rows.resize(used);
        page->items = std::move(rows);
      }
    } else {
      continue;
    }
    if (!s.ok()) return s;
    if (seen & bit) {
      for (const auto& fn : kPageFieldNames) {
        if (fn.bit == bit) return FieldError(Path{fn.name}, "duplicate field");
      }
    }
    seen |= bit;
  }
  for (const auto& fn : kPageFieldNames) {
    if (!(seen & fn.bit)) return FieldError(Path{fn.name}, "missing");
  }
  return absl::OkStatus();
}

}  // namespace

// The process's simdjson parsers, shared by every source. A parser keeps the DOM
// allocation of the largest document it has parsed (13.7 bytes per byte of page), and
// a page's parse only needs it until the page is read out of the DOM: with a parser
// per source, 64 sources of 0.8 MB pages held ~700 MB of DOMs, each faulted in on its
// source's first page. Here at most DomParsers() exist (one per core, see
// consumer/memory_bound.h), each kept warm between pages.
//
// Invariant: at most max_parsers_ parsers exist (idle or lent); a borrower that finds
// all of them lent waits for one (a parse is CPU work only: it never waits for
// anything while it holds a parser).
class DomParserPool {
 public:
  static DomParserPool& Default() {
    static DomParserPool* pool = new DomParserPool();
    return *pool;
  }

  std::unique_ptr<dom::parser> Acquire() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](DomParserPool* p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return !p->idle_.empty() || p->created_ < p->max_parsers_;
        },
        this));
    if (!idle_.empty()) {
      std::unique_ptr<dom::parser> parser = std::move(idle_.back());
      idle_.pop_back();
      return parser;
    }
    ++created_;
    return std::make_unique<dom::parser>();
  }

  void Release(std::unique_ptr<dom::parser> parser) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    idle_.push_back(std::move(parser));
  }

  PageParser::SharedParsers Counts() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return PageParser::SharedParsers{created_, idle_.size()};
  }

 private:
  const size_t max_parsers_ = DomParsers();
  absl::Mutex mu_;
  std::vector<std::unique_ptr<dom::parser>> idle_ ABSL_GUARDED_BY(mu_);
  size_t created_ ABSL_GUARDED_BY(mu_) = 0;
};

struct PageParser::Impl {
  std::string padded;

  // REQUIRES: buffer.capacity() >= buffer.size() + Padding().
  absl::StatusOr<Page> Run(const std::string& buffer) {
    DomParserPool& pool = DomParserPool::Default();
    std::unique_ptr<dom::parser> parser = pool.Acquire();
    absl::StatusOr<Page> page = Read(parser.get(), buffer);
    pool.Release(std::move(parser));
    return page;
  }

  static absl::StatusOr<Page> Read(dom::parser* parser, const std::string& buffer) {
    dom::element doc;
    if (auto e = parser->parse(buffer.data(), buffer.size(), false).get(doc)) {
      return JsonError(Path{}, e);
    }
    Page page;
    page.wire_bytes = buffer.size();
    absl::Status s = ReadPage(doc, &page);
    if (!s.ok()) return s;
    return page;
  }
};

PageParser::PageParser() : impl_(std::make_unique<Impl>()) {}
PageParser::~PageParser() = default;

size_t PageParser::Padding() { return simdjson::SIMDJSON_PADDING; }

PageParser::SharedParsers PageParser::SharedParserCounts() {
  return DomParserPool::Default().Counts();
}

absl::StatusOr<Page> PageParser::Parse(absl::string_view json) {
  std::string& buf = impl_->padded;
  if (buf.capacity() < json.size() + Padding()) buf.reserve(json.size() + Padding());
  buf.assign(json.data(), json.size());
  return impl_->Run(buf);
}

absl::StatusOr<Page> PageParser::ParseOwned(std::string* json) {
  if (json->capacity() < json->size() + Padding()) json->reserve(json->size() + Padding());
  return impl_->Run(*json);
}

absl::StatusOr<Page> ParsePage(absl::string_view json) {
  PageParser parser;
  return parser.Parse(json);
}

}  // namespace handoff::consumer
