#include "server/logging.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace handoff::server {
namespace {

TEST(ParseLogLevelTest, KnownAndUnknown) {
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("INFO"), LogLevel::kInfo);
  EXPECT_EQ(*ParseLogLevel("warn"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("error"), LogLevel::kError);
  const auto bad = ParseLogLevel("loud");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("log_level"), absl::string_view::npos);
}

TEST(JsonQuoteTest, EscapesQuotesBackslashesAndControls) {
  EXPECT_EQ(JsonQuote("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\u0001\"");
}

TEST(LoggerTest, OneJsonObjectPerLineWithFieldsInOrder) {
  std::vector<std::string> lines;
  Logger logger(LogLevel::kInfo, [&](absl::string_view line) { lines.emplace_back(line); });
  logger.Info("state change", {{"source_id", "s-1"}, {"state", "SOURCE_STATE_RUNNING"}});
  ASSERT_EQ(lines.size(), 1u);
  const std::string& line = lines[0];
  EXPECT_EQ(line.rfind("{\"ts\":\"", 0), 0u) << line;
  EXPECT_NE(line.find("\"level\":\"info\",\"msg\":\"state change\",\"source_id\":\"s-1\","
                      "\"state\":\"SOURCE_STATE_RUNNING\"}"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

TEST(LoggerTest, DropsLinesBelowLevel) {
  std::vector<std::string> lines;
  Logger logger(LogLevel::kWarning, [&](absl::string_view line) { lines.emplace_back(line); });
  logger.Debug("d");
  logger.Info("i");
  logger.Warning("w");
  logger.Error("e");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("\"level\":\"warning\""), std::string::npos);
  EXPECT_NE(lines[1].find("\"level\":\"error\""), std::string::npos);
}

TEST(LoggingObserverTest, LogsStateChangesAndErrorsWithSourceId) {
  std::vector<std::string> lines;
  Logger logger(LogLevel::kDebug, [&](absl::string_view line) { lines.emplace_back(line); });
  LoggingObserver observer(&logger);
  observer.OnStateChange("src", handoff::v1::SOURCE_STATE_AUTH_FAILED, "provider said 401");
  observer.OnError("src", absl::UnavailableError("disk full"));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("\"level\":\"warning\""), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("\"source_id\":\"src\""), std::string::npos);
  EXPECT_NE(lines[0].find("SOURCE_STATE_AUTH_FAILED"), std::string::npos);
  EXPECT_NE(lines[1].find("\"code\":\"UNAVAILABLE\""), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("\"error\":\"disk full\""), std::string::npos);
}

}  // namespace
}  // namespace handoff::server
