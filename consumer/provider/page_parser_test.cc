#include "consumer/provider/page_parser.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "consumer/memory_bound.h"
#include "consumer/row_pool.h"
#include "gtest/gtest.h"
#include "store/row_codec.h"

namespace handoff::consumer {
namespace {

const std::string kHash(64, 'a');
const std::string kTopic(64, 'b');
const std::string kAddr(40, 'c');

std::string Log(const std::string& block, const std::string& log_index) {
  return absl::StrCat(R"({"address":"0x)", kAddr, R"(","topics":["0x)", kTopic, R"(","0x)",
                      kTopic, R"("],"data":"0x00ff","blockNumber":")", block,
                      R"(","blockHash":"0x)", kHash, R"(","transactionHash":"0x)", kHash,
                      R"(","transactionIndex":"0x3","logIndex":")", log_index,
                      R"(","removed":false})");
}

std::string PageJson(const std::string& items) {
  return absl::StrCat(R"({"from":1200,"through":{"number":1210,"hash":"0x)", kHash,
                      R"("},"next":"abc","reorg":false,"safe":{"number":"1190","hash":"0x)",
                      kHash, R"("},"finalized":null,"tip":1300,"items":[)", items, "]}");
}

std::string ValidPage() { return PageJson(Log("0x4b0", "0x0") + "," + Log("0x4b1", "0x1f")); }

TEST(PageParserTest, ParsesValidPage) {
  absl::StatusOr<Page> page = ParsePage(ValidPage());
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->from, 1200u);
  ASSERT_TRUE(page->through.has_value());
  EXPECT_EQ(page->through->number, 1210u);
  EXPECT_EQ(page->through->hash, "0x" + kHash);
  EXPECT_EQ(page->next, "abc");
  EXPECT_FALSE(page->reorg);
  ASSERT_TRUE(page->safe.has_value());
  EXPECT_EQ(page->safe->number, 1190u);
  EXPECT_FALSE(page->finalized.has_value());
  EXPECT_EQ(page->tip, 1300u);
  ASSERT_EQ(page->items.size(), 2u);
  const auto& row = page->items[1];
  EXPECT_EQ(row.block_number(), 0x4b1u);
  EXPECT_EQ(row.log_index(), 0x1fu);
  EXPECT_EQ(row.transaction_index(), 3u);
  EXPECT_EQ(row.address(), "0x" + kAddr);
  EXPECT_EQ(row.block_hash(), "0x" + kHash);
  EXPECT_EQ(row.transaction_hash(), "0x" + kHash);
  ASSERT_EQ(row.topics_size(), 2);
  EXPECT_EQ(row.topics(0), "0x" + kTopic);
  EXPECT_EQ(row.data(), "0x00ff");
  EXPECT_EQ(page->wire_bytes, ValidPage().size());
}

TEST(PageParserTest, ItemsArriveEncodedForTheCommitPath) {
  absl::StatusOr<Page> page = ParsePage(ValidPage());
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_TRUE(page->has_encoded_items());
  for (size_t i = 0; i < page->items.size(); ++i) {
    EXPECT_EQ(page->EncodedItem(i), store::EncodeRow(page->items[i])) << i;
  }
  EXPECT_TRUE(page->EncodedItem(page->items.size()).empty());
  Page built;  // a page made without the parser serializes on demand
  built.items.push_back(page->items[0]);
  EXPECT_FALSE(built.has_encoded_items());
  EXPECT_TRUE(built.EncodedItem(0).empty());
}

// Rows recycled from a finished page (RowPool) carry nothing into the next page: a page
// parsed onto them equals the same page parsed onto fresh rows.
TEST(PageParserTest, RecycledRowsCarryNothingOver) {
  absl::StatusOr<Page> fresh = ParsePage(ValidPage());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  std::vector<handoff::v1::EventRow> used(5);
  for (handoff::v1::EventRow& row : used) {
    row.set_block_number(99);
    row.set_data("0x" + std::string(500, 'e'));
    for (int t = 0; t < 4; ++t) row.add_topics("0x" + std::string(64, '9'));
  }
  RowPool::Default().Give(std::move(used));
  absl::StatusOr<Page> page = ParsePage(ValidPage());
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->items.size(), fresh->items.size());
  for (size_t i = 0; i < page->items.size(); ++i) {
    EXPECT_EQ(page->items[i].SerializeAsString(), fresh->items[i].SerializeAsString()) << i;
  }
}

