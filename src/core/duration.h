// File: core/duration.h (internal)
//
// The library's own spelling of leasehold/duration.h (ParseDuration, FormatDuration,
// RoundForDisplay), which defines them: internal code calls them as internal::ParseDuration /
// internal::FormatDuration.
//
// Thread safety: pure functions.

#pragma once

#include "leasehold/duration.h"

namespace leasehold::internal {

using ::leasehold::FormatDuration;
using ::leasehold::ParseDuration;
using ::leasehold::RoundForDisplay;

}  // namespace leasehold::internal
