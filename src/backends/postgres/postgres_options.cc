// File: backends/postgres/postgres_options.cc (internal)
//
// PostgresOptions::FromUrl. leasehold's parameters are checked here; libpq's own are passed on
// and checked by libpq at connect, so a typo there is an error too, never silently ignored.

#include "backends/postgres/postgres_options.h"

#include <cctype>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "backends/common/host_port.h"
#include "backends/common/url_params.h"

namespace leasehold::internal {

namespace {

constexpr std::string_view kModeParam = "mode";
constexpr std::string_view kSchemaParam = "schema";
constexpr std::string_view kCreateSchemaParam = "create_schema";
constexpr std::string_view kCommandTimeoutParam = "command_timeout";

constexpr std::size_t kMaxIdentifierBytes = 63;  // NAMEDATALEN - 1
// libpq's own default, for host entries without a port (which then stay empty for libpq).
constexpr int kDefaultPort = 5432;

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

// Splits "h1:p1,[::1]:p2,h3" into libpq's comma-separated host and port lists: hosts without
// brackets (libpq wants an IPv6 address bare in host=), and an empty port entry for a host that
// named none (libpq's default), or no port list at all when none did. An empty authority
// (a conninfo, or postgres:///db) leaves both empty: libpq's defaults (PGHOST, the socket).
Status SplitAuthority(const Url& url, std::string* hosts, std::string* ports) {
  if (url.authority.empty()) {
    return Status();
  }
  LH_ASSIGN_OR_RETURN(std::vector<HostPort> list,
                      ParseHostPorts(url.scheme, url.authority, kDefaultPort, /*default_host=*/{},
                                     /*allow_empty_host=*/true));  // libpq's default host
  bool any_port = false;
  for (std::size_t i = 0; i < list.size(); ++i) {
    *hosts += (i == 0 ? "" : ",") + list[i].host;
    *ports += (i == 0 ? "" : ",") + (list[i].port_given ? std::to_string(list[i].port) : "");
    any_port = any_port || list[i].port_given;
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
  if (url.password && url.query.contains("password")) {
    // libpq would take one and ScrubPassword would know only the other.
    return Status::InvalidArgument(fmt::format(
        "{}:// URL gives the password twice (user:password@ and ?password=)", url.scheme));
  }
  PostgresOptions options;
  options.display = url.Redacted();
  std::string hosts;
  std::string ports;
  LH_RETURN_IF_ERROR(SplitAuthority(url, &hosts, &ports));
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
        return BadParam(url, name, "must be advisory or table");
      }
    } else if (name == kSchemaParam) {
      if (!IsPlainIdentifier(value)) {
        return BadParam(url, name,
                        "must be a plain identifier: lower-case letters, digits and '_', not "
                        "starting with a digit, at most 63 bytes");
      }
      options.schema = value;
    } else if (name == kCreateSchemaParam) {
      LH_RETURN_IF_ERROR(ReadBoolParam(url, name, &options.create_schema));
    } else if (name == kCommandTimeoutParam) {
      LH_RETURN_IF_ERROR(ReadTimeoutParam(url, name, &options.command_timeout));
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
