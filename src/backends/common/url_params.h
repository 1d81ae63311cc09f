// File: backends/common/url_params.h (internal)
//
// Reading a store URL's query parameters, the same way for every store: unknown names are
// refused (a typo such as "comand_timeout=10s" must never leave the default in place silently),
// and every bad value gets one message format, "<scheme>:// URL parameter <name>=<value> ...".
// A Read* function leaves its output alone when the parameter is absent, so the caller's default
// stands.
//
// Example:
//
//   constexpr std::string_view kKnown[] = {"command_timeout", "fair"};
//   LH_RETURN_IF_ERROR(RefuseUnknownParams(url, kKnown));
//   LH_RETURN_IF_ERROR(ReadTimeoutParam(url, "command_timeout", &options.command_timeout));
//   LH_RETURN_IF_ERROR(ReadBoolParam(url, "fair", &options.fair));
//
// Thread safety: plain functions.

#pragma once

#include <chrono>
#include <span>
#include <string>
#include <string_view>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "core/url.h"

namespace leasehold::internal {

// The longest network timeout a URL may set: timeouts become struct timeval and millisecond
// counts, so keep them in a sane range.
inline constexpr Duration kMaxUrlTimeout = std::chrono::hours(1);

// Returns kInvalidArgument naming every parameter of `url` that is not in `known`, and listing
// the known ones, then `hint` if not empty (e.g. "the database goes in the path").
Status RefuseUnknownParams(const Url& url, std::span<const std::string_view> known,
                           std::string_view hint = {});

// Reads a duration ("250ms", "2s") in (0, max].
Status ReadTimeoutParam(const Url& url, std::string_view name, Duration* out,
                        Duration max = kMaxUrlTimeout);

// Reads a duration in [min, max] (zero allowed when min is zero).
Status ReadDurationParam(const Url& url, std::string_view name, Duration min, Duration max,
                         Duration* out);

// Reads a whole number in [min, max].
Status ReadIntParam(const Url& url, std::string_view name, int min, int max, int* out);

// Reads "true" or "false".
Status ReadBoolParam(const Url& url, std::string_view name, bool* out);

// Reads a string; an empty one is refused unless `allow_empty`.
Status ReadStringParam(const Url& url, std::string_view name, std::string* out,
                       bool allow_empty = false);

// Returns kInvalidArgument "<scheme>:// URL parameter <name>=<value> <what>", the one format
// of every refusal above, for checks of a store's own (e.g. "must contain no '{'").
Status BadParam(const Url& url, std::string_view name, std::string_view what);

// Parses a whole number in [min, max] from all of `text`; false if it is not one.
bool ParseWholeNumber(std::string_view text, int min, int max, int* out);

}  // namespace leasehold::internal