// An empty page (every idle poll) leaves the pooled rows for the next page with events.
// The heap a parsed page holds, counting each string's heap block with glibc's chunk
// header (8 bytes, rounded to 16): what the memory bound in bench/REPORT.md charges.
size_t RowHeapBytes(const Page& page) {
  size_t bytes = page.items.capacity() * sizeof(handoff::v1::EventRow);
  for (const handoff::v1::EventRow& row : page.items) {
    bytes += row.SpaceUsedLong() - sizeof(handoff::v1::EventRow);
    for (const std::string* s : {&row.address(), &row.block_hash(), &row.transaction_hash(),
                                 &row.data()}) {
      if (s->capacity() > 15) bytes += 16;
    }
    bytes += 16 * (row.topics_size() + 1);
  }
  return bytes;
}

// The factors of consumer/memory_bound.h: a parsed page holds at most 2 bytes of rows
// and 1.25 bytes of encoded rows per byte of its body, whatever the items' shape (the
// smallest legal item is the worst for rows: fixed-size fields, no topics, no data).
TEST(PageParserTest, PageMemoryIsBoundedByItsWireBytes) {
  const std::string minimal = absl::StrCat(
      R"({"address":"0x)", kAddr, R"(","topics":[],"data":"0x","blockNumber":"0x1",)",
      R"("blockHash":"0x)", kHash, R"(","transactionHash":"0x)", kHash,
      R"(","transactionIndex":"0x0","logIndex":"0x0","removed":false})");
  const std::string four_topics = absl::StrReplaceAll(
      Log("0x4b0", "0x1"),
      {{"\"],\"data\"", absl::StrCat("\",\"0x", kTopic, "\",\"0x", kTopic, "\"],\"data\"")}});
  const std::string long_data = absl::StrReplaceAll(
      Log("0x4b0", "0x1"), {{"0x00ff", absl::StrCat("0x", std::string(4096, 'e'))}});
  for (const std::string* item : {&minimal, &four_topics, &long_data}) {
    for (int items : {1, 10, 1000}) {
      std::string list;
      for (int i = 0; i < items; ++i) absl::StrAppend(&list, i == 0 ? "" : ",", *item);
      const std::string json = PageJson(list);
      absl::StatusOr<Page> page = ParsePage(json);
      ASSERT_TRUE(page.ok()) << page.status();
      ASSERT_EQ(page->items.size(), static_cast<size_t>(items));
      const size_t rows = RowHeapBytes(*page);
      const size_t encoded =
          page->row_bytes.capacity() + page->row_ends.capacity() * sizeof(size_t);
      EXPECT_LE(rows, kRowBytesPerWireByte * json.size())
          << items << " items like " << item->substr(0, 60);
      EXPECT_LE(encoded, kEncodedBytesPerWireByte * json.size())
          << items << " items like " << item->substr(0, 60);
      RecordProperty(absl::StrCat("rows_per_wire_byte_", items, "_", item->size()),
                     absl::StrCat(static_cast<double>(rows) / json.size()));
    }
  }
}

TEST(PageParserTest, EmptyPageLeavesThePooledRows) {
  RowPool::Default().Give(std::vector<handoff::v1::EventRow>(3));
  const size_t held = RowPool::Default().held();
  ASSERT_GE(held, 1u);
  absl::StatusOr<Page> page = ParsePage(PageJson(""));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(page->items.empty());
  EXPECT_EQ(RowPool::Default().held(), held);
}

TEST(PageParserTest, ReusedParserAndOwnedBuffer) {
  PageParser parser;
  for (int i = 0; i < 3; ++i) {
    std::string body = ValidPage();
    absl::StatusOr<Page> page = parser.ParseOwned(&body);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_EQ(page->items.size(), 2u);
    EXPECT_EQ(body, ValidPage());
  }
  EXPECT_FALSE(parser.Parse("{").ok());
  EXPECT_TRUE(parser.Parse(ValidPage()).ok());
}

