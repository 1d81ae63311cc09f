// File: backends/postgres/postgres_options.cc (internal)
//
// PostgresOptions::FromUrl. leasehold's parameters are checked here; libpq's own are passed on
// and checked by libpq at connect, so a typo there is an error too, never silently ignored.

#include "backends/postgres/postgres_options.h"

#include <cctype>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "core/duration.h"

namespace leasehold::internal {

namespace {

constexpr std::string_view kModeParam = "mode";
constexpr std::string_view kSchemaParam = "schema";
constexpr std::string_view kCreateSchemaParam = "create_schema";
constexpr std::string_view kCommandTimeoutParam = "command_timeout";

constexpr Duration kMaxTimeout = std::chrono::hours(1);
constexpr std::size_t kMaxIdentifierBytes = 63;  // NAMEDATALEN - 1

bool IsPlainIdentifier(std::string_view name) {
  if (name.empty() || name.size() > kMaxIdentifierBytes ||
      std::isdigit(static_cast<unsigned char>(name[0])) != 0) {
    return false;
  }
  for (char c : name) {
    if (!(std::islower(static_cast<unsigned char>(c)) != 0 ||
          std::isdigit(static_cast<unsigned char>(c)) != 0 || c == '_')) {
      return false;
    }
  }
  return true;
}

// Splits "h1:p1,[::1]:p2,h3" into libpq's comma-separated host and port lists.
Status SplitAuthority(std::string_view authority, std::string* hosts, std::string* ports) {
  bool any_port = false;
  std::vector<std::string> host_list;
  std::vector<std::string> port_list;
  while (!authority.empty()) {
    std::size_t comma = authority.find(',');
    if (authority.front() == '[') {
      comma = authority.find(',', authority.find(']'));
    }
    std::string_view one = authority.substr(0, comma);
    authority = comma == std::string_view::npos ? std::string_view() : authority.substr(comma + 1);
    std::string_view host = one;
    std::string_view port;
    if (!one.empty() && one.front() == '[') {
      std::size_t close = one.find(']');
      if (close == std::string_view::npos) {
        return Status::InvalidArgument("postgres:// URL has an unclosed '[' in a host");
      }
      host = one.substr(1, close - 1);
      if (close + 1 < one.size()) {
        if (one[close + 1] != ':') {
          return Status::InvalidArgument("postgres:// URL has junk after an IPv6 host");
        }
        port = one.substr(close + 2);
      }
    } else if (std::size_t colon = one.rfind(':'); colon != std::string_view::npos) {
      host = one.substr(0, colon);
      port = one.substr(colon + 1);
    }
    for (char c : port) {
      if (std::isdigit(static_cast<unsigned char>(c)) == 0) {
        return Status::InvalidArgument(
            fmt::format("postgres:// URL has a bad port '{}'", port));
      }
    }
    any_port = any_port || !port.empty();
    host_list.emplace_back(host);
    port_list.emplace_back(port);
  }
  for (std::size_t i = 0; i < host_list.size(); ++i) {
    *hosts += (i == 0 ? "" : ",") + host_list[i];
    *ports += (i == 0 ? "" : ",") + port_list[i];
  }
  if (!any_port) {
    ports->clear();
  }
  return Status();
}

}  // namespace

std::string_view PostgresOptions::ModeName() const {
  return mode == PostgresMode::kAdvisory ? "mode=advisory" : "mode=table";
}

std::string ScrubPassword(std::string message, const std::optional<std::string>& password) {
  // "password=secret" or "password = 'se cret'" as libpq may echo a conninfo.
  for (std::size_t at = message.find("password"); at != std::string::npos;
       at = message.find("password", at + 1)) {
    std::size_t i = at + 8;
    while (i < message.size() && message[i] == ' ') {
      ++i;
    }
    if (i >= message.size() || message[i] != '=') {
      continue;
    }
    ++i;
    while (i < message.size() && message[i] == ' ') {
      ++i;
    }
    std::size_t end = i;
    if (end < message.size() && message[end] == '\'') {
      ++end;
      while (end < message.size() && message[end] != '\'') {
        end += message[end] == '\\' ? 2 : 1;
      }
      end = std::min(end + 1, message.size());
    } else {
      while (end < message.size() && std::isspace(static_cast<unsigned char>(message[end])) == 0) {
        ++end;
      }
    }
    message.replace(i, end - i, "***");
  }
  if (password && password->size() >= 3) {
    for (std::size_t at = message.find(*password); at != std::string::npos;
         at = message.find(*password, at + 3)) {
      message.replace(at, password->size(), "***");
    }
  }
  return message;
}

Result<PostgresOptions> PostgresOptions::FromUrl(const Url& url) {
  if (url.scheme != "postgres" && url.scheme != "postgresql") {
    return Status::InvalidArgument(
        fmt::format("expected a postgres:// URL, got scheme \"{}\"", url.scheme));
  }
  PostgresOptions options;
  options.display = url.Redacted();
  std::string hosts;
  std::string ports;
  LH_RETURN_IF_ERROR(SplitAuthority(url.authority, &hosts, &ports));
  if (!hosts.empty()) {
    options.libpq_params.emplace_back("host", hosts);
  }
  if (!ports.empty()) {
    options.libpq_params.emplace_back("port", ports);
  }
  if (url.user && !url.user->empty()) {
    options.libpq_params.emplace_back("user", *url.user);
  }
  if (url.password) {
    options.libpq_params.emplace_back("password", *url.password);
    options.password = url.password;
  }
  if (url.path.size() > 1) {
    options.libpq_params.emplace_back("dbname", url.path.substr(1));
  }
  bool has_application_name = false;
  bool has_connect_timeout = false;
  for (const auto& [name, value] : url.query) {
    if (name == kModeParam) {
      if (value == "advisory") {
        options.mode = PostgresMode::kAdvisory;
      } else if (value == "table") {
        options.mode = PostgresMode::kTable;
      } else {
        return Status::InvalidArgument(fmt::format(
            "postgres:// URL parameter mode={} must be advisory or table", value));
      }
    } else if (name == kSchemaParam) {
      if (!IsPlainIdentifier(value)) {
        return Status::InvalidArgument(fmt::format(
            "postgres:// URL parameter schema={} must be a plain identifier: lower-case "
            "letters, digits and '_', not starting with a digit, at most 63 bytes",
            value));
      }
      options.schema = value;
    } else if (name == kCreateSchemaParam) {
      if (value != "true" && value != "false") {
        return Status::InvalidArgument(fmt::format(
            "postgres:// URL parameter create_schema={} must be true or false", value));
      }
      options.create_schema = value == "true";
    } else if (name == kCommandTimeoutParam) {
      Result<Duration> d = ParseDuration(value);
      if (!d.ok()) {
        return d.status().WithContext("postgres:// URL parameter command_timeout");
      }
      if (*d <= Duration::zero() || *d > kMaxTimeout) {
        return Status::InvalidArgument(fmt::format(
            "postgres:// URL parameter command_timeout={} must be above 0 and at most 1h",
            value));
      }
      options.command_timeout = *d;
    } else {
      if (name == "password") {
        options.password = value;
      }
      has_application_name = has_application_name || name == "application_name";
      has_connect_timeout = has_connect_timeout || name == "connect_timeout";
      options.libpq_params.emplace_back(name, value);
    }
  }
  if (!has_application_name) {
    options.libpq_params.emplace_back("application_name", "leasehold");
  }
  if (!has_connect_timeout) {
    options.libpq_params.emplace_back("connect_timeout", "5");
  }
  return options;
}

}  // namespace leasehold::internal
