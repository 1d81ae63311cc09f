#include "core/url.h"

#include <cctype>

#include <fmt/format.h>

#include "backends/registry.h"

namespace leasehold::internal {

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  if (c >= 'a' && c <= 'f') {
    return c - 'a' + 10;
  }
  if (c >= 'A' && c <= 'F') {
    return c - 'A' + 10;
  }
  return -1;
}

bool ValidScheme(std::string_view scheme) {
  if (scheme.empty() || std::isalpha(static_cast<unsigned char>(scheme[0])) == 0) {
    return false;
  }
  for (char c : scheme) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '+' && c != '-' && c != '.') {
      return false;
    }
  }
  return true;
}

}  // namespace

Result<std::string> PercentDecode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    if (i + 2 >= text.size()) {
      return Status::InvalidArgument("malformed percent-escape in URL");
    }
    int hi = HexValue(text[i + 1]);
    int lo = HexValue(text[i + 2]);
    if (hi < 0 || lo < 0) {
      return Status::InvalidArgument("malformed percent-escape in URL");
    }
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

Result<Url> ParseUrl(std::string_view text) {
  if (std::optional<Result<Url>> url = ParseSchemelessUrl(text)) {
    return *std::move(url);
  }
  std::size_t sep = text.find("://");
  if (sep == std::string_view::npos || !ValidScheme(text.substr(0, sep))) {
    // Never echo the text: it may carry a password.
    return Status::InvalidArgument(
        "invalid store URL: expected scheme://..., e.g. sqlite:///path/leases.db");
  }
  Url url;
  for (char c : text.substr(0, sep)) {
    url.scheme += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  std::string_view rest = text.substr(sep + 3);
  std::string_view query;
  if (std::size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  if (url.scheme == "sqlite") {
    LH_ASSIGN_OR_RETURN(url.path, PercentDecode(rest));
  } else {
    std::size_t slash = rest.find('/');
    std::string_view authority = rest.substr(0, slash);
    if (slash != std::string_view::npos) {
      LH_ASSIGN_OR_RETURN(url.path, PercentDecode(rest.substr(slash)));
    }
    if (std::size_t at = authority.rfind('@'); at != std::string_view::npos) {
      std::string_view userinfo = authority.substr(0, at);
      authority = authority.substr(at + 1);
      std::size_t colon = userinfo.find(':');
      LH_ASSIGN_OR_RETURN(url.user, PercentDecode(userinfo.substr(0, colon)));
      if (colon != std::string_view::npos) {
        LH_ASSIGN_OR_RETURN(url.password, PercentDecode(userinfo.substr(colon + 1)));
      }
    }
    url.authority = std::string(authority);
  }
  while (!query.empty()) {
    std::size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) {
      continue;
    }
    std::size_t eq = pair.find('=');
    LH_ASSIGN_OR_RETURN(std::string name, PercentDecode(pair.substr(0, eq)));
    if (name.empty()) {
      // "?=true" would reach a store as the unknown parameter "", named by nothing.
      return Status::InvalidArgument("invalid store URL: a parameter without a name ('=...')");
    }
    std::string value;
    if (eq != std::string_view::npos) {
      LH_ASSIGN_OR_RETURN(value, PercentDecode(pair.substr(eq + 1)));
    }
    if (!url.query.emplace(name, std::move(value)).second) {
      return Status::InvalidArgument(
          fmt::format("invalid store URL: parameter '{}' given twice", name));
    }
  }
  return url;
}

std::string Url::Redacted() const {
  std::string out = scheme + "://";
  if (user) {
    out += *user;
    if (password) {
      out += ":***";
    }
    out += '@';
  }
  out += authority;
  out += path;
  char sep = '?';
  for (const auto& [name, value] : query) {
    // sslpassword is libpq's passphrase of the client key: as secret as the password.
    bool secret = name == "password" || name == "pass" || name == "token" || name == "sslpassword";
    out += fmt::format("{}{}={}", sep, name, secret ? "***" : value);
    sep = '&';
  }
  return out;
}

}  // namespace leasehold::internal
