#include "consumer/memory_bound.h"

#include <algorithm>
#include <thread>

namespace handoff::consumer {

double SlotPageFactor() { return kPollBodyBytesPerWireByte + kParsedPageBytesPerWireByte; }

double PollSourcePageFactor() { return kStepBatchBytesPerWireByte; }

double SseSourcePageFactor() {
  return kSseStreamBytesPerWireByte + kStepBatchBytesPerWireByte;
}

double WaitingSourcePageFactor() { return kParsedPageBytesPerWireByte; }

double ProcessPageFactor() { return kPooledRowPages * kRowBytesPerWireByte; }

size_t DomParsers() {
  static const size_t parsers = std::clamp<size_t>(std::thread::hardware_concurrency(), 2,
                                                   kMaxDomParsers);
  return parsers;
}

double DomPageFactor(size_t sources) {
  return static_cast<double>(std::min(sources, DomParsers())) * kDomBytesPerWireByte;
}

double PageMemoryBound(const PageMemoryInputs& in) {
  return static_cast<double>(in.largest_page_bytes) *
         (in.page_slots * SlotPageFactor() + in.poll_sources * PollSourcePageFactor() +
          in.sse_sources * SseSourcePageFactor() +
          in.waiting_sources * WaitingSourcePageFactor() +
          DomPageFactor(in.poll_sources + in.sse_sources) + ProcessPageFactor());
}

}  // namespace handoff::consumer
