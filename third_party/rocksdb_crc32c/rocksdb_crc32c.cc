#include "third_party/rocksdb_crc32c/rocksdb_crc32c.h"

#include <nmmintrin.h>

#include <atomic>
#include <cstring>

// The symbols of `-Wl,--wrap=_ZN7rocksdb6crc32c6ExtendEjPKcm` (BUILD): RocksDB's
// references to rocksdb::crc32c::Extend(unsigned, const char*, unsigned long) resolve to
// the __wrap_ one, and the __real_ one is RocksDB's definition.
extern "C" {
uint32_t __real__ZN7rocksdb6crc32c6ExtendEjPKcm(uint32_t crc, const char* data, size_t n);
uint32_t __wrap__ZN7rocksdb6crc32c6ExtendEjPKcm(uint32_t crc, const char* data, size_t n);
}

namespace handoff::rocksdb_crc32c {
namespace {

std::atomic<uint64_t> wrapped_calls{0};

// One crc32 instruction per 8 bytes. Its latency, not its throughput, bounds this loop
// (~8 bytes per 3 cycles): far above what a WAL writes, so no interleaved streams.
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const char* data,
                                                        size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  uint64_t l = crc ^ 0xffffffffu;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    l = _mm_crc32_u8(static_cast<uint32_t>(l), *p++);
    --n;
  }
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, sizeof(word));
    l = _mm_crc32_u64(l, word);
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    l = _mm_crc32_u8(static_cast<uint32_t>(l), *p++);
    --n;
  }
  return static_cast<uint32_t>(l) ^ 0xffffffffu;
}

using ExtendFunction = uint32_t (*)(uint32_t, const char*, size_t);

ExtendFunction Chosen() {
  static const ExtendFunction chosen =
      __builtin_cpu_supports("sse4.2") ? &ExtendSse42 : &__real__ZN7rocksdb6crc32c6ExtendEjPKcm;
  return chosen;
}

}  // namespace

uint32_t Extend(uint32_t crc, const char* data, size_t n) { return Chosen()(crc, data, n); }

uint32_t PortableExtend(uint32_t crc, const char* data, size_t n) {
  return __real__ZN7rocksdb6crc32c6ExtendEjPKcm(crc, data, n);
}

bool UsesCrc32Instruction() { return Chosen() == &ExtendSse42; }

uint64_t WrappedCalls() { return wrapped_calls.load(std::memory_order_relaxed); }

}  // namespace handoff::rocksdb_crc32c

uint32_t __wrap__ZN7rocksdb6crc32c6ExtendEjPKcm(uint32_t crc, const char* data, size_t n) {
  handoff::rocksdb_crc32c::wrapped_calls.fetch_add(1, std::memory_order_relaxed);
  return handoff::rocksdb_crc32c::Extend(crc, data, n);
}
