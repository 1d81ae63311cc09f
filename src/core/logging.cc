#include "core/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace leasehold {

namespace internal {

namespace {

struct LogState {
  std::mutex mu;
  LogSink sink;
  std::atomic<int> level{std::getenv("LEASEHOLD_DEBUG") != nullptr
                             ? static_cast<int>(LogLevel::kDebug)
                             : static_cast<int>(LogLevel::kInfo)};
};

LogState& State() {
  static LogState* const state = new LogState();  // never destroyed: logs from exiting threads
  return *state;
}

void Emit(const LogRecord& record) {
  LogState& state = State();
  // One sink call at a time: sinks (stderr included) need not be thread-safe, and lines from
  // the heartbeat threads never interleave.
  std::lock_guard<std::mutex> lock(state.mu);
  if (state.sink) {
    state.sink(record);
    return;
  }
  std::string text = "leasehold: ";
  text.append(record.line);
  text += '\n';
  std::fwrite(text.data(), 1, text.size(), stderr);
}

bool IsBareWord(std::string_view value) {
  if (value.empty()) {
    return false;
  }
  for (char c : value) {
    auto u = static_cast<unsigned char>(c);
    if (u <= ' ' || c == '"' || c == '=' || c == '\\' || u == 0x7f) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= State().level.load(std::memory_order_relaxed);
}

void Log(LogLevel level, std::string_view line) {
  if (!LogEnabled(level)) {
    return;
  }
  Emit(LogRecord{.level = level, .event = "message", .fields = {}, .line = line});
}

std::string LogSeconds(Duration d) {
  return fmt::format("{:.6f}", std::chrono::duration<double>(d).count());
}

void AppendLogfmtValue(std::string& out, std::string_view value) {
  if (IsBareWord(value)) {
    out.append(value);
    return;
  }
  out += '"';
  for (char c : value) {
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
      case '\t':
        out += "\\t";
        break;
      default:
        out += c;
    }
  }
  out += '"';
}

void LogEvent(LogLevel level, std::string_view event, std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) {
    return;
  }
  std::string line(event);
  for (const LogField& field : fields) {
    line += ' ';
    line.append(field.name);
    line += '=';
    AppendLogfmtValue(line, field.value);
  }
  Emit(LogRecord{.level = level,
                 .event = event,
                 .fields = std::span<const LogField>(fields.begin(), fields.size()),
                 .line = line});
}

void SetLogSink(std::function<void(LogLevel, std::string_view)> sink) {
  if (!sink) {
    leasehold::SetLogSink(nullptr);
    return;
  }
  leasehold::SetLogSink(
      [sink = std::move(sink)](const LogRecord& record) { sink(record.level, record.line); });
}

void SetLogLevel(LogLevel level) {
  State().level.store(static_cast<int>(level), std::memory_order_relaxed);
}

}  // namespace internal

std::string_view LogLevelName(LogLevel level) {
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
  return "unknown";
}

void SetLogSink(LogSink sink) {
  internal::LogState& state = internal::State();
  std::lock_guard<std::mutex> lock(state.mu);
  state.sink = std::move(sink);
}

void SetLogLevel(LogLevel level) {
  internal::SetLogLevel(level);
}

}  // namespace leasehold
