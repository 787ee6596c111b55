// Structured logs: one JSON object a line on stderr, e.g.
//   {"ts":"2024-05-01T12:00:00.123Z","level":"info","msg":"state change",
//    "source_id":"mainnet-usdc","state":"SOURCE_STATE_RUNNING"}
// "ts", "level" and "msg" come first; the remaining keys are the caller's fields, in the
// order given. Lines below the configured level are dropped.
//
// Invariant: nothing logged here ever carries a secret. Callers log ids, states, codes
// and core status messages (which never contain a secret); a bearer token or provider key
// is never passed to a Logger.
//
// Logger is thread-safe: a line is formatted outside the lock and written whole.
#ifndef HANDOFF_SERVER_LOGGING_H_
#define HANDOFF_SERVER_LOGGING_H_

#include <functional>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "consumer/observer.h"

namespace handoff::server {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// "debug", "info", "warning" (or "warn"), "error"; INVALID_ARGUMENT otherwise.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);
absl::string_view LogLevelName(LogLevel level);

using LogFields = std::initializer_list<std::pair<absl::string_view, absl::string_view>>;

class Logger {
 public:
  // Receives each complete line (without the trailing newline).
  using LineWriter = std::function<void(absl::string_view line)>;

  // Writes to stderr.
  explicit Logger(LogLevel min_level);
  Logger(LogLevel min_level, LineWriter writer);

  bool Enabled(LogLevel level) const;
  void Log(LogLevel level, absl::string_view msg, LogFields fields = {});

  void Debug(absl::string_view msg, LogFields fields = {}) { Log(LogLevel::kDebug, msg, fields); }
  void Info(absl::string_view msg, LogFields fields = {}) { Log(LogLevel::kInfo, msg, fields); }
  void Warning(absl::string_view msg, LogFields fields = {}) {
    Log(LogLevel::kWarning, msg, fields);
  }
  void Error(absl::string_view msg, LogFields fields = {}) { Log(LogLevel::kError, msg, fields); }

 private:
  // Constant after construction.
  const LogLevel min_level_;

  absl::Mutex mu_;
  LineWriter writer_ ABSL_GUARDED_BY(mu_);
};

// The JSON string literal of `s` (with quotes), escaping quotes, backslashes and control
// characters. Exposed for tests.
std::string JsonQuote(absl::string_view s);

// Routes gRPC's own log lines (gpr_log) through `logger` as JSON; nullptr restores
// gRPC's default. `logger` must outlive every later gRPC log call or the next call here.
void RouteGrpcLogsTo(Logger* logger);

// Logs the engine's state changes, refusals, corrections and errors.
// Thread-safe; callbacks run on worker threads.
class LoggingObserver final : public consumer::EngineObserver {
 public:
  explicit LoggingObserver(Logger* logger) : logger_(logger) {}

  void OnRefusal(absl::string_view source_id, absl::string_view code) override;
  void OnCorrection(absl::string_view source_id, uint64_t depth) override;
  void OnStateChange(absl::string_view source_id, handoff::v1::SourceState state,
                     absl::string_view reason) override;
  void OnError(absl::string_view source_id, const absl::Status& status) override;

 private:
  Logger* const logger_;  // not owned
};

}  // namespace handoff::server

#endif  // HANDOFF_SERVER_LOGGING_H_
