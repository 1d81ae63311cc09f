// File: backends/zookeeper/zk_options.cc (internal)
//
// ZkOptions::FromUrl, on the shared URL readers (backends/common): unknown parameters are
// errors, never ignored, and the host list follows the one IPv6 rule (brackets).

#include "backends/zookeeper/zk_options.h"

#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/common/host_port.h"
#include "backends/common/url_params.h"

namespace leasehold::internal {

namespace {

constexpr std::string_view kConnectTimeoutParam = "connect_timeout";
constexpr std::string_view kCommandTimeoutParam = "command_timeout";
constexpr std::string_view kKnownParams[] = {kConnectTimeoutParam, kCommandTimeoutParam};

// Returns the chroot of the URL's path without trailing '/' ("" for the root);
// kInvalidArgument if it is not a valid ZooKeeper path.
Result<std::string> ChrootOf(const Url& url) {
  std::string chroot = url.path;
  while (chroot.size() > 1 && chroot.back() == '/') {
    chroot.pop_back();
  }
  if (chroot == "/") {
    chroot.clear();
  }
  // A zk:// URL's path always starts with '/'; a Url built otherwise (the fuzz target's
  // steered URLs) must not give a relative chroot: ZooKeeper paths are absolute.
  if ((!chroot.empty() && chroot.front() != '/') || chroot.find("//") != std::string::npos ||
      chroot.find('\0') != std::string::npos || chroot.find("/./") != std::string::npos ||
      chroot.find("/../") != std::string::npos || chroot.ends_with("/.") ||
      chroot.ends_with("/..")) {
    return Status::InvalidArgument(
        fmt::format("zk:// URL chroot '{}' is not a valid ZooKeeper path", chroot));
  }
  return chroot;
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
  LH_RETURN_IF_ERROR(RefuseUnknownParams(url, kKnownParams));
  ZkOptions options;
  if (url.user.has_value() || url.password.has_value()) {
    if (!url.user.has_value() || url.user->empty() || !url.password.has_value()) {
      return Status::InvalidArgument(
          "zk:// URL credentials must be user:password (ZooKeeper digest authentication)");
    }
    options.user = url.user;
    options.password = url.password;
  }
  // The C client takes the same "h:p,[v6]:p" form: IPv6 hosts stay in brackets.
  LH_ASSIGN_OR_RETURN(std::vector<HostPort> hosts,
                      ParseHostPorts(url.scheme, url.authority, kZkDefaultPort, "127.0.0.1"));
  std::vector<std::string> entries;
  entries.reserve(hosts.size());
  for (const HostPort& host : hosts) {
    entries.push_back(host.ToString());
  }
  options.hosts = fmt::format("{}", fmt::join(entries, ","));
  LH_ASSIGN_OR_RETURN(options.chroot, ChrootOf(url));
  LH_RETURN_IF_ERROR(ReadTimeoutParam(url, kConnectTimeoutParam, &options.connect_timeout));
  LH_RETURN_IF_ERROR(ReadTimeoutParam(url, kCommandTimeoutParam, &options.command_timeout));
  return options;
}

}  // namespace leasehold::internal
