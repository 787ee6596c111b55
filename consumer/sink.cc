#include "consumer/sink.h"

#include <memory>

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

std::future<std::vector<SinkAnswer>> ExternalSink::Send(absl::string_view source_id,
                                                        absl::Span<const Delivery> deliveries) {
  struct Copies {
    std::string source_id;
    std::vector<handoff::v1::EventRow> rows;
    std::vector<Delivery> deliveries;
  };
  auto copies = std::make_shared<Copies>();
  copies->source_id = std::string(source_id);
  copies->rows.reserve(deliveries.size());
  for (const Delivery& d : deliveries) {
    copies->rows.push_back(d.row != nullptr ? *d.row : handoff::v1::EventRow());
  }
  copies->deliveries.assign(deliveries.begin(), deliveries.end());
  for (size_t i = 0; i < deliveries.size(); ++i) {
    if (deliveries[i].row != nullptr) copies->deliveries[i].row = &copies->rows[i];
  }
  return std::async(std::launch::async,
                    [this, copies] { return Deliver(copies->source_id, copies->deliveries); });
}

}  // namespace handoff::consumer
