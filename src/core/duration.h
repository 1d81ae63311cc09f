// File: core/duration.h (internal)
//
// Durations as people write them: "500ms", "10s", "2m", "1h", "1d" (24 h), "1m30s", "250us". A
// bare number is rejected (is "10" seconds or milliseconds?), as are negative values.
//
// Thread safety: pure functions.

#pragma once

#include <string>
#include <string_view>

#include "leasehold/clock.h"
#include "leasehold/status.h"

namespace leasehold::internal {

// Parses `text`. Returns kInvalidArgument naming the text for anything else, including a
// missing unit, a negative sign, an unknown unit or overflow.
Result<Duration> ParseDuration(std::string_view text);

// Formats `d` compactly for people: "1.5s", "250ms", "2m0s", "12us".
std::string FormatDuration(Duration d);

}  // namespace leasehold::internal
