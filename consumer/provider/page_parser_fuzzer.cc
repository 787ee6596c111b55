// libFuzzer target for PageParser: any input must yield a Page or an InvalidArgument
// status naming a field, never a crash. Build and run: see README.md.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "consumer/provider/page_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static handoff::consumer::PageParser* parser = new handoff::consumer::PageParser();
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<handoff::consumer::Page> page = parser->Parse(input);
  if (!page.ok() && page.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
  if (page.ok() && page->wire_bytes != size) std::abort();
  return 0;
}
