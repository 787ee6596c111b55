#include "sim/log_render.h"

#include <cstring>

namespace handoff::sim {
namespace {

constexpr char kDigits[] = "0123456789abcdef";
constexpr size_t kPoolSize = 1 << 16;
constexpr size_t kDataBytes[] = {64, 128, 128, 192};

// A log's JSON is at most this long: 163 bytes of fixed text, 748 of address, topics,
// the largest data (384 digits) and two hashes, and three quantities of at most 18.
constexpr size_t kMaxLogJsonBytes = 1024;

// Writes into a buffer sized beforehand: literals and fixed-width slices compile to a
// few moves, where a std::string append was a call and a capacity check per piece (22
// per log; they were most of the simulator's CPU on the benchmark's shared cores).
class Cursor {
 public:
  explicit Cursor(char* p) : p_(p) {}
  template <size_t N>
  void Literal(const char (&s)[N]) {
    std::memcpy(p_, s, N - 1);
    p_ += N - 1;
  }
  template <size_t N>
  void Fixed(const char* s) {
    std::memcpy(p_, s, N);
    p_ += N;
  }
  void Bytes(const char* s, size_t n) {
    std::memcpy(p_, s, n);
    p_ += n;
  }
  void HexU64Fixed(uint64_t v) {
    for (int i = 15; i >= 0; --i) {
      p_[i] = kDigits[v & 0xf];
      v >>= 4;
    }
    p_ += 16;
  }
  // JSON-RPC quantity: "0x" + minimal hex digits.
  void Quantity(uint64_t v) {
    char buf[16];
    int n = 0;
    do {
      buf[15 - n] = kDigits[v & 0xf];
      v >>= 4;
      ++n;
    } while (v != 0);
    Literal("0x");
    Bytes(buf + 16 - n, n);
  }
  char* position() const { return p_; }

