#include "consumer/memory_bound.h"

#include <algorithm>

namespace handoff::consumer {

double SlotPageFactor() { return kPollBodyBytesPerWireByte + kParsedPageBytesPerWireByte; }

double BudgetedPollSourcePageFactor() { return kStepBatchBytesPerWireByte; }

double BudgetedSseSourcePageFactor() {
  return kSseStreamBytesPerWireByte + kParsedPageBytesPerWireByte + kStepBatchBytesPerWireByte;
}

double WaitingSourcePageFactor() { return kParsedPageBytesPerWireByte; }

double BudgetedProcessPageFactor() { return kPooledRowPages * kRowBytesPerWireByte; }

double PollSourcePageFactor() {
  return kPollBodyBytesPerWireByte + 2 * kParsedPageBytesPerWireByte + kStepBatchBytesPerWireByte;
}

double SseSourcePageFactor(size_t sse_buffered_pages) {
  return kSseStreamBytesPerWireByte + (1 + sse_buffered_pages) * kParsedPageBytesPerWireByte +
         kStepBatchBytesPerWireByte;
}

double DomPageFactor(size_t sources) {
  return static_cast<double>(std::min(sources, kDomParsers)) * kDomBytesPerWireByte;
}

double ProcessPageFactor() {
  return kPooledRowPages * kRowBytesPerWireByte + kDeleterPages * kParsedPageBytesPerWireByte;
}

double PageMemoryBound(const PageMemoryInputs& in) {
  if (in.page_slots > 0) {
    return static_cast<double>(in.largest_page_bytes) *
           (in.page_slots * SlotPageFactor() + in.poll_sources * BudgetedPollSourcePageFactor() +
            in.sse_sources * BudgetedSseSourcePageFactor() +
            in.waiting_sources * WaitingSourcePageFactor() +
            DomPageFactor(in.poll_sources + in.sse_sources) + BudgetedProcessPageFactor());
  }
  return static_cast<double>(in.largest_page_bytes) *
         (in.poll_sources * PollSourcePageFactor() +
          in.sse_sources * SseSourcePageFactor(in.sse_buffered_pages) +
          DomPageFactor(in.poll_sources + in.sse_sources) + ProcessPageFactor());
}

}  // namespace handoff::consumer
