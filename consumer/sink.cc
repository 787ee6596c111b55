#include "consumer/sink.h"

#include "absl/strings/str_cat.h"

namespace handoff::consumer {

std::string IdempotencyKey(absl::string_view source_id, const handoff::v1::EventRow& row) {
  return absl::StrCat(source_id, "/", row.block_hash(), "/", row.log_index());
}

Delivery MakeDelivery(absl::string_view source_id, const handoff::v1::EventRow& row,
                      handoff::v1::Finality finality) {
  Delivery d;
  d.idempotency_key = IdempotencyKey(source_id, row);
  d.row = &row;
  d.finality = finality;
  return d;
}

}  // namespace handoff::consumer
