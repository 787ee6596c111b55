#include "consumer/provider/sse_parser.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace handoff::consumer {
namespace {

struct Collected {
  std::vector<SseFrame> frames;
  SseParser::FrameCallback Callback() {
    return [this](SseFrame&& f) { frames.push_back(std::move(f)); };
  }
};

std::string Describe(const SseFrame& f) {
  std::string out = "id=" + (f.has_id ? f.id : std::string("<none>")) + " event=" + f.event +
                    " data=" + (f.has_data ? f.data : std::string("<none>"));
  if (f.retry_ms) out += " retry=" + std::to_string(*f.retry_ms);
  return out;
}

std::vector<std::string> Parse(const std::vector<std::string>& chunks, size_t max = 1 << 20) {
  SseParser parser(max);
  Collected c;
  for (const auto& chunk : chunks) EXPECT_TRUE(parser.Feed(chunk, c.Callback()).ok());
  std::vector<std::string> out;
  for (const auto& f : c.frames) out.push_back(Describe(f));
  return out;
}

// Every feature at once; LF, CRLF and CR endings mixed.
const char kStream[] =
    ": comment line\n"
    "id: c1\n"
    "data: {\"a\":1}\n"
    "\n"
    "id:c2\r\n"
    "data: line one\r\n"
    "data:line two\r\n"
    "data\r\n"
    "\r\n"
    "event: error\r"
    "data: {\"error\":\"chain_unavailable\",\"retry_after\":5}\r"
    "retry: 60000\r"
    "\r"
    "unknown: field\n"
    ": only comments and unknown fields do not dispatch\n"
    "\n"
    "retry: soon\n"
    "id: has\0nul\n"
    "data:  two spaces\n"
    "\n"
    "id: trailing\n"
    "data: incomplete frame";

const std::vector<std::string> kExpected = {
    "id=c1 event= data={\"a\":1}",
    "id=c2 event= data=line one\nline two\n",
    "id=<none> event=error data={\"error\":\"chain_unavailable\",\"retry_after\":5} retry=60000",
    "id=<none> event= data= two spaces",
};

std::string Stream() { return std::string(kStream, sizeof(kStream) - 1); }

TEST(SseParserTest, WholeStream) { EXPECT_EQ(Parse({Stream()}), kExpected); }

TEST(SseParserTest, SplitAtEveryOffset) {
  const std::string s = Stream();
  for (size_t i = 0; i <= s.size(); ++i) {
    EXPECT_EQ(Parse({s.substr(0, i), s.substr(i)}), kExpected) << "split at " << i;
  }
}

TEST(SseParserTest, SplitAtEveryPairOfOffsets) {
  const std::string s = Stream();
  for (size_t i = 0; i <= s.size(); ++i) {
    for (size_t j = i; j <= s.size(); j += 3) {
      ASSERT_EQ(Parse({s.substr(0, i), s.substr(i, j - i), s.substr(j)}), kExpected)
          << "split at " << i << "," << j;
    }
  }
}

TEST(SseParserTest, ByteByByte) {
  const std::string s = Stream();
  std::vector<std::string> chunks;
  for (char c : s) chunks.emplace_back(1, c);
  EXPECT_EQ(Parse(chunks), kExpected);
}

TEST(SseParserTest, CrLfSplitAcrossChunksIsOneLineEnding) {
  // "data: x\r" | "\n" | "\n": CRLF then LF: one frame, not two blank lines.
  EXPECT_EQ(Parse({"data: x\r", "\n", "data: y\r", "\n", "\r\n"}),
            std::vector<std::string>{"id=<none> event= data=x\ny"});
  // CR CR: the second CR is a blank line.
  EXPECT_EQ(Parse({"data: x\r", "\r"}), std::vector<std::string>{"id=<none> event= data=x"});
}

TEST(SseParserTest, IncompleteTrailingFrameIsReportedAndDiscarded) {
  SseParser parser(1024);
  Collected c;
  ASSERT_TRUE(parser.Feed("id: 1\ndata: {}\n\nid: 2\ndata: {\"trunc", c.Callback()).ok());
  EXPECT_EQ(c.frames.size(), 1u);
  EXPECT_TRUE(parser.HasPartialFrame());
  parser.Reset();
  EXPECT_FALSE(parser.HasPartialFrame());
  ASSERT_TRUE(parser.Feed("\n\n", c.Callback()).ok());  // nothing left to dispatch
  EXPECT_EQ(c.frames.size(), 1u);
  // A complete line without its blank line is still partial.
  ASSERT_TRUE(parser.Feed("data: x\n", c.Callback()).ok());
  EXPECT_TRUE(parser.HasPartialFrame());
}

TEST(SseParserTest, OversizedFrameIsAnErrorWithoutBuffering) {
  SseParser parser(100);
  Collected c;
  ASSERT_TRUE(parser.Feed("data: small\n\n", c.Callback()).ok());
  std::string big(64, 'x');
  ASSERT_TRUE(parser.Feed("data: " + big, c.Callback()).ok());
  absl::Status s = parser.Feed(big, c.Callback());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(parser.Feed("\n\n", c.Callback()).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(c.frames.size(), 1u);
  parser.Reset();
  ASSERT_TRUE(parser.Feed("data: ok\n\n", c.Callback()).ok());
  EXPECT_EQ(c.frames.size(), 2u);
  // Many data lines adding up past the limit fail too.
  SseParser lines(100);
  absl::Status st;
  for (int i = 0; i < 20 && st.ok(); ++i) st = lines.Feed("data: 0123456789\n", c.Callback());
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
}

TEST(SseParserTest, LargeFrameInSmallChunks) {
  std::string payload(300000, 'p');
  std::string s = "id: big\ndata: " + payload + "\n\n";
  SseParser parser(1 << 20);
  Collected c;
  for (size_t i = 0; i < s.size(); i += 4096) {
    ASSERT_TRUE(parser.Feed(s.substr(i, 4096), c.Callback()).ok());
  }
  ASSERT_EQ(c.frames.size(), 1u);
  EXPECT_EQ(c.frames[0].data, payload);
  EXPECT_EQ(c.frames[0].id, "big");
}

// Data lines that arrive in pieces go straight to the frame's data (not gathered as
// lines first); several of them still join with '\n', and a line cut inside "data:"
// or right after the colon keeps the one optional space rule.
TEST(SseParserTest, DataLinesStreamedAcrossChunks) {
  EXPECT_EQ(Parse({"id: 1\ndata: ab", "c\ndata: de", "f\n\n"}),
            std::vector<std::string>{"id=1 event= data=abc\ndef"});
  EXPECT_EQ(Parse({"da", "ta:", " ", " x", "y\r", "\n\r\n"}),
            std::vector<std::string>{"id=<none> event= data= xy"});
  EXPECT_EQ(Parse({"data: ", "", "z\n", "\n"}),
            std::vector<std::string>{"id=<none> event= data=z"});
}

// The frame's data always has `slack` spare bytes (the JSON parser's padding), and a
// buffer given back is where the next frame's data is written: a page is copied once.
TEST(SseParserTest, DataKeepsSlackAndReusesAGivenBackBuffer) {
  constexpr size_t kSlack = 64;
  SseParser parser(1 << 20, kSlack);
  std::string payload(200000, 'q');
  std::vector<const char*> buffers;
  for (int round = 0; round < 3; ++round) {
    std::string s = "data: " + payload + "\n\n";
    int frames = 0;
    for (size_t i = 0; i < s.size(); i += 1500) {
      ASSERT_TRUE(parser
                      .Feed(s.substr(i, 1500),
                            [&](SseFrame&& f) {
                              ++frames;
                              EXPECT_EQ(f.data, payload);
                              EXPECT_GE(f.data.capacity(), f.data.size() + kSlack);
                              buffers.push_back(f.data.data());
                              parser.GiveBack(std::move(f.data));
                            })
                      .ok());
    }
    EXPECT_EQ(frames, 1);
  }
  ASSERT_EQ(buffers.size(), 3u);
  EXPECT_EQ(buffers[1], buffers[0]);
  EXPECT_EQ(buffers[2], buffers[0]);
  // A frame in one chunk: its data is sized at once, slack included.
  SseParser whole(1 << 20, kSlack);
  size_t capacity = 0;
  ASSERT_TRUE(whole.Feed("data: " + payload + "\n\n",
                         [&](SseFrame&& f) { capacity = f.data.capacity(); })
                  .ok());
  EXPECT_GE(capacity, payload.size() + kSlack);
}

// A UTF-8 byte order mark at the very start of the stream is dropped (the SSE spec's
// UTF-8 decode drops one), however the first reads split it; one mark only, and only
// there. Before, it became part of the first field's name: a control was read as a page
// frame, and a page whose first line was its data was not dispatched at all.
TEST(SseParserTest, OneLeadingByteOrderMarkIsDropped) {
  const std::string bom = "\xEF\xBB\xBF";
  const std::string control =
      bom + "event: error\ndata: {\"error\":\"resync_required\"}\n\n";
  const std::string page = bom + "data: {\"a\":1}\nid: c1\n\n";
  const std::vector<std::string> want_control = {
      "id=<none> event=error data={\"error\":\"resync_required\"}"};
  const std::vector<std::string> want_page = {"id=c1 event= data={\"a\":1}"};
  for (size_t i = 0; i <= 4; ++i) {  // inside the mark and just after it
    EXPECT_EQ(Parse({control.substr(0, i), control.substr(i)}), want_control) << "split at " << i;
    EXPECT_EQ(Parse({page.substr(0, i), page.substr(i)}), want_page) << "split at " << i;
  }
  EXPECT_EQ(Parse({"\xEF", "\xBB", "\xBF", "data: {\"a\":1}\nid: c1\n\n"}), want_page);
  const std::string s = bom + Stream();
  for (size_t i = 0; i <= s.size(); ++i) {
    EXPECT_EQ(Parse({s.substr(0, i), s.substr(i)}), kExpected) << "split at " << i;
  }
  // A second mark, or one later in the stream, is part of a field name (unknown).
  EXPECT_EQ(Parse({bom + bom + "data: x\n\n"}), std::vector<std::string>{});
  EXPECT_EQ(Parse({"\n" + bom + "data: x\n\n"}), std::vector<std::string>{});
  EXPECT_EQ(Parse({"data: x\n\n" + bom + "data: y\n\n"}),
            std::vector<std::string>{"id=<none> event= data=x"});
  // Bytes that only begin like a mark are kept: here they begin an unknown field's line.
  EXPECT_EQ(Parse({"\xEF\xBB", "data: x\n\n"}), std::vector<std::string>{});
  EXPECT_EQ(Parse({"\xEF", "\ndata: x\n\n"}),
            std::vector<std::string>{"id=<none> event= data=x"});
  // A new connection (Reset) starts a new stream, which may begin with a mark again.
  SseParser parser(1024);
  Collected c;
  ASSERT_TRUE(parser.Feed(page, c.Callback()).ok());
  parser.Reset();
  ASSERT_TRUE(parser.Feed(page, c.Callback()).ok());
  ASSERT_EQ(c.frames.size(), 2u);
  EXPECT_EQ(Describe(c.frames[1]), want_page[0]);
}

}  // namespace
}  // namespace handoff::consumer
