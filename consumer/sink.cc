#include "consumer/sink.h"

#include "absl/strings/str_cat.h"

namespace handoff::consumer {

std::string IdempotencyKey(absl::string_view source_id, const handoff::v1::EventRow& row) {
  return absl::StrCat(source_id, "/", row.block_hash(), "/", row.log_index());
}

}  // namespace handoff::consumer
