// File: tests/fuzz/url_fuzz.cc
//
// ParseUrl (core/url.h) on any bytes, with the schemeless forms the registry hands to a store
// (libpq's key=value conninfo). Invariants:
// - Redacted() does not depend on the password or on a secret query value: the same URL with
//   other secrets renders the same, and the rendering never holds the secret.
// - An error does not depend on the password written in the text.
// - The scheme is lower case, query names are unique (a map) and non-empty.

#include <cctype>
#include <string>
#include <string_view>

#include "core/url.h"
#include "fuzz_check.h"

namespace {

using leasehold::fuzz::AsText;
using leasehold::fuzz::Contains;
using leasehold::internal::ParseUrl;
using leasehold::internal::Url;

// Query parameters that carry a secret: a password for libpq (password, sslpassword: the
// client key's passphrase) or a token. This list is the target's own, not url.cc's.
bool IsSecretName(std::string_view name) {
  return name == "password" || name == "pass" || name == "token" || name == "sslpassword";
}

constexpr std::string_view kMarker = "\x01LH-SECRET\x02";

// `url` with every secret replaced by `secret`.
Url WithSecrets(Url url, std::string_view secret) {
  if (url.password) {
    url.password = std::string(secret);
  }
  for (auto& [name, value] : url.query) {
    if (IsSecretName(name)) {
      value = std::string(secret);
    }
  }
  return url;
}

// The password as written in a "scheme://user:password@host" text, or "" if none is found.
std::string_view WrittenPassword(std::string_view text) {
  std::size_t sep = text.find("://");
  if (sep == std::string_view::npos) {
    return {};
  }
  std::string_view rest = text.substr(sep + 3);
  rest = rest.substr(0, rest.find_first_of("/?"));
  std::size_t at = rest.rfind('@');
  if (at == std::string_view::npos) {
    return {};
  }
  rest = rest.substr(0, at);
  std::size_t colon = rest.find(':');
  return colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text = AsText(data, size);
  if (Contains(text, kMarker)) {
    return 0;  // the marker must be what only the secrets hold
  }
  leasehold::Result<Url> url = ParseUrl(text);
  if (!url.ok()) {
    // The same text with another password of the same length fails with the same message.
    // Without '%' (an escape) or what splits a conninfo (space, quote, backslash, '=') in it:
    // another password would then not change how the text splits.
    std::string_view password = WrittenPassword(text);
    if (!password.empty() && password.find_first_of("% \t\n\v\f\r'\\=") == std::string_view::npos) {
      std::string other(text);
      const std::size_t at = static_cast<std::size_t>(password.data() - text.data());
      other.replace(
          at, password.size(),
          std::string(password.size(),
                      password.find_first_not_of('Q') == std::string_view::npos ? 'R' : 'Q'));
      leasehold::Result<Url> again = ParseUrl(other);
      FUZZ_CHECK(!again.ok() && again.status().message() == url.status().message(),
                 url.status().message());
    }
    return 0;
  }
  for (char c : url->scheme) {
    FUZZ_CHECK(std::isupper(static_cast<unsigned char>(c)) == 0, url->scheme);
  }
  for (const auto& [name, value] : url->query) {
    FUZZ_CHECK(!name.empty(), "an empty query parameter name");
  }
  const std::string redacted = url->Redacted();
  const std::string with_marker = WithSecrets(*url, kMarker).Redacted();
  FUZZ_CHECK(!Contains(with_marker, kMarker), with_marker);
  FUZZ_CHECK(with_marker == redacted, redacted + " vs " + with_marker);
  return 0;
}