// Every parse borrows one of the process's shared simdjson parsers: however many
// threads parse at once, no more than DomParsers() exist, and all are back afterwards.
TEST(PageParserTest, ConcurrentParsesShareAtMostDomParsers) {
  const std::string json = ValidPage();
  const int kThreads = 3 * static_cast<int>(DomParsers());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      PageParser parser;
      for (int i = 0; i < 50; ++i) {
        absl::StatusOr<Page> page = parser.Parse(json);
        if (!page.ok() || page->items.size() != 2) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  const PageParser::SharedParsers counts = PageParser::SharedParserCounts();
  EXPECT_GE(counts.created, 1u);
  EXPECT_LE(counts.created, DomParsers());
  EXPECT_EQ(counts.idle, counts.created);
}

TEST(PageParserTest, NullsAndEmptyItems) {
  std::string json = R"({"from":"7","through":null,"next":"n","reorg":true,"safe":null,)"
                     R"("finalized":null,"tip":null,"items":[]})";
  absl::StatusOr<Page> page = ParsePage(json);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->from, 7u);
  EXPECT_TRUE(page->reorg);
  EXPECT_FALSE(page->through.has_value());
  EXPECT_FALSE(page->safe.has_value());
  EXPECT_FALSE(page->tip.has_value());
  EXPECT_TRUE(page->items.empty());
}

TEST(PageParserTest, LargeNumbers) {
  std::string json = absl::StrCat(
      R"({"from":"9223372036854775807","through":{"number":4294967296,"hash":"0x)", kHash,
      R"("},"next":"n","reorg":false,"safe":null,"finalized":null,"tip":"4294967297","items":[)",
      Log("0xffffffffffffffff", "0x100000000"), "]}");
  absl::StatusOr<Page> page = ParsePage(json);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->from, 9223372036854775807u);
  EXPECT_EQ(page->through->number, 4294967296u);
  EXPECT_EQ(page->tip, 4294967297u);
  EXPECT_EQ(page->items[0].block_number(), 0xffffffffffffffffu);
  EXPECT_EQ(page->items[0].log_index(), 0x100000000u);
}

struct BadCase {
  std::string json;
  std::string message_prefix;
};

void ExpectRejected(const BadCase& c) {
  absl::StatusOr<Page> page = ParsePage(c.json);
  ASSERT_FALSE(page.ok()) << c.json;
  EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(page.status().message().substr(0, c.message_prefix.size()), c.message_prefix)
      << page.status().message();
}

std::string Replace(const std::string& json, const std::string& from, const std::string& to) {
  std::string out = json;
  size_t pos = out.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  out.replace(pos, from.size(), to);
  return out;
}

TEST(PageParserTest, PageFieldErrorsNameTheField) {
  std::string v = ValidPage();
  std::vector<BadCase> cases = {
      {Replace(v, R"("from":1200)", R"("from":-1)"), "from: expected decimal"},
      {Replace(v, R"("from":1200)", R"("from":1.5)"), "from: expected decimal"},
      {Replace(v, R"("from":1200)", R"("from":"9223372036854775808")"), "from: expected"},
      {Replace(v, R"("from":1200)", R"("from":9223372036854775808)"), "from: expected"},
      {Replace(v, R"("from":1200)", R"("from":"12a")"), "from: expected"},
      {Replace(v, R"("from":1200)", R"("from":"")"), "from: expected"},
      {Replace(v, R"("from":1200)", R"("from":null)"), "from: expected"},
      {Replace(v, R"("from":1200,)", ""), "from: missing"},
      {Replace(v, R"("next":"abc")", R"("next":5)"), "next: expected string"},
      {Replace(v, R"("next":"abc",)", ""), "next: missing"},
      {Replace(v, R"("next":"abc")", R"("next":"abc\r\nX-Injected: 1")"),
       "next: control character"},
      {Replace(v, R"("next":"abc")", R"("next":"a\u0000b")"), "next: control character"},
      {Replace(v, R"("next":"abc")", R"("next":"a\u007fb")"), "next: control character"},
      {Replace(v, R"("reorg":false)", R"("reorg":"no")"), "reorg: expected boolean"},
      {Replace(v, R"("reorg":false,)", ""), "reorg: missing"},
      {Replace(v, R"("tip":1300)", R"("tip":"x")"), "tip: expected decimal"},
      {Replace(v, R"("tip":1300,)", ""), "tip: missing"},
      {Replace(v, R"("finalized":null,)", ""), "finalized: missing"},
      {Replace(v, R"("finalized":null)", R"("finalized":5)"), "finalized: expected"},
      {Replace(v, R"("number":1210)", R"("number":"x")"), "through.number: expected"},
      {Replace(v, R"("number":1210,)", ""), "through.number: missing"},
      {Replace(v, R"({"number":1210,"hash":"0x)", R"({"number":1210,"hash":"0xz)"),
       "through.hash: expected"},
      {Replace(v, R"({"number":1210,"hash":"0x)" + kHash,
               R"({"number":1210,"hash":"0x)" + kHash.substr(1) + "z"),
       "through.hash: expected"},
      {Replace(v, R"("number":"1190","hash":"0x)" + kHash + "\"", R"("number":"1190")"),
       "safe.hash: missing"},
      {Replace(v, R"("through":{)", R"("through":"x","t2":{)"), "through: expected"},
      {PageJson(""), ""},  // valid: empty items
      {Replace(v, R"("items":[)", R"("items":{"a":[)") + "}", "items: expected array"},
      {v + "x", "page: "},
      {v.substr(0, v.size() - 1), ""},
      {"[]", "page: expected JSON object"},
      {"", "page: invalid JSON"},
  };
  for (const auto& c : cases) {
    if (c.message_prefix.empty() && c.json == PageJson("")) {
      EXPECT_TRUE(ParsePage(c.json).ok());
      continue;
    }
    ExpectRejected(c);
  }
}

