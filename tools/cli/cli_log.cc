// File: tools/cli/cli_log.cc

#include "cli_log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>

#include "core/logging.h"

namespace leasehold::cli {

namespace {

std::atomic<bool> quiet{false};

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
  std::string_view rest = text;
  while (!rest.empty()) {
    ssize_t n = ::write(STDERR_FILENO, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return;  // stderr is gone; nothing better to do
    }
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace

void SetQuiet(bool q) {
  quiet.store(q);
  if (q) {
    internal::SetLogLevel(internal::LogLevel::kWarning);
  }
}

void Info(std::string_view line) {
  if (!quiet.load()) {
    WriteLine(line);
  }
}

void Error(std::string_view line) {
  WriteLine(line);
}

}  // namespace leasehold::cli
