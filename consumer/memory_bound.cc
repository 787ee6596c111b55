#include "consumer/memory_bound.h"

namespace handoff::consumer {

double PollSourcePageFactor() {
  return kPollBodyBytesPerWireByte + kDomBytesPerWireByte + 2 * kParsedPageBytesPerWireByte +
         kStepBatchBytesPerWireByte;
}

double SseSourcePageFactor(size_t sse_buffered_pages) {
  return kSseStreamBytesPerWireByte + kDomBytesPerWireByte +
         (1 + sse_buffered_pages) * kParsedPageBytesPerWireByte + kStepBatchBytesPerWireByte;
}

double ProcessPageFactor() {
  return kPooledRowPages * kRowBytesPerWireByte + kDeleterPages * kParsedPageBytesPerWireByte;
}

double PageMemoryBound(const PageMemoryInputs& in) {
  return static_cast<double>(in.largest_page_bytes) *
         (in.poll_sources * PollSourcePageFactor() +
          in.sse_sources * SseSourcePageFactor(in.sse_buffered_pages) + ProcessPageFactor());
}

}  // namespace handoff::consumer
