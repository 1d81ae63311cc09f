// File: backends/redis/redis_options.cc (internal)
//
// RedisOptions::FromUrl, on the shared URL readers (backends/common/url_params.h, host_port.h).
// Unknown parameters are errors, never ignored: a typo such as "comand_timeout=10s" must not
// silently leave the default in place.

#include "backends/redis/redis_options.h"

#include <algorithm>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "backends/common/host_port.h"
#include "backends/common/url_params.h"

namespace leasehold::internal {

namespace {

constexpr std::string_view kConnectTimeoutParam = "connect_timeout";
constexpr std::string_view kCommandTimeoutParam = "command_timeout";
constexpr std::string_view kPrefixParam = "prefix";
constexpr std::string_view kMinReplicasParam = "min_replicas";
constexpr std::string_view kReplicaTimeoutParam = "replica_timeout";
constexpr std::string_view kPoolSizeParam = "pool_size";
constexpr std::string_view kFairParam = "fair";
constexpr std::string_view kAcceptEvictionParam = "accept_eviction";
constexpr std::string_view kDbParam = "db";
constexpr std::string_view kCaParam = "ca";
constexpr std::string_view kCertParam = "cert";
constexpr std::string_view kKeyParam = "key";
constexpr std::string_view kSniParam = "sni";
constexpr std::string_view kInsecureParam = "insecure";

constexpr std::string_view kKnownParams[] = {
    kConnectTimeoutParam, kCommandTimeoutParam, kPrefixParam, kMinReplicasParam,
    kReplicaTimeoutParam, kPoolSizeParam,       kFairParam,   kAcceptEvictionParam,
};
// rediss:// knows these too; redis+unix:// knows db (a redis:// URL's database is the path).
constexpr std::string_view kTlsParams[] = {kCaParam, kCertParam, kKeyParam, kSniParam,
                                           kInsecureParam};

constexpr std::string_view kDefaultHost = "127.0.0.1";
constexpr int kMaxPoolSize = 64;
constexpr int kMaxMinReplicas = 100;
// Redis' default `databases` is 16; servers may allow more, so only bound it loosely.
constexpr int kMaxDb = 1 << 20;

}  // namespace

std::string RedisOptions::Address() const {
  if (!unix_socket.empty()) {
    return "unix:" + unix_socket;
  }
  const std::string at = HostPort{.host = host, .port = port}.ToString();
  if (cluster()) {
    return port == 0 ? fmt::format("cluster via {}", ClusterList())
                     : fmt::format("cluster node {}", at);
  }
  if (!sentinel()) {
    return at;
  }
  // The store's own options name no master yet (port 0): the pool's connections do.
  return port == 0 ? fmt::format("master {} via sentinels {}", sentinel_master, SentinelList())
                   : fmt::format("master {} at {}", sentinel_master, at);
}

std::string RedisOptions::SentinelList() const {
  std::string list;
  for (const auto& [h, p] : sentinels) {
    list += (list.empty() ? "" : ",") + HostPort{.host = h, .port = p}.ToString();
  }
  return list;
}

std::string RedisOptions::ClusterList() const {
  std::string list;
  for (const auto& [h, p] : cluster_nodes) {
    list += (list.empty() ? "" : ",") + HostPort{.host = h, .port = p}.ToString();
  }
  return list;
}

Result<RedisOptions> RedisOptions::FromUrl(const Url& url) {
  const bool unix_socket = url.scheme == "redis+unix";
  const bool sentinel = url.scheme == "redis+sentinel" || url.scheme == "rediss+sentinel";
  const bool cluster = url.scheme == "redis+cluster" || url.scheme == "rediss+cluster";
  const bool tls =
      url.scheme == "rediss" || url.scheme == "rediss+sentinel" || url.scheme == "rediss+cluster";
  if (url.scheme != "redis" && !tls && !unix_socket && !sentinel && !cluster) {
    return Status::InvalidArgument(fmt::format(
        "expected a redis://, rediss://, redis+unix://, redis+sentinel://, rediss+sentinel://, "
        "redis+cluster:// or rediss+cluster:// URL, got scheme \"{}\"",
        url.scheme));
  }
  std::vector<std::string_view> known(std::begin(kKnownParams), std::end(kKnownParams));
  if (unix_socket) {
    known.push_back(kDbParam);
    LH_RETURN_IF_ERROR(RefuseUnknownParams(url, known));
  } else {
    if (tls) {
      known.insert(known.end(), std::begin(kTlsParams), std::end(kTlsParams));
    }
    std::string hint = "the database goes in the path: redis://host:port/2";
    if (!tls && std::any_of(std::begin(kTlsParams), std::end(kTlsParams),
                            [&](std::string_view p) { return url.query.contains(p); })) {
      hint = "TLS parameters need a rediss://, rediss+sentinel:// or rediss+cluster:// URL";
    }
    LH_RETURN_IF_ERROR(RefuseUnknownParams(url, known, hint));
  }

  RedisOptions options;
  options.user = url.user;
  options.password = url.password;
  if (options.user && options.user->empty()) {
    options.user.reset();  // redis://:password@host is the password-only (default user) form
  }

  if (unix_socket) {
    // redis+unix://[user:pass@]/path/to/socket: the authority holds at most the credentials.
    if (!url.authority.empty()) {
      return Status::InvalidArgument(
          "redis+unix:// URL must be redis+unix:///path/to/socket (no host)");
    }
    if (url.path.size() < 2) {
      return Status::InvalidArgument("redis+unix:// URL has no socket path");
    }
    options.unix_socket = url.path;
    LH_RETURN_IF_ERROR(ReadIntParam(url, kDbParam, 0, kMaxDb, &options.db));
  } else if (sentinel) {
    // redis+sentinel://h1:p1,h2:p2/MASTER_NAME[/db]
    LH_ASSIGN_OR_RETURN(std::vector<HostPort> hosts,
                        ParseHostPorts(url.scheme, url.authority, kRedisSentinelDefaultPort));
    for (HostPort& h : hosts) {
      options.sentinels.emplace_back(std::move(h.host), h.port);
    }
    std::string_view path = url.path;
    if (path.starts_with('/')) {
      path.remove_prefix(1);
    }
    const std::size_t slash = path.find('/');
    options.sentinel_master = std::string(path.substr(0, slash));
    if (options.sentinel_master.empty()) {
      return Status::InvalidArgument(fmt::format(
          "{}:// URL names no master: {}://h1:p1,h2:p2/MASTER_NAME[/db]", url.scheme, url.scheme));
    }
    if (slash != std::string_view::npos &&
        !ParseWholeNumber(path.substr(slash + 1), 0, kMaxDb, &options.db)) {
      return Status::InvalidArgument(fmt::format(
          "{}:// URL path must be /MASTER_NAME or /MASTER_NAME/db with a database number; got "
          "'{}'",
          url.scheme, url.path));
    }
    options.require_master = true;
    // No master yet: the pool learns it from the sentinels and connects to it by address.
    options.host.clear();
    options.port = 0;
  } else if (cluster) {
    // redis+cluster://h1:p1,h2:p2[/0]: any of the nodes, to learn the slot map from.
    LH_ASSIGN_OR_RETURN(std::vector<HostPort> hosts,
                        ParseHostPorts(url.scheme, url.authority, kRedisDefaultPort));
    for (HostPort& h : hosts) {
      options.cluster_nodes.emplace_back(std::move(h.host), h.port);
    }
    if (!url.path.empty() && url.path != "/" && url.path != "/0") {
      return Status::InvalidArgument(fmt::format(
          "{}:// URL path must be empty or /0: a Redis Cluster has only database 0; got '{}'",
          url.scheme, url.path));
    }
    options.host.clear();
    options.port = 0;
  } else {
    LH_ASSIGN_OR_RETURN(std::vector<HostPort> hosts,
                        ParseHostPorts(url.scheme, url.authority, kRedisDefaultPort, kDefaultHost,
                                       /*allow_empty_host=*/true));
    if (hosts.size() > 1) {
      return Status::InvalidArgument(
          fmt::format("{}:// URL names several hosts: for Sentinel, use "
                      "redis+sentinel://h1:p1,h2:p2/MASTER_NAME; for Redis Cluster, "
                      "redis+cluster://h1:p1,h2:p2",
                      url.scheme));
    }
    options.host = std::move(hosts[0].host);
    options.port = hosts[0].port;
    if (!url.path.empty() && url.path != "/") {
      if (!ParseWholeNumber(std::string_view(url.path).substr(1), 0, kMaxDb, &options.db)) {
        return Status::InvalidArgument(fmt::format(
            "{}:// URL path must be a database number, e.g. /2; got '{}'", url.scheme, url.path));
      }
    }
  }

  LH_RETURN_IF_ERROR(ReadTimeoutParam(url, kConnectTimeoutParam, &options.connect_timeout));
  LH_RETURN_IF_ERROR(ReadTimeoutParam(url, kCommandTimeoutParam, &options.command_timeout));
  LH_RETURN_IF_ERROR(ReadTimeoutParam(url, kReplicaTimeoutParam, &options.replica_timeout));
  LH_RETURN_IF_ERROR(
      ReadIntParam(url, kMinReplicasParam, 0, kMaxMinReplicas, &options.min_replicas));
  LH_RETURN_IF_ERROR(ReadIntParam(url, kPoolSizeParam, 1, kMaxPoolSize, &options.pool_size));
  LH_RETURN_IF_ERROR(ReadStringParam(url, kPrefixParam, &options.prefix));
  if (options.prefix.find_first_of("{}") != std::string::npos) {
    // The prefix sits outside the key's {hash tag}: a brace in it would move the tag.
    return BadParam(url, kPrefixParam, "must contain no '{' or '}'");
  }
  LH_RETURN_IF_ERROR(ReadBoolParam(url, kFairParam, &options.fair));
  LH_RETURN_IF_ERROR(ReadBoolParam(url, kAcceptEvictionParam, &options.accept_eviction));
  if (tls) {
    options.tls = true;
    LH_RETURN_IF_ERROR(ReadStringParam(url, kCaParam, &options.tls_ca));
    LH_RETURN_IF_ERROR(ReadStringParam(url, kCertParam, &options.tls_cert));
    LH_RETURN_IF_ERROR(ReadStringParam(url, kKeyParam, &options.tls_key));
    LH_RETURN_IF_ERROR(ReadStringParam(url, kSniParam, &options.tls_sni));
    LH_RETURN_IF_ERROR(ReadBoolParam(url, kInsecureParam, &options.tls_insecure));
    if (options.tls_cert.empty() != options.tls_key.empty()) {
      return BadParam(url, options.tls_cert.empty() ? kKeyParam : kCertParam,
                      "needs its pair: a client certificate takes both cert= and key=");
    }
  }
  return options;
}

}  // namespace leasehold::internal
