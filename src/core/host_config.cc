// File: core/host_config.cc

#include "core/host_config.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace leasehold::internal {
namespace {

std::string_view Trim(std::string_view text) {
  const std::size_t begin = text.find_first_not_of(" \t\r");
  if (begin == std::string_view::npos) {
    return {};
  }
  return text.substr(begin, text.find_last_not_of(" \t\r") - begin + 1);
}

}  // namespace

Result<std::optional<std::string>> ConfigValue(std::string_view text, std::string_view file,
                                               std::string_view key) {
  std::optional<std::string> value;
  int number = 0;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    const std::string_view line = Trim(text.substr(0, end));
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    ++number;
    if (line.empty() || line.front() == '#') {
      continue;
    }
    const std::size_t equals = line.find('=');
    if (equals == std::string_view::npos || Trim(line.substr(0, equals)).empty()) {
      return Status::InvalidArgument(
          fmt::format("{}:{}: expected `key = value` (or a # comment), got \"{}\"", file, number,
                      line.substr(0, 80)));
    }
    if (Trim(line.substr(0, equals)) == key) {
      value = std::string(Trim(line.substr(equals + 1)));
    }
  }
  return value;
}

Result<std::optional<std::string>> HostConfigValue(std::string_view key) {
  const char* env = std::getenv("LEASEHOLD_CONFIG");
  const bool asked = env != nullptr && *env != '\0';
  const std::string path = asked ? std::string(env) : std::string(kHostConfigPath);
  std::ifstream in(path);
  if (!in) {
    const int err = errno;
    if (!asked && err == ENOENT) {
      return std::optional<std::string>();
    }
    std::string message = fmt::format("cannot read the leasehold configuration file {}{}: {}", path,
                                      asked ? " (LEASEHOLD_CONFIG)" : "", std::strerror(err));
    return err == EACCES ? Status::PermissionDenied(std::move(message))
                         : Status::InvalidArgument(std::move(message));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return ConfigValue(text.str(), path, key);
}

}  // namespace leasehold::internal
