// File: backends/etcd/etcd_options.cc (internal)
//
// EtcdOptions::FromUrl. Unknown parameters are errors, never ignored.

#include "backends/etcd/etcd_options.h"

#include <charconv>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/duration.h"

namespace leasehold::internal {

namespace {

constexpr std::string_view kPrefixParam = "prefix";
constexpr std::string_view kCommandTimeoutParam = "command_timeout";
constexpr std::string_view kCaParam = "ca";
constexpr std::string_view kCertParam = "cert";
constexpr std::string_view kKeyParam = "key";
constexpr std::string_view kSpareLeaseParam = "spare_lease";

constexpr std::string_view kKnownParams[] = {kPrefixParam, kCommandTimeoutParam, kSpareLeaseParam,
                                             kCaParam,     kCertParam,           kKeyParam};

constexpr Duration kMaxTimeout = std::chrono::hours(1);

Result<std::string> ParseEndpoint(std::string_view scheme, std::string_view text) {
  std::string host;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {  // [::1]:2379
    std::size_t close = text.find(']');
    if (close == std::string_view::npos) {
      return Status::InvalidArgument(
          fmt::format("{}:// URL has an unclosed '[' in host '{}'", scheme, text));
    }
    host = std::string(text.substr(0, close + 1));
    std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') {
        return Status::InvalidArgument(
            fmt::format("{}:// URL has junk after the IPv6 host '{}'", scheme, text));
      }
      port_text = rest.substr(1);
    }
  } else if (std::size_t colon = text.rfind(':'); colon != std::string_view::npos) {
    host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  } else {
    host = std::string(text);
  }
  if (host.empty()) {
    return Status::InvalidArgument(
        fmt::format("{}:// URL has an empty host in '{}' (write host:port)", scheme, text));
  }
  int port = kEtcdDefaultPort;
  if (!port_text.empty()) {
    auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 1 ||
        port > 65535) {
      return Status::InvalidArgument(
          fmt::format("{}:// URL has a bad port '{}' (1-65535)", scheme, port_text));
    }
  }
  return fmt::format("{}:{}", host, port);
}

}  // namespace

std::string EtcdOptions::Address() const {
  return fmt::format("{}", fmt::join(endpoints, ","));
}

Result<EtcdOptions> EtcdOptions::FromUrl(const Url& url) {
  const bool tls = url.scheme == "etcds";
  if (url.scheme != "etcd" && !tls) {
    return Status::InvalidArgument(
        fmt::format("expected an etcd:// or etcds:// URL, got scheme \"{}\"", url.scheme));
  }
  std::vector<std::string> unknown;
  for (const auto& [name, value] : url.query) {
    bool known = false;
    for (std::string_view k : kKnownParams) {
      known = known || name == k;
    }
    if (!known) {
      unknown.push_back(name);
    }
  }
  if (!unknown.empty()) {
    return Status::InvalidArgument(
        fmt::format("unknown {}:// URL parameter{} {} (known: {})", url.scheme,
                    unknown.size() == 1 ? "" : "s", fmt::join(unknown, ", "),
                    fmt::join(std::begin(kKnownParams), std::end(kKnownParams), ", ")));
  }
  if (!url.path.empty() && url.path != "/") {
    return Status::InvalidArgument(
        fmt::format("{}:// URL takes no path (got '{}'); use ?prefix= to namespace keys",
                    url.scheme, url.path));
  }

  EtcdOptions options;
  options.tls = tls;
  options.user = url.user;
  options.password = url.password;
  if (options.user && options.user->empty()) {
    return Status::InvalidArgument(fmt::format("{}:// URL has a password but no user", url.scheme));
  }
  if (options.user && !options.password) {
    options.password = "";
  }
  if (!url.authority.empty()) {
    options.endpoints.clear();
    std::string_view rest = url.authority;
    while (true) {
      std::size_t comma = rest.find(',');
      LH_ASSIGN_OR_RETURN(std::string endpoint, ParseEndpoint(url.scheme, rest.substr(0, comma)));
      options.endpoints.push_back(std::move(endpoint));
      if (comma == std::string_view::npos) {
        break;
      }
      rest = rest.substr(comma + 1);
    }
  }

  if (auto it = url.query.find(kPrefixParam); it != url.query.end()) {
    if (it->second.empty()) {
      return Status::InvalidArgument(
          fmt::format("{}:// URL parameter prefix must not be empty", url.scheme));
    }
    options.prefix = it->second;
  }
  if (auto it = url.query.find(kCommandTimeoutParam); it != url.query.end()) {
    Result<Duration> d = ParseDuration(it->second);
    if (!d.ok()) {
      return d.status().WithContext(
          fmt::format("{}:// URL parameter {}", url.scheme, kCommandTimeoutParam));
    }
    if (*d <= Duration::zero() || *d > kMaxTimeout) {
      return Status::InvalidArgument(
          fmt::format("{}:// URL parameter {}={} must be above 0 and at most {}", url.scheme,
                      kCommandTimeoutParam, it->second, FormatDuration(kMaxTimeout)));
    }
    options.command_timeout = *d;
  }
  if (auto it = url.query.find(kSpareLeaseParam); it != url.query.end()) {
    if (it->second == "false") {
      options.spare_lease = false;
    } else if (it->second != "true") {
      return Status::InvalidArgument(fmt::format(
          "{}:// URL parameter spare_lease={} must be true or false", url.scheme, it->second));
    }
  }
  for (auto [param, field] :
       {std::pair{kCaParam, &options.ca_file}, std::pair{kCertParam, &options.cert_file},
        std::pair{kKeyParam, &options.key_file}}) {
    if (auto it = url.query.find(param); it != url.query.end()) {
      if (!tls) {
        return Status::InvalidArgument(
            fmt::format("etcd:// URL parameter {} is for TLS: use an etcds:// URL", param));
      }
      if (it->second.empty()) {
        return Status::InvalidArgument(
            fmt::format("etcds:// URL parameter {} must name a PEM file", param));
      }
      *field = it->second;
    }
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return Status::InvalidArgument(
        "etcds:// URL parameters cert and key go together (a client certificate and its key)");
  }
  return options;
}

}  // namespace leasehold::internal
