// File: tests/fuzz/duration_fuzz.cc
//
// ParseDuration and FormatDuration (leasehold/duration.h). Invariants:
// - A parsed duration is never negative.
// - Printed and parsed again, it is the same value, to the nanosecond: the library prints
//   durations in its messages ("must be at most 1h0m0s"), and a limit it prints must be one a
//   user can write back.
// - FormatDuration of any 64-bit count (the input's first 8 bytes) is well defined, and for a
//   count >= 0 parses back to it.
// - RoundForDisplay of that count keeps its sign, stays within half a unit of it (1 s from a
//   minute up, 1 ms from a second, 1 us from a millisecond) and prints what it rounded to.

#include <cstring>
#include <string>

#include "leasehold/duration.h"

#include "fuzz_check.h"

namespace {

using leasehold::Duration;
using leasehold::FormatDuration;
using leasehold::ParseDuration;
using leasehold::RoundForDisplay;

void CheckRoundTrip(Duration d) {
  const std::string printed = FormatDuration(d);
  leasehold::Result<Duration> again = ParseDuration(printed);
  FUZZ_CHECK(again.ok(), printed + ": " + std::string(again.status().message()));
  FUZZ_CHECK(*again == d, std::to_string(d.count()) + "ns printed as " + printed +
                              " reads back as " + std::to_string(again->count()) + "ns");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  leasehold::Result<Duration> d = ParseDuration(leasehold::fuzz::AsText(data, size));
  if (d.ok()) {
    FUZZ_CHECK(d->count() >= 0, std::to_string(d->count()));
    CheckRoundTrip(*d);
  }
  if (size >= sizeof(std::int64_t)) {
    std::int64_t count = 0;
    std::memcpy(&count, data, sizeof(count));
    const std::string printed = FormatDuration(Duration(count));
    FUZZ_CHECK(!printed.empty(), "empty");
    if (count >= 0) {
      CheckRoundTrip(Duration(count));
    }
    const Duration r = RoundForDisplay(Duration(count));
    FUZZ_CHECK((count < 0) == (r.count() < 0) || r.count() == 0, std::to_string(count));
    // |count - r| <= unit / 2 (+ 1 unit at the ends of the range, where it rounds down), in
    // unsigned arithmetic so that the difference itself cannot overflow.
    const auto mag = [](std::int64_t v) {
      return v < 0 ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
    };
    const std::uint64_t m = mag(count);
    const std::uint64_t unit = m >= 60'000'000'000  ? 1'000'000'000
                               : m >= 1'000'000'000 ? 1'000'000
                               : m >= 1'000'000     ? 1'000
                                                    : 1;
    const std::uint64_t rm = mag(r.count());
    const std::uint64_t off = rm > m ? rm - m : m - rm;
    FUZZ_CHECK(off <= unit, std::to_string(count) + " rounded to " + std::to_string(r.count()));
    FUZZ_CHECK(rm % unit == 0, std::to_string(count) + " rounded to " + std::to_string(r.count()));
    if (r.count() >= 0) {
      CheckRoundTrip(r);
    }
  }
  return 0;
}
