#include "sim/log_render.h"

#include <cstring>

namespace handoff::sim {
namespace {

constexpr char kDigits[] = "0123456789abcdef";
constexpr size_t kPoolSize = 1 << 16;
constexpr size_t kDataBytes[] = {64, 128, 128, 192};

void AppendHexU64Fixed(uint64_t v, std::string* out) {
  char buf[16];
  for (int i = 15; i >= 0; --i) {
    buf[i] = kDigits[v & 0xf];
    v >>= 4;
  }
  out->append(buf, 16);
}

// JSON-RPC quantity: "0x" + minimal hex digits.
void AppendQuantity(uint64_t v, std::string* out) {
  char buf[18];
  int n = 0;
  do {
    buf[17 - n] = kDigits[v & 0xf];
    v >>= 4;
    ++n;
  } while (v != 0);
  out->append("0x", 2);
  out->append(buf + 18 - n, n);
}

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
  // 16 digits of a bijection of (block, version) keep the hash unique; 48 from the pool.
  uint64_t key = (block << 20) ^ version;
  AppendHexU64Fixed(Mix64(key ^ Mix64(seed_ + salt)), out);
  out->append(pool_, Mix64(key + salt * 0x9e37) % (kPoolSize - 48), 48);
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
  Fields f = Make(block, version, log_index);
  out->append("{\"address\":\"");
  out->append(*f.address);
  out->append("\",\"topics\":[\"");
  out->append(*f.topic0);
  out->append("\",\"0x");
  out->append(pool_, f.topic1, 64);
  out->append("\",\"0x");
  out->append(pool_, f.topic2, 64);
  out->append("\"],\"data\":\"0x");
  out->append(pool_, f.data_off, f.data_hex_len);
  out->append("\",\"blockNumber\":\"");
  AppendQuantity(block, out);
  out->append("\",\"blockHash\":\"0x");
  AppendHex64(block, version, 1, out);
  out->append("\",\"transactionHash\":\"0x");
  AppendHex64(block, version, 1000 + log_index / 2, out);
  out->append("\",\"transactionIndex\":\"");
  AppendQuantity(log_index / 2, out);
  out->append("\",\"logIndex\":\"");
  AppendQuantity(log_index, out);
  out->append("\",\"removed\":false}");
}

void LogRenderer::AppendBlockLogsJson(uint64_t block, uint32_t version, uint32_t count,
                                      bool comma, std::string* out) const {
  for (uint32_t i = 0; i < count; ++i) {
    if (comma || i > 0) out->push_back(',');
    AppendLogJson(block, version, i, out);
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
