// RocksDB's CRC32C on the CPU's crc32 instruction, for Debian's portable RocksDB.
//
// RocksDB checksums every WAL record with CRC32C (the log format fixes it; no option
// chooses another). Debian builds RocksDB 7.8 portable, without SSE4.2, and that build
// has no run-time dispatch: `rocksdb::crc32c::Extend` is the table-driven software loop
// (`ExtendImpl<Slow_CRC32>`), ~0.9 GB/s here and ~7 % of an ingest's CPU, on the write
// group leader's serial path (bench/HISTORY.md 98).
//
// This library puts the SSE4.2 instruction under RocksDB's own calls: it is linked with
// `-Wl,--wrap=` on that function, so every call RocksDB's statically linked objects make
// to `rocksdb::crc32c::Extend` (the WAL writer and reader among them) reaches Extend
// below, which computes the same CRC32C (Castagnoli polynomial, RocksDB's
// pre- and post-inversion) with `crc32` where the CPU has SSE4.2, and otherwise calls
// RocksDB's original. Where RocksDB is a shared library (--config=tsan) its internal
// calls stay inside it and nothing changes.
//
// Invariant: for every (crc, data, n), Extend(crc, data, n) equals RocksDB's own
// rocksdb::crc32c::Extend(crc, data, n), bit for bit; WAL files written with one are
// read with the other (rocksdb_crc32c_test compares them on random inputs and through a
// database reopened from disk).
#ifndef HANDOFF_THIRD_PARTY_ROCKSDB_CRC32C_ROCKSDB_CRC32C_H_
#define HANDOFF_THIRD_PARTY_ROCKSDB_CRC32C_ROCKSDB_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace handoff::rocksdb_crc32c {

// The CRC32C of data[0, n) continuing `crc` (0 to start), as rocksdb::crc32c::Extend.
uint32_t Extend(uint32_t crc, const char* data, size_t n);

// RocksDB's own implementation (the wrapped original).
uint32_t PortableExtend(uint32_t crc, const char* data, size_t n);

// Whether Extend uses the crc32 instruction on this CPU.
bool UsesCrc32Instruction();

// Calls that reached Extend through RocksDB's wrapped symbol so far (tests: RocksDB's
// own WAL writes come here).
uint64_t WrappedCalls();

}  // namespace handoff::rocksdb_crc32c

#endif  // HANDOFF_THIRD_PARTY_ROCKSDB_CRC32C_ROCKSDB_CRC32C_H_
