// File: tests/fuzz/postgres_conninfo_fuzz.cc
//
// ParsePostgresConninfo (backends/postgres/postgres_conninfo.h): libpq's key=value form.
// Invariants: the text is taken as a conninfo only when it starts like one (never a URL); a
// conninfo that parses is a postgres:// URL whose keywords are non-empty words of [A-Za-z0-9_]; an
// error does not depend on the password value; the URL's Redacted() and PostgresOptions::display do
// not depend on the password; a conninfo rendered back from the URL (every value quoted) parses to
// the same pairs.

#include <cctype>
#include <string>

#include "backends/postgres/postgres_conninfo.h"
#include "backends/postgres/postgres_options.h"
#include "options_fuzz.h"

namespace {

// The URL's pairs as a conninfo, every value single-quoted with \\ and \' escapes.
std::string Render(const leasehold::internal::Url& url) {
  std::string out;
  for (const auto& [name, value] : url.query) {
    out += name;
    out += "='";
    for (char c : value) {
      if (c == '\\' || c == '\'') {
        out += '\\';
      }
      out += c;
    }
    out += "' ";
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using leasehold::internal::ParsePostgresConninfo;
  using leasehold::internal::Url;
  using namespace leasehold::fuzz;
  const std::string_view text = AsText(data, size);
  if (Contains(text, kSecretMarker)) {
    return 0;  // the marker must be what only the secrets hold
  }
  std::optional<leasehold::Result<Url>> url = ParsePostgresConninfo(text);
  if (!url) {
    return 0;
  }
  // A URL ("scheme://", the scheme lower-case letters here) is never taken for a conninfo.
  const std::size_t start = text.find_first_not_of(" \t\n");
  const std::size_t word_end = text.find_first_not_of("abcdefghijklmnopqrstuvwxyz_", start);
  FUZZ_CHECK(word_end == std::string_view::npos || text.substr(word_end, 3) != "://",
             "a URL taken for a conninfo");
  if (!url->ok()) {
    FUZZ_CHECK(url->status().code() == leasehold::StatusCode::kInvalidArgument,
               url->status().message());
    // The same text with another bare password value (no space, quote or backslash in it,
    // so the text splits the same way) must fail with the same message.
    std::size_t at = text.find("password=");
    if (at != std::string_view::npos) {
      std::string_view value = text.substr(at + 9);
      value = value.substr(0, value.find_first_of(" \t\n\v\f\r'\\"));
      std::string other(text);
      other.replace(at + 9, value.size(), std::string(value.size(), value == "Q" ? 'R' : 'Q'));
      if (!value.empty() && value.find_first_not_of('Q') != std::string_view::npos) {
        std::optional<leasehold::Result<Url>> again = ParsePostgresConninfo(other);
        FUZZ_CHECK(again && !again->ok() && again->status().message() == url->status().message(),
                   url->status().message());
      }
    }
    return 0;
  }
  const Url& parsed = **url;
  FUZZ_CHECK(parsed.scheme == "postgres", parsed.scheme);
  for (const auto& [name, value] : parsed.query) {
    FUZZ_CHECK(!name.empty(), "empty keyword");
    for (char c : name) {
      FUZZ_CHECK(std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_', name);
    }
  }
  // Rendered in key order: the text starts like a conninfo only if the first key does
  // (LooksLikeConninfo wants [a-z_]; later keywords may hold digits and capitals).
  std::optional<leasehold::Result<Url>> again = ParsePostgresConninfo(Render(parsed));
  if (!parsed.query.empty() && parsed.query.begin()->first.find_first_not_of(
                                   "abcdefghijklmnopqrstuvwxyz_") == std::string::npos) {
    FUZZ_CHECK(again && again->ok() && (*again)->query == parsed.query, Render(parsed));
  }
  Url marked = parsed;
  auto it = marked.query.find("password");
  if (it != marked.query.end()) {
    it->second = std::string(kSecretMarker);
    FUZZ_CHECK(!Contains(marked.Redacted(), kSecretMarker), marked.Redacted());
    FUZZ_CHECK(marked.Redacted() == parsed.Redacted(), parsed.Redacted());
    leasehold::Result<leasehold::internal::PostgresOptions> options =
        leasehold::internal::PostgresOptions::FromUrl(marked);
    if (options.ok()) {
      FUZZ_CHECK(!Contains(options->display, kSecretMarker), options->display);
    } else {
      FUZZ_CHECK(!Contains(options.status().message(), kSecretMarker), options.status().message());
    }
  }
  return 0;
}
