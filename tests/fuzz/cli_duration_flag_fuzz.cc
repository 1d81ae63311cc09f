// File: tests/fuzz/cli_duration_flag_fuzz.cc
//
// The `leasehold run` duration flags (tools/cli/duration_flag.h). Invariants:
// - ParsePositiveDurationFlag gives a duration > 0, or an error that names the flag.
// - ParseWaitFlag gives kWaitForever only for "forever", else a duration >= 0 that is the
//   library's ParseDuration of the same text (or zero for a bare "0"), never kWaitForever, or
//   an error naming the flag.

#include <string>
#include <string_view>

#include "leasehold/duration.h"
#include "leasehold/options.h"

#include "duration_flag.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using leasehold::Duration;
  const std::string_view text = leasehold::fuzz::AsText(data, size);
  constexpr std::string_view kFlag = "--ttl";

  leasehold::Result<Duration> positive = leasehold::cli::ParsePositiveDurationFlag(kFlag, text);
  if (positive.ok()) {
    FUZZ_CHECK(*positive > Duration::zero(), std::to_string(positive->count()));
  } else {
    FUZZ_CHECK(positive.status().code() == leasehold::StatusCode::kInvalidArgument,
               positive.status().message());
    FUZZ_CHECK(positive.status().message().starts_with(kFlag), positive.status().message());
  }

  constexpr std::string_view kWait = "--wait";
  leasehold::Result<Duration> wait = leasehold::cli::ParseWaitFlag(kWait, text);
  if (!wait.ok()) {
    FUZZ_CHECK(wait.status().message().starts_with(kWait), wait.status().message());
    return 0;
  }
  if (text == "forever") {
    FUZZ_CHECK(*wait == leasehold::kWaitForever, "forever");
    return 0;
  }
  FUZZ_CHECK(*wait >= Duration::zero(), std::to_string(wait->count()));
  // A written duration is finite: it must never turn into the "forever" sentinel.
  FUZZ_CHECK(*wait != leasehold::kWaitForever, "a finite --wait became forever");
  if (text == "0") {
    FUZZ_CHECK(*wait == Duration::zero(), "0");
  } else {
    leasehold::Result<Duration> library = leasehold::ParseDuration(text);
    FUZZ_CHECK(library.ok() && *library == *wait, "disagrees with ParseDuration");
  }
  if (positive.ok()) {
    FUZZ_CHECK(*positive == *wait, "--ttl and --wait read the same text differently");
  }
  return 0;
}