 private:
  char* p_;
};

}  // namespace

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct LogRenderer::Fields {
  uint64_t block;
  uint32_t version;
  uint32_t log_index;
  uint64_t h;  // per-log hash choosing pool slices
  const std::string* address;
  const std::string* topic0;
  size_t topic1, topic2, data_off, data_hex_len;
};

LogRenderer::LogRenderer(uint64_t seed) : seed_(seed) {
  pool_.resize(kPoolSize);
  uint64_t s = Mix64(seed ^ 0x706f6f6cULL);
  for (size_t i = 0; i < kPoolSize; i += 16) {
    s = Mix64(s);
    uint64_t v = s;
    for (int j = 0; j < 16; ++j, v >>= 4) pool_[i + j] = kDigits[v & 0xf];
  }
  for (int i = 0; i < 16; ++i) {
    std::string a = "0x";
    a.append(pool_, (Mix64(seed + 100 + i) % (kPoolSize - 40)), 40);
    addresses_.push_back(std::move(a));
  }
  for (int i = 0; i < 4; ++i) {
    std::string t = "0x";
    t.append(pool_, (Mix64(seed + 200 + i) % (kPoolSize - 64)), 64);
    event_topics_.push_back(std::move(t));
  }
}

void LogRenderer::AppendHex64(uint64_t block, uint32_t version, uint64_t salt,
                              std::string* out) const {
  char digits[64];
  WriteHex64(block, version, salt, digits);
  out->append(digits, 64);
}

void LogRenderer::WriteHex64(uint64_t block, uint32_t version, uint64_t salt,
                             char* digits) const {
  // 16 digits of a bijection of (block, version) keep the hash unique; 48 from the pool.
  uint64_t key = (block << 20) ^ version;
  Cursor c(digits);
  c.HexU64Fixed(Mix64(key ^ Mix64(seed_ + salt)));
  c.Fixed<48>(pool_.data() + Mix64(key + salt * 0x9e37) % (kPoolSize - 48));
}

std::string LogRenderer::BlockHash(uint64_t block, uint32_t version) const {
  std::string out = "0x";
  AppendHex64(block, version, 1, &out);
  return out;
}

LogRenderer::Fields LogRenderer::Make(uint64_t block, uint32_t version,
                                      uint32_t log_index) const {
  Fields f;
  f.block = block;
  f.version = version;
  f.log_index = log_index;
  f.h = Mix64(Mix64((block << 20) ^ version ^ seed_) + log_index);
  f.address = &addresses_[f.h & 15];
  f.topic0 = &event_topics_[(f.h >> 4) & 3];
  uint64_t h2 = Mix64(f.h);
  f.topic1 = h2 % (kPoolSize - 64);
  f.topic2 = (h2 >> 32) % (kPoolSize - 64);
  uint64_t h3 = Mix64(h2);
  f.data_hex_len = 2 * kDataBytes[h3 & 3];
  f.data_off = (h3 >> 8) % (kPoolSize - f.data_hex_len);
  return f;
}

void LogRenderer::AppendLogJson(uint64_t block, uint32_t version, uint32_t log_index,
                                std::string* out) const {
  char block_hash[64];
  WriteHex64(block, version, 1, block_hash);
  AppendLogJson(Make(block, version, log_index), block_hash, out);
}

void LogRenderer::AppendLogJson(const Fields& f, const char* block_hash,
                                std::string* out) const {
  char buf[kMaxLogJsonBytes];
  Cursor c(buf);
  c.Literal("{\"address\":\"");
  c.Fixed<42>(f.address->data());
  c.Literal("\",\"topics\":[\"");
  c.Fixed<66>(f.topic0->data());
  c.Literal("\",\"0x");
  c.Fixed<64>(pool_.data() + f.topic1);
  c.Literal("\",\"0x");
  c.Fixed<64>(pool_.data() + f.topic2);
  c.Literal("\"],\"data\":\"0x");
  c.Bytes(pool_.data() + f.data_off, f.data_hex_len);
  c.Literal("\",\"blockNumber\":\"");
  c.Quantity(f.block);
  c.Literal("\",\"blockHash\":\"0x");
  c.Fixed<64>(block_hash);
  c.Literal("\",\"transactionHash\":\"0x");
  char tx_hash[64];
  WriteHex64(f.block, f.version, 1000 + f.log_index / 2, tx_hash);
  c.Fixed<64>(tx_hash);
  c.Literal("\",\"transactionIndex\":\"");
  c.Quantity(f.log_index / 2);
  c.Literal("\",\"logIndex\":\"");
  c.Quantity(f.log_index);
  c.Literal("\",\"removed\":false}");
  out->append(buf, static_cast<size_t>(c.position() - buf));
}

void LogRenderer::AppendBlockLogsJson(uint64_t block, uint32_t version, uint32_t count,
                                      bool comma, std::string* out) const {
  char block_hash[64];  // the same in every log of the block
  WriteHex64(block, version, 1, block_hash);
  for (uint32_t i = 0; i < count; ++i) {
    if (comma || i > 0) out->push_back(',');
    AppendLogJson(Make(block, version, i), block_hash, out);
  }
}

handoff::v1::EventRow LogRenderer::Log(uint64_t block, uint32_t version,
                                       uint32_t log_index) const {
  Fields f = Make(block, version, log_index);
  handoff::v1::EventRow row;
  row.set_block_number(block);
  row.set_log_index(log_index);
  row.set_block_hash(BlockHash(block, version));
  row.set_address(*f.address);
  row.add_topics(*f.topic0);
  row.add_topics("0x" + pool_.substr(f.topic1, 64));
  row.add_topics("0x" + pool_.substr(f.topic2, 64));
  row.set_data("0x" + pool_.substr(f.data_off, f.data_hex_len));
  std::string tx = "0x";
  AppendHex64(block, version, 1000 + log_index / 2, &tx);
  row.set_transaction_hash(tx);
  row.set_transaction_index(log_index / 2);
  return row;
}

}  // namespace handoff::sim
