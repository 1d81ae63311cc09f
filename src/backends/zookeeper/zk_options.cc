// File: backends/zookeeper/zk_options.cc (internal)
//
// ZkOptions::FromUrl. Unknown parameters are errors, never ignored.

#include "backends/zookeeper/zk_options.h"

#include <charconv>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/duration.h"

namespace leasehold::internal {

namespace {

constexpr std::string_view kConnectTimeoutParam = "connect_timeout";
constexpr std::string_view kCommandTimeoutParam = "command_timeout";

constexpr Duration kMaxTimeout = std::chrono::hours(1);

Result<Duration> ParseTimeout(std::string_view name, std::string_view text) {
  Result<Duration> d = ParseDuration(text);
  if (!d.ok()) {
    return d.status().WithContext(fmt::format("zk:// URL parameter {}", name));
  }
  if (*d <= Duration::zero() || *d > kMaxTimeout) {
    return Status::InvalidArgument(
        fmt::format("zk:// URL parameter {}={} must be above 0 and at most {}", name, text,
                    FormatDuration(kMaxTimeout)));
  }
  return *d;
}

// Returns "host:port" with the default port added; kInvalidArgument for an empty host or a bad
// port.
Result<std::string> NormalizeHost(std::string_view entry) {
  std::string_view host = entry;
  std::string_view port_text;
  if (!entry.empty() && entry.front() == '[') {  // [::1]:2181
    std::size_t close = entry.find(']');
    if (close == std::string_view::npos) {
      return Status::InvalidArgument("zk:// URL has an unclosed '[' in a host");
    }
    host = entry.substr(0, close + 1);
    std::string_view rest = entry.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') {
        return Status::InvalidArgument("zk:// URL has junk after an IPv6 host");
      }
      port_text = rest.substr(1);
    }
  } else if (std::size_t colon = entry.rfind(':'); colon != std::string_view::npos) {
    host = entry.substr(0, colon);
    port_text = entry.substr(colon + 1);
  }
  if (host.empty()) {
    return Status::InvalidArgument(
        fmt::format("zk:// URL has an empty host in '{}' (expected host:port)", entry));
  }
  int port = kZkDefaultPort;
  if (!port_text.empty()) {
    auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 1 ||
        port > 65535) {
      return Status::InvalidArgument(
          fmt::format("zk:// URL has a bad port '{}' (1-65535)", port_text));
    }
  }
  return fmt::format("{}:{}", host, port);
}

}  // namespace

std::string ZkOptions::Address() const {
  return hosts + chroot;
}

Result<ZkOptions> ZkOptions::FromUrl(const Url& url) {
  if (url.scheme != "zk") {
    return Status::InvalidArgument(
        fmt::format("expected a zk:// URL, got scheme \"{}\"", url.scheme));
  }
  std::vector<std::string> unknown;
  for (const auto& [name, value] : url.query) {
    if (name != kConnectTimeoutParam && name != kCommandTimeoutParam) {
      unknown.push_back(name);
    }
  }
  if (!unknown.empty()) {
    return Status::InvalidArgument(fmt::format(
        "unknown zk:// URL parameter{} {} (known: {}, {})", unknown.size() == 1 ? "" : "s",
        fmt::join(unknown, ", "), kConnectTimeoutParam, kCommandTimeoutParam));
  }
  ZkOptions options;
  if (url.user.has_value() || url.password.has_value()) {
    if (!url.user.has_value() || url.user->empty() || !url.password.has_value()) {
      return Status::InvalidArgument(
          "zk:// URL credentials must be user:password (ZooKeeper digest authentication)");
    }
    options.user = url.user;
    options.password = url.password;
  }
  if (!url.authority.empty()) {
    std::vector<std::string> hosts;
    std::string_view rest = url.authority;
    while (true) {
      std::size_t comma = rest.find(',');
      LH_ASSIGN_OR_RETURN(std::string host, NormalizeHost(rest.substr(0, comma)));
      hosts.push_back(std::move(host));
      if (comma == std::string_view::npos) {
        break;
      }
      rest.remove_prefix(comma + 1);
    }
    options.hosts = fmt::format("{}", fmt::join(hosts, ","));
  }
  std::string chroot = url.path;
  while (chroot.size() > 1 && chroot.back() == '/') {
    chroot.pop_back();
  }
  if (chroot == "/") {
    chroot.clear();
  }
  if (!chroot.empty()) {
    if (chroot.find("//") != std::string::npos || chroot.find('\0') != std::string::npos ||
        chroot.find("/./") != std::string::npos || chroot.find("/../") != std::string::npos ||
        chroot.ends_with("/.") || chroot.ends_with("/..")) {
      return Status::InvalidArgument(
          fmt::format("zk:// URL chroot '{}' is not a valid ZooKeeper path", chroot));
    }
  }
  options.chroot = chroot;
  if (auto it = url.query.find(kConnectTimeoutParam); it != url.query.end()) {
    LH_ASSIGN_OR_RETURN(options.connect_timeout, ParseTimeout(kConnectTimeoutParam, it->second));
  }
  if (auto it = url.query.find(kCommandTimeoutParam); it != url.query.end()) {
    LH_ASSIGN_OR_RETURN(options.command_timeout, ParseTimeout(kCommandTimeoutParam, it->second));
  }
  return options;
}

}  // namespace leasehold::internal
