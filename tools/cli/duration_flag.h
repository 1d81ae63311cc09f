// File: tools/cli/duration_flag.h
//
// Reads the duration flags of `leasehold run` (--ttl, --renew-every, --wait, --kill-grace) with
// a message that names the flag, e.g. "invalid --ttl '-1s': must not be negative".
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(Duration ttl, ParsePositiveDurationFlag("--ttl", "10s"));
//   LH_ASSIGN_OR_RETURN(Duration wait, ParseWaitFlag("--wait", "forever"));  // kWaitForever
//
// Thread safety: pure functions.

#pragma once

#include <string_view>

#include "leasehold/clock.h"
#include "leasehold/status.h"

namespace leasehold::cli {

// Parses a duration that must be greater than zero ("500ms", "10s", "2m"). A bare "0" is read
// as zero and rejected as such. Returns kInvalidArgument naming `flag` otherwise.
Result<Duration> ParsePositiveDurationFlag(std::string_view flag, std::string_view text);

// Parses a duration that may be zero, or the word "forever" (kWaitForever).
// Returns kInvalidArgument naming `flag` otherwise.
Result<Duration> ParseWaitFlag(std::string_view flag, std::string_view text);

}  // namespace leasehold::cli
