// File: tests/fuzz/options_fuzz.h
//
// What the store option fuzz targets (*_options_fuzz.cc) share: the URL they read, steered to
// the target's scheme, and the check that neither a result nor an error depends on the
// password (the same URL with another password gives the same message).
//
// Thread safety: fuzz targets run one input at a time.

#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "leasehold/status.h"

#include "core/url.h"
#include "fuzz_check.h"

namespace leasehold::fuzz {

inline constexpr std::string_view kSecretMarker = "\x01LH-SECRET\x02";

// The input as a URL of one of `schemes`: a parsed URL of another scheme gets the first one, so
// that the fuzzer's work is not spent on the scheme check. nullopt if the input is no URL, or
// holds the marker itself.
inline std::optional<internal::Url> SteeredUrl(std::string_view text,
                                               std::initializer_list<std::string_view> schemes) {
  if (Contains(text, kSecretMarker)) {
    return std::nullopt;  // the marker must be what only the secrets hold
  }
  Result<internal::Url> url = internal::ParseUrl(text);
  if (!url.ok()) {
    return std::nullopt;
  }
  bool ours = false;
  for (std::string_view scheme : schemes) {
    ours = ours || url->scheme == scheme;
  }
  if (!ours) {
    url->scheme = std::string(*schemes.begin());
  }
  return *std::move(url);
}

// `url` with its password (if any) replaced by the marker.
inline internal::Url WithMarkerPassword(internal::Url url) {
  if (url.password) {
    url.password = std::string(kSecretMarker);
  }
  return url;
}

// Checks that an error from `from_url` does not depend on the URL's password: the same URL
// with the marker as its password fails with the same code and message, without the marker.
template <typename FromUrl>
void CheckErrorHidesPassword(const internal::Url& url, const Status& status, FromUrl from_url) {
  auto other = from_url(WithMarkerPassword(url));
  FUZZ_CHECK(!other.ok(), "the password decided whether the URL is accepted");
  FUZZ_CHECK(other.status().code() == status.code(), status.message());
  FUZZ_CHECK(!Contains(other.status().message(), kSecretMarker), other.status().message());
  FUZZ_CHECK(other.status().message() == status.message(),
             std::string(status.message()) + " vs " + std::string(other.status().message()));
}

}  // namespace leasehold::fuzz
