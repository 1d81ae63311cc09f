// File: tools/cli/duration_flag.cc

#include "duration_flag.h"

#include <fmt/format.h>

#include "leasehold/duration.h"
#include "leasehold/options.h"

namespace leasehold::cli {

namespace {

// Reads `text`, accepting a bare "0" (unambiguous, and what people type for "none").
Result<Duration> ParseWithZero(std::string_view flag, std::string_view text) {
  if (text == "0") {
    return Duration::zero();
  }
  Result<Duration> d = ParseDuration(text);
  if (!d.ok()) {
    return Status::InvalidArgument(fmt::format("{}: {}", flag, d.error().message()));
  }
  return d;
}

}  // namespace

Result<Duration> ParsePositiveDurationFlag(std::string_view flag, std::string_view text) {
  LH_ASSIGN_OR_RETURN(Duration d, ParseWithZero(flag, text));
  if (d <= Duration::zero()) {
    return Status::InvalidArgument(
        fmt::format("{}: invalid duration '{}': must be greater than 0", flag, text));
  }
  return d;
}

Result<Duration> ParseWaitFlag(std::string_view flag, std::string_view text) {
  if (text == "forever") {
    return kWaitForever;
  }
  return ParseWithZero(flag, text);
}

}  // namespace leasehold::cli
