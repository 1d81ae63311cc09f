// File: backends/common/host_port.h (internal)
//
// The host list of a store URL's authority, "h1:p1,[::1]:p2,h3", read by one rule for every
// store: an IPv6 address is written in brackets ("[::1]:2379", "[fe80::1]"), a missing or empty
// port ("db1", "db1:") is the store's default, a port is a whole number in [1, 65535], and an
// empty host is an error unless the store allows it (libpq's default host; Redis' 127.0.0.1).
// The brackets are not part of HostPort::host; HostPort::ToString() puts them back.
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(std::vector<HostPort> hosts,
//                       ParseHostPorts(url.scheme, url.authority, /*default_port=*/2379));
//   hosts[0].ToString();  // "[::1]:2379" or "10.0.0.1:2379"
//
// Thread safety: a plain value type and a function.

#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "leasehold/status.h"

namespace leasehold::internal {

struct HostPort {
  // Without brackets: "::1", "db1.example.com".
  std::string host;
  int port = 0;
  // True if the URL named the port (else `port` is the default).
  bool port_given = false;

  // Returns "host:port", with the host in brackets if it is an IPv6 address.
  [[nodiscard]] std::string ToString() const;
  // Returns the host, in brackets if it is an IPv6 address.
  [[nodiscard]] std::string HostForUrl() const;
};

// Reads one "host[:port]" entry. Returns kInvalidArgument, naming `scheme`, for an unclosed '[',
// junk after "]", several ':' outside brackets, a bad port, or an empty host unless
// `allow_empty_host` (then HostPort::host is empty).
Result<HostPort> ParseHostPort(std::string_view scheme, std::string_view entry, int default_port,
                               bool allow_empty_host = false);

// Reads a comma-separated list of entries (at least one). An empty `authority` gives
// {default_host:default_port} if default_host is not empty, and an error otherwise. With
// `allow_empty_host`, an entry's empty host (":6380") becomes default_host (which may be empty).
Result<std::vector<HostPort>> ParseHostPorts(std::string_view scheme, std::string_view authority,
                                             int default_port, std::string_view default_host = {},
                                             bool allow_empty_host = false);

}  // namespace leasehold::internal
