// Helpers shared by the sample sink's tests: where a test's database lives and the
// ApplyRequest of one event, keyed the way Handoff keys its deliveries.
#ifndef HANDOFF_SIM_SAMPLE_SINK_SINK_TEST_UTIL_H_
#define HANDOFF_SIM_SAMPLE_SINK_SINK_TEST_UTIL_H_

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "handoff/v1/event_sink.pb.h"

namespace handoff::sim {

// A path under the test's private temporary directory.
inline std::string TestDb(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

// The finalized event at (block, log_index) of source "src".
inline handoff::v1::ApplyRequest Request(uint64_t block, uint64_t log_index) {
  handoff::v1::ApplyRequest r;
  r.set_source_id("src");
  r.set_idempotency_key(absl::StrCat("src/0xb", block, "/", log_index));
  r.mutable_event()->set_block_number(block);
  r.mutable_event()->set_log_index(log_index);
  r.mutable_event()->set_block_hash(absl::StrCat("0xb", block));
  r.set_finality(handoff::v1::FINALITY_FINALIZED);
  return r;
}

}  // namespace handoff::sim

#endif  // HANDOFF_SIM_SAMPLE_SINK_SINK_TEST_UTIL_H_
