// File: backends/etcd/etcd_options.cc (internal)
//
// EtcdOptions::FromUrl, on the shared URL readers (backends/common/url_params.h: unknown
// parameters are errors, never ignored) and the shared host list rule (backends/common/
// host_port.h: IPv6 hosts in brackets).

#include "backends/etcd/etcd_options.h"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/common/host_port.h"
#include "backends/common/url_params.h"

namespace leasehold::internal {

namespace {

constexpr std::string_view kPrefixParam = "prefix";
constexpr std::string_view kCommandTimeoutParam = "command_timeout";
constexpr std::string_view kCaParam = "ca";
constexpr std::string_view kCertParam = "cert";
constexpr std::string_view kKeyParam = "key";
constexpr std::string_view kSpareLeaseParam = "spare_lease";
constexpr std::string_view kFairParam = "fair";

constexpr std::string_view kKnownParams[] = {
    kPrefixParam, kCommandTimeoutParam, kSpareLeaseParam, kFairParam,
    kCaParam,     kCertParam,           kKeyParam};

// The member an etcd:// URL without hosts names (etcdctl's default).
constexpr std::string_view kDefaultHost = "127.0.0.1";

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
  LH_RETURN_IF_ERROR(RefuseUnknownParams(url, kKnownParams));
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
  LH_ASSIGN_OR_RETURN(std::vector<HostPort> hosts,
                      ParseHostPorts(url.scheme, url.authority, kEtcdDefaultPort, kDefaultHost));
  options.endpoints.clear();
  for (const HostPort& host : hosts) {
    options.endpoints.push_back(host.ToString());  // "[::1]:2379": gRPC's target syntax
  }

  LH_RETURN_IF_ERROR(ReadStringParam(url, kPrefixParam, &options.prefix));
  LH_RETURN_IF_ERROR(ReadTimeoutParam(url, kCommandTimeoutParam, &options.command_timeout));
  LH_RETURN_IF_ERROR(ReadBoolParam(url, kFairParam, &options.fair));
  LH_RETURN_IF_ERROR(ReadBoolParam(url, kSpareLeaseParam, &options.spare_lease));
  for (auto [param, field] :
       {std::pair{kCaParam, &options.ca_file}, std::pair{kCertParam, &options.cert_file},
        std::pair{kKeyParam, &options.key_file}}) {
    if (url.query.find(param) == url.query.end()) {
      continue;
    }
    if (!tls) {
      return Status::InvalidArgument(
          fmt::format("etcd:// URL parameter {} is for TLS: use an etcds:// URL", param));
    }
    LH_RETURN_IF_ERROR(ReadStringParam(url, param, field));
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return Status::InvalidArgument(
        "etcds:// URL parameters cert and key go together (a client certificate and its key)");
  }
  return options;
}

}  // namespace leasehold::internal
