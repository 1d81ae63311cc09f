// File: leasehold/duration.h
//
// Durations as people write them, for flags and configuration files: "500ms", "10s", "2m",
// "1h", "1d" (24 h), "1m30s", "250us", "7ns". A bare number is refused (is "10" seconds or
// milliseconds?), and so are negative values. The same format the library uses in its messages.
//
// Example:
//
//   leasehold::Result<leasehold::Duration> ttl = leasehold::ParseDuration(flag_text);
//   if (!ttl.ok()) return Usage(ttl.error().message());  // "invalid duration '10': ..."
//   std::puts(leasehold::FormatDuration(*ttl).c_str());   // "10s"
//
// Thread safety: pure functions.

#pragma once

#include <string>
#include <string_view>

#include "leasehold/clock.h"
#include "leasehold/status.h"

namespace leasehold {

// Parses `text`. Returns kInvalidArgument naming the text for anything else, including a
// missing unit, a negative sign, an unknown unit or overflow.
Result<Duration> ParseDuration(std::string_view text);

// Formats `d` compactly for people: "1.5s", "250ms", "2m0s", "12us", "1m1.5s". Exact to the
// nanosecond ("1.000000001s", not "1s"): for d >= 0, ParseDuration reads it back as the same
// value (ParseDuration refuses a sign).
std::string FormatDuration(Duration d);

// Rounds `d` (to the nearest, halves away from zero) for showing a measured or computed value:
// to the second from a minute up, to the millisecond from a second, to the microsecond from a
// millisecond; shorter values are returned as they are. FormatDuration(RoundForDisplay(d))
// reads "3.333s" for ttl/3 of 10s, where FormatDuration(d) reads "3.333333333s".
Duration RoundForDisplay(Duration d);

}  // namespace leasehold
