#include "server/logging.h"

#include <grpc/support/log.h>

#include <atomic>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace handoff::server {

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warning" || lower == "warn") return LogLevel::kWarning;
  if (lower == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("log_level: must be debug, info, warning or error, got \"", name, "\""));
}

absl::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

std::string JsonQuote(absl::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

Logger::Logger(LogLevel min_level)
    : Logger(min_level, [](absl::string_view line) {
        // One fwrite per line: stderr is unbuffered, so lines from several processes
        // sharing it do not interleave mid-line.
        std::string with_newline = absl::StrCat(line, "\n");
        std::fwrite(with_newline.data(), 1, with_newline.size(), stderr);
      }) {}

Logger::Logger(LogLevel min_level, LineWriter writer)
    : min_level_(min_level), writer_(std::move(writer)) {}

bool Logger::Enabled(LogLevel level) const { return level >= min_level_; }

void Logger::Log(LogLevel level, absl::string_view msg, LogFields fields) {
  if (!Enabled(level)) return;
  std::string line = absl::StrCat(
      "{\"ts\":",
      JsonQuote(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone())),
      ",\"level\":", JsonQuote(LogLevelName(level)), ",\"msg\":", JsonQuote(msg));
  for (const auto& [key, value] : fields) {
    absl::StrAppend(&line, ",", JsonQuote(key), ":", JsonQuote(value));
  }
  line.push_back('}');
  absl::MutexLock lock(&mu_);
  writer_(line);
}

namespace {

std::atomic<Logger*> grpc_log_target{nullptr};

void GrpcLogToJson(gpr_log_func_args* args) {
  Logger* logger = grpc_log_target.load(std::memory_order_acquire);
  if (logger == nullptr) return;
  LogLevel level = LogLevel::kInfo;
  switch (args->severity) {
    case GPR_LOG_SEVERITY_DEBUG:
      level = LogLevel::kDebug;
      break;
    case GPR_LOG_SEVERITY_INFO:
      level = LogLevel::kInfo;
      break;
    case GPR_LOG_SEVERITY_ERROR:
      level = LogLevel::kError;
      break;
  }
  logger->Log(level, args->message,
              {{"component", "grpc"},
               {"file", args->file == nullptr ? "" : args->file},
               {"line", absl::StrCat(args->line)}});
}

}  // namespace

void RouteGrpcLogsTo(Logger* logger) {
  grpc_log_target.store(logger, std::memory_order_release);
  // gRPC has no "restore default" call; a null target simply drops its lines, which
  // only happens after the server (and its logger) is gone.
  gpr_set_log_function(GrpcLogToJson);
}

void LoggingObserver::OnRefusal(absl::string_view source_id, absl::string_view code) {
  logger_->Warning("provider refused a fetch", {{"source_id", source_id}, {"code", code}});
}

void LoggingObserver::OnCorrection(absl::string_view source_id, uint64_t depth) {
  logger_->Info("correction page",
                {{"source_id", source_id}, {"depth_blocks", absl::StrCat(depth)}});
}

void LoggingObserver::OnStateChange(absl::string_view source_id, handoff::v1::SourceState state,
                                    absl::string_view reason) {
  const std::string& name = handoff::v1::SourceState_Name(state);
  const bool halted = state >= handoff::v1::SOURCE_STATE_RESYNC_REQUIRED &&
                      state != handoff::v1::SOURCE_STATE_STOPPING;
  logger_->Log(halted ? LogLevel::kWarning : LogLevel::kInfo, "state change",
               {{"source_id", source_id}, {"state", name}, {"reason", reason}});
}

void LoggingObserver::OnError(absl::string_view source_id, const absl::Status& status) {
  logger_->Error("source error", {{"source_id", source_id},
                                  {"code", absl::StatusCodeToString(status.code())},
                                  {"error", status.message()}});
}

}  // namespace handoff::server
