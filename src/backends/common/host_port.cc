#include "backends/common/host_port.h"

#include <fmt/format.h>

#include "backends/common/url_params.h"

namespace leasehold::internal {

std::string HostPort::HostForUrl() const {
  return host.find(':') != std::string::npos ? fmt::format("[{}]", host) : host;
}

std::string HostPort::ToString() const {
  return fmt::format("{}:{}", HostForUrl(), port);
}

Result<HostPort> ParseHostPort(std::string_view scheme, std::string_view entry, int default_port,
                               bool allow_empty_host) {
  HostPort out;
  out.port = default_port;
  std::string_view port_text;
  bool has_port = false;
  if (!entry.empty() && entry.front() == '[') {  // [::1]:2379
    std::size_t close = entry.find(']');
    if (close == std::string_view::npos) {
      return Status::InvalidArgument(
          fmt::format("{}:// URL has an unclosed '[' in host '{}'", scheme, entry));
    }
    out.host = std::string(entry.substr(1, close - 1));
    std::string_view rest = entry.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') {
        return Status::InvalidArgument(
            fmt::format("{}:// URL has junk after the IPv6 host '{}'", scheme, entry));
      }
      port_text = rest.substr(1);
      has_port = true;
    }
  } else if (std::size_t colon = entry.find(':'); colon != std::string_view::npos) {
    if (entry.find(':', colon + 1) != std::string_view::npos) {
      return Status::InvalidArgument(fmt::format(
          "{}:// URL host '{}' has several ':'; write an IPv6 address in brackets, e.g. [::1]:{}",
          scheme, entry, default_port));
    }
    out.host = std::string(entry.substr(0, colon));
    port_text = entry.substr(colon + 1);
    has_port = true;
  } else {
    out.host = std::string(entry);
  }
  if (out.host.empty() && !allow_empty_host) {
    return Status::InvalidArgument(
        fmt::format("{}:// URL has an empty host in '{}' (write host:port)", scheme, entry));
  }
  if (has_port && !port_text.empty()) {
    if (!ParseWholeNumber(port_text, 1, 65535, &out.port)) {
      return Status::InvalidArgument(
          fmt::format("{}:// URL has a bad port '{}' (1-65535)", scheme, port_text));
    }
    out.port_given = true;
  }
  return out;
}

Result<std::vector<HostPort>> ParseHostPorts(std::string_view scheme, std::string_view authority,
                                             int default_port, std::string_view default_host,
                                             bool allow_empty_host) {
  std::vector<HostPort> hosts;
  if (authority.empty()) {
    if (default_host.empty()) {
      return Status::InvalidArgument(fmt::format("{}:// URL names no host", scheme));
    }
    hosts.push_back(HostPort{std::string(default_host), default_port, false});
    return hosts;
  }
  while (true) {
    std::size_t comma = authority.find(',');
    LH_ASSIGN_OR_RETURN(HostPort one, ParseHostPort(scheme, authority.substr(0, comma),
                                                    default_port, allow_empty_host));
    if (one.host.empty()) {
      one.host = std::string(default_host);
    }
    hosts.push_back(std::move(one));
    if (comma == std::string_view::npos) {
      break;
    }
    authority.remove_prefix(comma + 1);
  }
  return hosts;
}

}  // namespace leasehold::internal