TEST(PageParserTest, ItemFieldErrorsNameTheField) {
  std::string good = Log("0x1", "0x2");
  auto page_with_third = [&](const std::string& item) {
    return PageJson(good + "," + good + "," + good + "," + item);
  };
  std::vector<std::pair<std::string, std::string>> edits = {
      {R"("logIndex":"0x2")", R"("logIndex":2)"},
      {R"("logIndex":"0x2")", R"("logIndex":"0x")"},
      {R"("logIndex":"0x2")", R"("logIndex":"2")"},
      {R"("logIndex":"0x2")", R"("logIndex":"0x1g")"},
      {R"("logIndex":"0x2")", R"("logIndex":"0x10000000000000000")"},
      {R"("logIndex":"0x2",)", ""},
      {R"("blockNumber":"0x1")", R"("blockNumber":null)"},
      {R"("blockNumber":"0x1",)", ""},
      {R"("transactionIndex":"0x3")", R"("transactionIndex":"0X3")"},
      {R"("address":"0x)" + kAddr, R"("address":"0x)" + kAddr + "0"},
      {R"("address":"0x)" + kAddr, R"("address":"0x)" + kAddr.substr(1)},
      {R"("data":"0x00ff")", R"("data":"0x0ff")"},
      {R"("data":"0x00ff")", R"("data":"00ff")"},
      {R"("data":"0x00ff",)", ""},
      {R"("blockHash":"0x)" + kHash, R"("blockHash":"0x)" + kHash.substr(2) + "\\u0067a"},
      {R"("transactionHash":"0x)", R"("transactionHash":"0x0)"},
      {R"("topics":[)", R"("topics":"x","y":[)"},
      {R"("removed":false)", R"("removed":true)"},
      {R"("removed":false)", R"("removed":0)"},
  };
  std::vector<std::string> fields = {
      "logIndex", "logIndex", "logIndex",        "logIndex",  "logIndex", "logIndex",
      "blockNumber", "blockNumber", "transactionIndex", "address", "address", "data",
      "data",     "data",     "blockHash",       "transactionHash", "topics", "removed",
      "removed"};
  ASSERT_EQ(edits.size(), fields.size());
  for (size_t i = 0; i < edits.size(); ++i) {
    std::string item = Replace(good, edits[i].first, edits[i].second);
    ExpectRejected({page_with_third(item), "items[3]." + fields[i] + ": "});
  }
  // A bad topic is named with its index.
  std::string bad_topic =
      Replace(good, R"(","0x)" + kTopic + "\"]", R"(","0x)" + kTopic.substr(1) + "\"]");
  ExpectRejected({page_with_third(bad_topic), "items[3].topics[1]: expected"});
  ExpectRejected({PageJson(good + ",5"), "items[1]: expected log object"});
  // Unknown fields are ignored.
  EXPECT_TRUE(ParsePage(PageJson(Replace(good, "{", R"({"extra":{"a":[1,2]},)"))).ok());
  EXPECT_TRUE(ParsePage(Replace(ValidPage(), "{", R"({"extra":[true],)")).ok());
  // Missing removed is fine; upper-case hex digits are fine.
  EXPECT_TRUE(ParsePage(PageJson(Replace(good, R"(,"removed":false)", ""))).ok());
  EXPECT_TRUE(ParsePage(PageJson(Replace(good, R"("0x00ff")", R"("0xABCD")"))).ok());
  EXPECT_TRUE(ParsePage(PageJson(Replace(good, R"("0x00ff")", R"("0x")"))).ok());
}

