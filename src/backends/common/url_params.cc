#include "backends/common/url_params.h"

#include <charconv>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/duration.h"

namespace leasehold::internal {

namespace {

// Returns the parameter's value, or nullptr if absent.
const std::string* Find(const Url& url, std::string_view name) {
  auto it = url.query.find(name);
  return it == url.query.end() ? nullptr : &it->second;
}

}  // namespace

Status BadParam(const Url& url, std::string_view name, std::string_view what) {
  const std::string* value = Find(url, name);
  return Status::InvalidArgument(fmt::format("{}:// URL parameter {}={} {}", url.scheme, name,
                                             value != nullptr ? *value : "", what));
}

bool ParseWholeNumber(std::string_view text, int min, int max, int* out) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < min ||
      value > max) {
    return false;
  }
  *out = value;
  return true;
}

Status RefuseUnknownParams(const Url& url, std::span<const std::string_view> known,
                           std::string_view hint) {
  std::vector<std::string_view> unknown;
  for (const auto& [name, value] : url.query) {
    bool found = false;
    for (std::string_view k : known) {
      found = found || name == k;
    }
    if (!found) {
      unknown.push_back(name);
    }
  }
  if (unknown.empty()) {
    return Status();
  }
  return Status::InvalidArgument(
      fmt::format("unknown {}:// URL parameter{} {} (known: {}{}{})", url.scheme,
                  unknown.size() == 1 ? "" : "s", fmt::join(unknown, ", "),
                  known.empty() ? "none" : fmt::format("{}", fmt::join(known, ", ")),
                  hint.empty() ? "" : "; ", hint));
}

namespace {

// Reads the duration `name` if present into *out, if `in_range(d)`; else BadParam(`what`).
template <typename InRange>
Status ReadCheckedDuration(const Url& url, std::string_view name, InRange in_range,
                           std::string_view what, Duration* out) {
  const std::string* value = Find(url, name);
  if (value == nullptr) {
    return Status();
  }
  Result<Duration> d = ParseDuration(*value);
  if (!d.ok()) {
    return d.status().WithContext(fmt::format("{}:// URL parameter {}", url.scheme, name));
  }
  if (!in_range(*d)) {
    return BadParam(url, name, what);
  }
  *out = *d;
  return Status();
}

}  // namespace

Status ReadDurationParam(const Url& url, std::string_view name, Duration min, Duration max,
                         Duration* out) {
  return ReadCheckedDuration(
      url, name, [&](Duration d) { return d >= min && d <= max; },
      min == Duration::zero()
          ? fmt::format("must be at most {}", FormatDuration(max))
          : fmt::format("must be in [{}, {}]", FormatDuration(min), FormatDuration(max)),
      out);
}

Status ReadTimeoutParam(const Url& url, std::string_view name, Duration* out, Duration max) {
  return ReadCheckedDuration(
      url, name, [&](Duration d) { return d > Duration::zero() && d <= max; },
      fmt::format("must be above 0 and at most {}", FormatDuration(max)), out);
}

Status ReadIntParam(const Url& url, std::string_view name, int min, int max, int* out) {
  const std::string* value = Find(url, name);
  if (value == nullptr) {
    return Status();
  }
  if (!ParseWholeNumber(*value, min, max, out)) {
    return BadParam(url, name, fmt::format("is not a whole number in [{}, {}]", min, max));
  }
  return Status();
}

Status ReadBoolParam(const Url& url, std::string_view name, bool* out) {
  const std::string* value = Find(url, name);
  if (value == nullptr) {
    return Status();
  }
  if (*value != "true" && *value != "false") {
    return BadParam(url, name, "must be true or false");
  }
  *out = *value == "true";
  return Status();
}

Status ReadStringParam(const Url& url, std::string_view name, std::string* out, bool allow_empty) {
  const std::string* value = Find(url, name);
  if (value == nullptr) {
    return Status();
  }
  if (value->empty() && !allow_empty) {
    return BadParam(url, name, "must not be empty");
  }
  *out = *value;
  return Status();
}

}  // namespace leasehold::internal
