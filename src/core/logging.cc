#include "core/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

namespace leasehold::internal {

namespace {

struct LogState {
  std::mutex mu;
  std::function<void(LogLevel, std::string_view)> sink;
  std::atomic<int> level{std::getenv("LEASEHOLD_DEBUG") != nullptr
                             ? static_cast<int>(LogLevel::kDebug)
                             : static_cast<int>(LogLevel::kInfo)};
};

LogState& State() {
  static LogState* const state = new LogState();  // never destroyed: logs from exiting threads
  return *state;
}

}  // namespace

void Log(LogLevel level, std::string_view line) {
  LogState& state = State();
  if (static_cast<int>(level) < state.level.load(std::memory_order_relaxed)) {
    return;
  }
  std::lock_guard<std::mutex> lock(state.mu);
  if (state.sink) {
    state.sink(level, line);
    return;
  }
  std::string text = "leasehold: ";
  text.append(line);
  text += '\n';
  std::fwrite(text.data(), 1, text.size(), stderr);
}

void SetLogSink(std::function<void(LogLevel, std::string_view)> sink) {
  LogState& state = State();
  std::lock_guard<std::mutex> lock(state.mu);
  state.sink = std::move(sink);
}

void SetLogLevel(LogLevel level) {
  State().level.store(static_cast<int>(level), std::memory_order_relaxed);
}

}  // namespace leasehold::internal