// The encoder checks lowercase digits as it decodes them and the parser checks the rest:
// a non-hex digit is refused in every hex field, next to upper-case digits or not, and
// upper-case digits are accepted and kept as received.
TEST(PageParserTest, HexDigitsAreCheckedWhateverTheirCase) {
  const std::string good = Log("0x1", "0x2");
  struct HexField {
    std::string text;   // the field's value in `good`, quotes included
    std::string name;   // as named in the error
  };
  const std::string topic1 = R"(","0x)" + kTopic + "\"]";
  const std::vector<HexField> fields = {
      {R"("0x)" + kAddr + "\"", "address"},
      {R"("0x00ff")", "data"},
      {R"("blockHash":"0x)" + kHash + "\"", "blockHash"},
      {R"("transactionHash":"0x)" + kHash + "\"", "transactionHash"},
  };
  // Replaces the last digit of `field` in `item` with `digit`.
  auto with_last_digit = [](const std::string& item, const std::string& field, char digit) {
    std::string changed = field;
    changed[changed.rfind('"') - 1] = digit;
    return Replace(item, field, changed);
  };
  for (const HexField& f : fields) {
    SCOPED_TRACE(f.name);
    const std::string bad = with_last_digit(good, f.text, 'g');
    ExpectRejected({PageJson(good + "," + bad), "items[1]." + f.name + ": expected"});
    // Beside a field the encoder keeps verbatim (upper case): the same refusal.
    for (const HexField& other : fields) {
      if (other.name == f.name) continue;
      const std::string upper = with_last_digit(bad, other.text, 'F');
      ExpectRejected({PageJson(good + "," + upper), "items[1]." + f.name + ": expected"});
    }
    // Upper case alone is hex: accepted, and the text is kept as received.
    const std::string upper = with_last_digit(good, f.text, 'F');
    absl::StatusOr<Page> page = ParsePage(PageJson(good + "," + upper));
    ASSERT_TRUE(page.ok()) << page.status();
    const handoff::v1::EventRow& row = page->items[1];
    const std::string expected = f.text.substr(f.text.rfind("\"0x") + 1,
                                               f.text.rfind('"') - f.text.rfind("\"0x") - 2) +
                                 "F";
    const std::string& kept = f.name == "address"     ? row.address()
                              : f.name == "data"      ? row.data()
                              : f.name == "blockHash" ? row.block_hash()
                                                      : row.transaction_hash();
    EXPECT_EQ(kept, expected);
    handoff::v1::EventRow decoded;
    ASSERT_TRUE(store::DecodeRow(page->EncodedItem(1), &decoded).ok());
    EXPECT_EQ(decoded.SerializeAsString(), row.SerializeAsString());
  }
  // A topic: named with its index, upper case elsewhere or not.
  const std::string bad_topic = with_last_digit(good, topic1, 'g');
  ExpectRejected({PageJson(good + "," + bad_topic), "items[1].topics[1]: expected"});
  ExpectRejected({PageJson(good + "," + with_last_digit(bad_topic, fields[1].text, 'F')),
                  "items[1].topics[1]: expected"});
  EXPECT_TRUE(ParsePage(PageJson(good + "," + with_last_digit(good, topic1, 'F'))).ok());
}

TEST(PageParserTest, DuplicateFieldsRejected) {
  ExpectRejected({Replace(ValidPage(), R"("from":1200)", R"("from":1200,"from":1201)"),
                  "from: duplicate field"});
}

}  // namespace
}  // namespace handoff::consumer
