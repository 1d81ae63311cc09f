#include "core/duration.h"

#include <cctype>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

namespace leasehold {

namespace {

// Returns the unit's length in nanoseconds, or 0 if unknown.
std::int64_t UnitNanos(std::string_view unit) {
  if (unit == "ns") {
    return 1;
  }
  if (unit == "us") {
    return 1'000;
  }
  if (unit == "ms") {
    return 1'000'000;
  }
  if (unit == "s") {
    return 1'000'000'000;
  }
  if (unit == "m") {
    return 60'000'000'000;
  }
  if (unit == "h") {
    return 3'600'000'000'000;
  }
  if (unit == "d") {  // 24 h, for schedule periods such as --once-per 1d
    return 86'400'000'000'000;
  }
  return 0;
}

}  // namespace

Result<Duration> ParseDuration(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(
        fmt::format("invalid duration '{}': {} (write e.g. 500ms, 10s, 2m)", text, why));
  };
  if (text.empty()) {
    return bad("empty");
  }
  if (text.front() == '-') {
    return bad("must not be negative");
  }
  std::int64_t total = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    std::int64_t whole = 0;
    std::int64_t frac_num = 0;
    std::int64_t frac_den = 1;
    std::size_t digits = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) != 0) {
      if (whole > (std::numeric_limits<std::int64_t>::max() - 9) / 10) {
        return bad("too large");
      }
      whole = whole * 10 + (text[i] - '0');
      ++i;
      ++digits;
    }
    if (i < text.size() && text[i] == '.') {
      ++i;
      while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) != 0) {
        if (frac_den < 1'000'000'000) {
          frac_num = frac_num * 10 + (text[i] - '0');
          frac_den *= 10;
        }
        ++i;
        ++digits;
      }
    }
    if (digits == 0) {
      return bad("expected a number");
    }
    std::size_t unit_start = i;
    while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i])) != 0) {
      ++i;
    }
    std::string_view unit = text.substr(unit_start, i - unit_start);
    if (unit.empty()) {
      return bad("missing unit");
    }
    std::int64_t nanos = UnitNanos(unit);
    if (nanos == 0) {
      return bad(fmt::format("unknown unit '{}'", unit));
    }
    if (whole > std::numeric_limits<std::int64_t>::max() / nanos) {
      return bad("too large");
    }
    // The fraction (less than one unit) can still carry whole * nanos past the maximum:
    // "9223372036.854775808s".
    const auto fraction =
        static_cast<std::int64_t>(static_cast<long double>(frac_num) * nanos / frac_den);
    if (whole * nanos > std::numeric_limits<std::int64_t>::max() - fraction) {
      return bad("too large");
    }
    std::int64_t part = whole * nanos + fraction;
    if (total > std::numeric_limits<std::int64_t>::max() - part) {
      return bad("too large");
    }
    total += part;
  }
  return Duration(total);
}

namespace {

// "<whole>[.<fraction>]<unit>" for `count` in units of `per_unit` (1000, 10^6 or 10^9), the
// fraction with as many digits as it needs and no trailing zeros, so that it reads back exact.
std::string Decimal(std::uint64_t count, std::uint64_t per_unit, std::string_view unit) {
  std::string out = fmt::format("{}", count / per_unit);
  std::uint64_t rest = count % per_unit;
  if (rest != 0) {
    int digits = 0;
    for (std::uint64_t p = per_unit; p > 1; p /= 10) {
      ++digits;
    }
    std::string fraction = fmt::format("{:0{}}", rest, digits);
    fraction.erase(fraction.find_last_not_of('0') + 1);
    out += '.';
    out += fraction;
  }
  out += unit;
  return out;
}

}  // namespace

Duration RoundForDisplay(Duration d) {
  const std::int64_t count = d.count();
  const std::uint64_t magnitude =
      count < 0 ? 0 - static_cast<std::uint64_t>(count) : static_cast<std::uint64_t>(count);
  std::uint64_t unit = 1;
  if (magnitude >= 60'000'000'000) {
    unit = 1'000'000'000;
  } else if (magnitude >= 1'000'000'000) {
    unit = 1'000'000;
  } else if (magnitude >= 1'000'000) {
    unit = 1'000;
  }
  if (unit == 1) {
    return d;
  }
  std::uint64_t rounded = magnitude / unit * unit;
  // Round half up on the magnitude, unless that would pass int64's range (then round down).
  if (magnitude % unit >= unit / 2 &&
      rounded <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) - unit) {
    rounded += unit;
  }
  return count < 0 ? Duration(-static_cast<std::int64_t>(rounded))
                   : Duration(static_cast<std::int64_t>(rounded));
}

std::string FormatDuration(Duration d) {
  // Exact to the nanosecond: a limit or default printed in a message reads back as the same
  // value (ParseDuration(FormatDuration(d)) == d). The magnitude is unsigned: -INT64_MIN does
  // not fit in int64.
  const std::int64_t count = d.count();
  const std::uint64_t ns =
      count < 0 ? 0 - static_cast<std::uint64_t>(count) : static_cast<std::uint64_t>(count);
  std::string sign = count < 0 ? "-" : "";
  if (ns < 1'000) {
    return fmt::format("{}{}ns", sign, ns);
  }
  if (ns < 1'000'000) {
    return sign + Decimal(ns, 1'000, "us");
  }
  if (ns < 1'000'000'000) {
    return sign + Decimal(ns, 1'000'000, "ms");
  }
  constexpr std::uint64_t kMinute = 60'000'000'000;
  if (ns < kMinute) {
    return sign + Decimal(ns, 1'000'000'000, "s");
  }
  const std::uint64_t s = ns / 1'000'000'000;
  const std::string seconds = Decimal(ns % kMinute, 1'000'000'000, "s");
  if (s < 3600) {
    return fmt::format("{}{}m{}", sign, s / 60, seconds);
  }
  return fmt::format("{}{}h{}m{}", sign, s / 3600, (s / 60) % 60, seconds);
}

}  // namespace leasehold
