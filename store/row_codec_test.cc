#include "store/row_codec.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "store/records.pb.h"

namespace handoff::store {
namespace {

std::string Hex(size_t bytes, char digit) { return "0x" + std::string(2 * bytes, digit); }

handoff::v1::EventRow CanonicalRow() {
  handoff::v1::EventRow row;
  row.set_block_number(1234567);
  row.set_log_index(42);
  row.set_block_hash("0x" + std::string(62, 'a') + "0f");
  row.set_address(Hex(20, '7'));
  row.add_topics(Hex(32, 'd'));
  row.add_topics("0x" + std::string(64, '0'));
  row.set_data("0x" + std::string(128, 'e') + "0123456789abcdef");
  row.set_transaction_hash(Hex(32, '5'));
  row.set_transaction_index(3);
  return row;
}

void ExpectRoundTrip(const handoff::v1::EventRow& row) {
  handoff::v1::EventRow back;
  back.set_data("stale");  // DecodeRow must clear what was there
  ASSERT_TRUE(DecodeRow(EncodeRow(row), &back).ok());
  EXPECT_EQ(back.SerializeAsString(), row.SerializeAsString()) << row.DebugString();
}

TEST(RowCodecTest, CanonicalHexIsStoredAsBytes) {
  const handoff::v1::EventRow row = CanonicalRow();
  const std::string value = EncodeRow(row);
  ASSERT_FALSE(value.empty());
  EXPECT_EQ(value[0], '\0');
  StoredRow stored;
  ASSERT_TRUE(stored.ParseFromString(value.substr(1)));
  EXPECT_EQ(stored.verbatim(), 0u);
  EXPECT_EQ(stored.address(), std::string(20, '\x77'));
  EXPECT_EQ(stored.block_hash().size(), 32u);
  EXPECT_EQ(stored.block_hash().back(), '\x0f');
  ASSERT_EQ(stored.topics_size(), 2);
  EXPECT_EQ(stored.topics(1), std::string(32, '\0'));
  EXPECT_EQ(stored.data().size(), 72u);
  // Roughly half the text's size.
  EXPECT_LT(value.size(), row.SerializeAsString().size() * 55 / 100);
  ExpectRoundTrip(row);
}

TEST(RowCodecTest, NonCanonicalTextIsKeptVerbatim) {
  handoff::v1::EventRow row = CanonicalRow();
  row.set_block_hash("0x" + std::string(64, 'A'));  // uppercase
  row.set_address("7777");                          // no 0x
  row.set_data("0xabc");                            // odd length
  row.set_transaction_hash("");                     // empty
  row.add_topics("0xZZ");                           // one bad topic: all kept as text
  const std::string value = EncodeRow(row);
  StoredRow stored;
  ASSERT_TRUE(stored.ParseFromString(value.substr(1)));
  EXPECT_EQ(stored.verbatim(), 1u | 2u | 4u | 8u | 16u);
  ExpectRoundTrip(row);
}

TEST(RowCodecTest, EdgeRowsRoundTrip) {
  ExpectRoundTrip(handoff::v1::EventRow());
  handoff::v1::EventRow row;
  row.set_data("0x");  // empty data, canonical
  row.add_topics("0x");
  row.add_topics("");
  ExpectRoundTrip(row);
  row.clear_topics();
  row.add_topics("0x");
  row.add_topics("0x");
  ExpectRoundTrip(row);
  row.set_block_number(~0ull);
  row.set_log_index(~0ull);
  row.set_transaction_index(1ull << 63);
  ExpectRoundTrip(row);
}

TEST(RowCodecTest, RandomRowsRoundTrip) {
  std::mt19937_64 rng(7);
  const std::string alphabet = "0123456789abcdefABCDEFxg \x00\xff";
  auto text = [&] {
    std::string s = (rng() % 4 == 0) ? "" : "0x";
    const size_t n = rng() % 70;
    for (size_t i = 0; i < n; ++i) {
      s.push_back(rng() % 8 == 0 ? alphabet[rng() % alphabet.size()]
                                 : "0123456789abcdef"[rng() % 16]);
    }
    return s;
  };
  for (int i = 0; i < 3000; ++i) {
    handoff::v1::EventRow row;
    row.set_block_number(rng() >> (rng() % 64));
    row.set_log_index(rng() % 1000);
    row.set_block_hash(text());
    row.set_address(text());
    const int topics = static_cast<int>(rng() % 5);
    for (int t = 0; t < topics; ++t) row.add_topics(text());
    row.set_data(text());
    row.set_transaction_hash(text());
    row.set_transaction_index(rng() % 300);
    ExpectRoundTrip(row);
  }
}

// Long data goes through the vectorized decoder (32 digits at a time) and its tail: every
// byte value decodes right, and one bad digit anywhere makes the field verbatim.
TEST(RowCodecTest, LongHexDecodesExactlyAndABadDigitAnywhereIsCaught) {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  const std::string hex = "0x" + absl::BytesToHexString(bytes);
  handoff::v1::EventRow row;
  row.set_data(hex);
  StoredRow stored;
  ASSERT_TRUE(stored.ParseFromString(EncodeRow(row).substr(1)));
  EXPECT_EQ(stored.verbatim() & 8u, 0u);  // data as bytes (the empty hashes are text)
  EXPECT_EQ(stored.data(), bytes);
  for (size_t len : {34u, 66u, 100u}) {  // 32 + 2, 64 + 2, 96 + 2 + tail
    for (size_t pos = 2; pos < len; ++pos) {
      for (char bad : {'A', 'g', '/', ':', '`', 'G', '\xff'}) {
        std::string text = hex.substr(0, len);
        text[pos] = bad;
        row.set_data(text);
        ASSERT_TRUE(stored.ParseFromString(EncodeRow(row).substr(1)));
        EXPECT_EQ(stored.verbatim() & 8u, 8u) << len << " " << pos << " " << bad;
        ExpectRoundTrip(row);
      }
    }
  }
}

// The page parser leaves the digit check of canonical rows to the encoder: its answer
// must be false whenever any hex field holds anything but lowercase hex digits.
TEST(RowCodecTest, TheAnswerSaysWhetherEveryHexFieldWasLowercaseHex) {
  std::string out;
  EXPECT_TRUE(AppendEncodedRow(CanonicalRow(), &out));
  handoff::v1::EventRow empty_data = CanonicalRow();
  empty_data.set_data("0x");
  EXPECT_TRUE(AppendEncodedRow(empty_data, &out));
  using Setter = std::string* (*)(handoff::v1::EventRow*);
  const std::vector<std::pair<const char*, Setter>> fields = {
      {"block_hash", [](handoff::v1::EventRow* r) { return r->mutable_block_hash(); }},
      {"address", [](handoff::v1::EventRow* r) { return r->mutable_address(); }},
      {"topic", [](handoff::v1::EventRow* r) { return r->mutable_topics(1); }},
      {"data", [](handoff::v1::EventRow* r) { return r->mutable_data(); }},
      {"transaction_hash", [](handoff::v1::EventRow* r) { return r->mutable_transaction_hash(); }},
  };
  for (const auto& [name, field] : fields) {
    handoff::v1::EventRow base = CanonicalRow();
    const std::string text = *field(&base);
    for (size_t pos = 0; pos < text.size(); ++pos) {
      for (char bad : {'A', 'F', 'g', '/', ':', '`', 'x', '\0', '\xff'}) {
        if (pos == 1 && bad == 'x') continue;  // that is the prefix itself
        handoff::v1::EventRow row = base;
        (*field(&row))[pos] = bad;
        EXPECT_FALSE(AppendEncodedRow(row, &out)) << name << " " << pos << " " << bad;
      }
    }
    handoff::v1::EventRow row = base;
    field(&row)->clear();
    EXPECT_FALSE(AppendEncodedRow(row, &out)) << name << " empty";
  }
}

// Stored bytes of every length across the vectorized encoder's 16-byte steps and its
// tail, holding every byte value, come back as the same lowercase hex.
TEST(RowCodecTest, EveryByteValueAndLengthDecodesToLowercaseHex) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (size_t len = 0; len <= 70; ++len) {
    for (size_t start = 0; start + len <= all.size(); start += 37) {
      const std::string bytes = all.substr(start, len);
      handoff::v1::EventRow row;
      row.set_data("0x" + absl::BytesToHexString(bytes));
      row.set_transaction_hash("0x" + absl::BytesToHexString(all.substr(256 - len, len)));
      ExpectRoundTrip(row);
    }
  }
}

TEST(RowCodecTest, ValuesInTheEarlierEventRowFormatStillDecode) {
  const handoff::v1::EventRow row = CanonicalRow();
  handoff::v1::EventRow back;
  ASSERT_TRUE(DecodeRow(row.SerializeAsString(), &back).ok());
  EXPECT_EQ(back.SerializeAsString(), row.SerializeAsString());
  ASSERT_TRUE(DecodeRow("", &back).ok());  // an all-default EventRow
  EXPECT_EQ(back.block_number(), 0u);
}

TEST(RowCodecTest, UnreadableValuesAreDataLoss) {
  handoff::v1::EventRow back;
  EXPECT_EQ(DecodeRow(std::string("\0\xff\xff\xff", 4), &back).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeRow("\x1a\x05" "ab", &back).code(), absl::StatusCode::kDataLoss);
  // Truncated: a stored row cut short.
  const std::string value = EncodeRow(CanonicalRow());
  EXPECT_EQ(DecodeRow(value.substr(0, value.size() - 3), &back).code(),
            absl::StatusCode::kDataLoss);
}

// One decoder over a scan of unlike rows (canonical and verbatim fields, more and fewer
// topics, the earlier format, a bad value between them), each into a row that held the
// one before: every row comes out as DecodeRow alone gives it, nothing carried over.
TEST(RowCodecTest, ADecoderReusedOverAScanDecodesEachRowAlone) {
  std::mt19937_64 rng(11);
  std::vector<std::string> values;
  for (int i = 0; i < 200; ++i) {
    handoff::v1::EventRow row = CanonicalRow();
    row.set_block_number(i);
    row.clear_topics();
    for (int t = 0; t < static_cast<int>(rng() % 5); ++t) row.add_topics(Hex(32, 'c'));
    row.set_data("0x" + std::string(2 * (rng() % 300), '9'));
    if (i % 7 == 0) row.set_address("not hex");
    if (i % 11 == 0) row.clear_transaction_hash();
    values.push_back(i % 13 == 0 ? row.SerializeAsString() : EncodeRow(row));
    if (i % 17 == 0) values.push_back(std::string("\0\xff\xff\xff", 4));
  }
  RowDecoder decoder;
  handoff::v1::EventRow reused;
  for (const std::string& value : values) {
    handoff::v1::EventRow alone;
    const absl::Status expected = DecodeRow(value, &alone);
    const absl::Status got = decoder.Decode(value, &reused);
    ASSERT_EQ(got.code(), expected.code());
    if (expected.ok()) EXPECT_EQ(reused.SerializeAsString(), alone.SerializeAsString());
  }
}

}  // namespace
}  // namespace handoff::store
