// libFuzzer target for PageParser: any input must yield a Page or an InvalidArgument
// status naming a field, never a crash; and a Page it yields holds only well-formed hex
// (the digits of an item's hex fields are checked by the row encoder or, for a row it
// keeps verbatim, by the parser: either way nothing else may pass). Build and run: see
// README.md.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "consumer/provider/page_parser.h"

namespace {

// "0x" followed by `digits` hex digits (any number, even, when `digits` is 0).
bool IsHex(const std::string& text, size_t digits) {
  if (text.size() < 2 || text[0] != '0' || text[1] != 'x') return false;
  if (digits != 0 ? text.size() != digits + 2 : text.size() % 2 != 0) return false;
  for (size_t i = 2; i < text.size(); ++i) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(text[i]))) return false;
  }
  return true;
}

bool WellFormed(const handoff::v1::EventRow& row) {
  if (!IsHex(row.address(), 40) || !IsHex(row.data(), 0) || !IsHex(row.block_hash(), 64) ||
      !IsHex(row.transaction_hash(), 64)) {
    return false;
  }
  for (const std::string& topic : row.topics()) {
    if (!IsHex(topic, 64)) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static handoff::consumer::PageParser* parser = new handoff::consumer::PageParser();
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<handoff::consumer::Page> page = parser->Parse(input);
  if (!page.ok() && page.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
  if (!page.ok()) return 0;
  if (page->wire_bytes != size) std::abort();
  for (const handoff::v1::EventRow& row : page->items) {
    if (!WellFormed(row)) std::abort();
  }
  return 0;
}
