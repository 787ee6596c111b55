// libFuzzer target for SseParser: the input is split into chunks at positions taken from
// its first bytes; the frames must not depend on the split (nor on the split run giving
// each frame's buffer back for reuse), and nothing may crash or exceed the frame bound.
// Build and run: see README.md.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "consumer/provider/sse_parser.h"

namespace {

constexpr size_t kMax = 4096;

std::vector<std::string> Frames(const std::vector<std::string>& chunks, bool give_back,
                                bool* failed) {
  handoff::consumer::SseParser parser(kMax, /*data_slack=*/64);
  std::vector<std::string> out;
  *failed = false;
  for (const std::string& c : chunks) {
    absl::Status s = parser.Feed(c, [&](handoff::consumer::SseFrame&& f) {
      if (f.data.size() > kMax + 1) std::abort();
      out.push_back(f.id + "\x01" + f.event + "\x01" + f.data + "\x01" +
                    std::to_string(f.retry_ms.value_or(-1)) + (f.has_id ? "i" : "") +
                    (f.has_data ? "d" : ""));
      if (give_back) parser.GiveBack(std::move(f.data));
    });
    if (!s.ok()) {
      *failed = true;
      break;
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t step = 1 + data[0] % 31;
  std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  bool whole_failed = false, split_failed = false;
  std::vector<std::string> whole = Frames({input}, false, &whole_failed);
  std::vector<std::string> chunks;
  for (size_t i = 0; i < input.size(); i += step) chunks.push_back(input.substr(i, step));
  std::vector<std::string> split = Frames(chunks, true, &split_failed);
  if (!whole_failed && !split_failed && whole != split) std::abort();
  return 0;
}
