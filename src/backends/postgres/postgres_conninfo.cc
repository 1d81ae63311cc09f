#include "backends/postgres/postgres_conninfo.h"

#include <cctype>

#include <fmt/format.h>

namespace leasehold::internal {

namespace {

// Returns true if `text` starts like a libpq key=value conninfo: "keyword =". A URL never does
// (its scheme is followed by "://"), so a value may hold "://" (application_name=http://x).
bool LooksLikeConninfo(std::string_view text) {
  std::size_t i = text.find_first_not_of(" \t\n");
  std::size_t start = i;
  while (i < text.size() &&
         (std::islower(static_cast<unsigned char>(text[i])) != 0 || text[i] == '_')) {
    ++i;
  }
  if (start == std::string_view::npos || i == start) {
    return false;
  }
  i = text.find_first_not_of(" \t\n", i);
  return i != std::string_view::npos && text[i] == '=';
}

// Parses libpq's key=value form: values are bare words or single-quoted, with \\ and \' escapes.
Result<Url> ParseConninfo(std::string_view text) {
  Url url;
  url.scheme = "postgres";
  std::size_t i = 0;
  auto skip_space = [&] {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i])) != 0) {
      ++i;
    }
  };
  while (true) {
    skip_space();
    if (i >= text.size()) {
      break;
    }
    std::size_t start = i;
    while (i < text.size() &&
           (std::isalnum(static_cast<unsigned char>(text[i])) != 0 || text[i] == '_')) {
      ++i;
    }
    std::string name(text.substr(start, i - start));
    skip_space();
    if (name.empty() || i >= text.size() || text[i] != '=') {
      // Never echo the text: it may carry a password.
      return Status::InvalidArgument(
          "invalid PostgreSQL conninfo: expected keyword=value pairs, e.g. host=db1 dbname=app");
    }
    ++i;
    skip_space();
    std::string value;
    if (i < text.size() && text[i] == '\'') {
      ++i;
      bool closed = false;
      while (i < text.size()) {
        char c = text[i++];
        if (c == '\\' && i < text.size()) {
          value += text[i++];
        } else if (c == '\'') {
          closed = true;
          break;
        } else {
          value += c;
        }
      }
      if (!closed) {
        return Status::InvalidArgument("invalid PostgreSQL conninfo: unterminated quoted value");
      }
    } else {
      while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i])) == 0) {
        char c = text[i++];
        if (c == '\\' && i < text.size()) {
          c = text[i++];
        }
        value += c;
      }
    }
    if (!url.query.emplace(name, std::move(value)).second) {
      return Status::InvalidArgument(
          fmt::format("invalid PostgreSQL conninfo: keyword '{}' given twice", name));
    }
  }
  return url;
}

}  // namespace

std::optional<Result<Url>> ParsePostgresConninfo(std::string_view text) {
  if (!LooksLikeConninfo(text)) {
    return std::nullopt;
  }
  return ParseConninfo(text);
}

}  // namespace leasehold::internal
