// File: tools/cli/cli_log.cc

#include "cli_log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <string>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "leasehold/logging.h"

namespace leasehold::cli {

namespace {

std::atomic<Verbosity> verbosity{Verbosity::kNormal};
std::atomic<bool> json{false};

void WriteRaw(std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return;  // stderr is gone; nothing better to do
    }
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

// A JSON number for a numeric field, else the string.
nlohmann::json FieldValue(const LogField& field) {
  if (field.numeric) {
    std::uint64_t u = 0;
    const char* first = field.value.data();
    const char* last = first + field.value.size();
    if (auto [end, ec] = std::from_chars(first, last, u); ec == std::errc() && end == last) {
      return u;
    }
    double d = 0;
    if (auto [end, ec] = std::from_chars(first, last, d); ec == std::errc() && end == last) {
      return d;
    }
  }
  return std::string(field.value);
}

void WriteJson(LogLevel level, std::string_view event, std::span<const LogField> fields,
               std::string_view msg) {
  nlohmann::ordered_json j;
  const auto now = std::chrono::floor<std::chrono::milliseconds>(std::chrono::system_clock::now());
  const auto seconds = std::chrono::floor<std::chrono::seconds>(now);
  j["ts"] = fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:03d}Z", seconds, (now - seconds).count());
  j["level"] = std::string(LogLevelName(level));
  j["event"] = std::string(event);
  for (const LogField& field : fields) {
    j[std::string(field.name)] = FieldValue(field);
  }
  if (fields.empty()) {
    j["msg"] = std::string(msg);
  }
  // Replace invalid UTF-8 rather than throw: a log line must never take the command down.
  std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text += '\n';
  WriteRaw(text);
}

void WriteLine(std::string_view line) {
  std::string text = "leasehold: ";
  text.reserve(text.size() + line.size() + 1);
  for (char c : line) {
    if (c == '\n') {
      text += "; ";
    } else {
      text += c;
    }
  }
  while (!text.empty() && (text.back() == ' ' || text.back() == ';')) {
    text.pop_back();
  }
  text += '\n';
  WriteRaw(text);
}

void WriteOwnLine(LogLevel level, std::string_view line, std::string_view event = "message") {
  if (json.load()) {
    WriteJson(level, event, {}, line);
  } else {
    WriteLine(line);
  }
}

bool Shows(Verbosity least) {
  return verbosity.load() >= least;
}

}  // namespace

void SetVerbosity(Verbosity v) {
  verbosity.store(v);
  if (std::getenv("LEASEHOLD_DEBUG") == nullptr) {  // else the library's debug lines stay
    SetLogLevel(v == Verbosity::kVerbose ? LogLevel::kInfo : LogLevel::kWarning);
  }
}

void SetLogFormat(LogFormat format) {
  json.store(format == LogFormat::kJson);
  leasehold::SetLogSink([](const LogRecord& record) {
    if (json.load()) {
      WriteJson(record.level, record.event, record.fields, record.line);
    } else {
      WriteLine(record.line);
    }
  });
}

void Info(std::string_view line) {
  if (Shows(Verbosity::kVerbose)) {
    WriteOwnLine(LogLevel::kInfo, line);
  }
}

void Notice(std::string_view event, std::string_view line) {
  if (Shows(Verbosity::kNormal)) {
    WriteOwnLine(LogLevel::kInfo, line, event);
  }
}

void Warn(std::string_view line) {
  if (Shows(Verbosity::kNormal)) {
    WriteOwnLine(LogLevel::kWarning, fmt::format("warning: {}", line));
  }
}

void Alarm(std::string_view line) {
  WriteOwnLine(LogLevel::kWarning, line);
}

void Error(std::string_view line) {
  WriteOwnLine(LogLevel::kError, line);
}

}  // namespace leasehold::cli
