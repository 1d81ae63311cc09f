// File: backends/redis/redis_options.cc (internal)
//
// RedisOptions::FromUrl. Unknown parameters are errors, never ignored: a typo such as
// "comand_timeout=10s" must not silently leave the default in place.

#include "backends/redis/redis_options.h"

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
constexpr std::string_view kPrefixParam = "prefix";
constexpr std::string_view kMinReplicasParam = "min_replicas";
constexpr std::string_view kReplicaTimeoutParam = "replica_timeout";
constexpr std::string_view kPoolSizeParam = "pool_size";
constexpr std::string_view kFairParam = "fair";
constexpr std::string_view kDbParam = "db";

constexpr std::string_view kKnownParams[] = {
    kConnectTimeoutParam, kCommandTimeoutParam, kPrefixParam, kMinReplicasParam,
    kReplicaTimeoutParam, kPoolSizeParam,       kFairParam,   kDbParam,
};

// Timeouts become struct timeval and millisecond counts: keep them in a sane range.
constexpr Duration kMaxTimeout = std::chrono::hours(1);
constexpr int kMaxPoolSize = 64;
// Redis' default `databases` is 16; servers may allow more, so only bound it loosely.
constexpr int kMaxDb = 1 << 20;

Result<int> ParseInt(std::string_view name, std::string_view text, int min, int max) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min || value > max) {
    return Status::InvalidArgument(fmt::format(
        "redis:// URL parameter {}={} is not a whole number in [{}, {}]", name, text, min, max));
  }
  return value;
}

Result<Duration> ParseTimeout(std::string_view name, std::string_view text) {
  Result<Duration> d = ParseDuration(text);
  if (!d.ok()) {
    return d.status().WithContext(fmt::format("redis:// URL parameter {}", name));
  }
  if (*d <= Duration::zero() || *d > kMaxTimeout) {
    return Status::InvalidArgument(
        fmt::format("redis:// URL parameter {}={} must be above 0 and at most {}", name, text,
                    FormatDuration(kMaxTimeout)));
  }
  return *d;
}

}  // namespace

std::string RedisOptions::Address() const {
  if (!unix_socket.empty()) {
    return "unix:" + unix_socket;
  }
  return fmt::format("{}:{}", host, port);
}

Result<RedisOptions> RedisOptions::FromUrl(const Url& url) {
  const bool unix_socket = url.scheme == "redis+unix";
  if (url.scheme != "redis" && !unix_socket) {
    return Status::InvalidArgument(
        fmt::format("expected a redis:// or redis+unix:// URL, got scheme \"{}\"", url.scheme));
  }
  std::vector<std::string> unknown;
  for (const auto& [name, value] : url.query) {
    bool known = false;
    for (std::string_view k : kKnownParams) {
      known = known || name == k;
    }
    if (!known || (name == kDbParam && !unix_socket)) {
      unknown.push_back(name);
    }
  }
  if (!unknown.empty()) {
    return Status::InvalidArgument(
        fmt::format("unknown {}:// URL parameter{} {} (known: {}{})", url.scheme,
                    unknown.size() == 1 ? "" : "s", fmt::join(unknown, ", "),
                    fmt::join(std::begin(kKnownParams), std::end(kKnownParams) - 1, ", "),
                    unix_socket ? ", db" : "; the database goes in the path: redis://host:port/2"));
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
    if (auto it = url.query.find(kDbParam); it != url.query.end()) {
      LH_ASSIGN_OR_RETURN(options.db, ParseInt(kDbParam, it->second, 0, kMaxDb));
    }
  } else {
    std::string_view authority = url.authority;
    if (authority.find(',') != std::string_view::npos) {
      return Status::InvalidArgument(
          "redis:// URL names several hosts; Redis Cluster and Sentinel are not supported yet");
    }
    std::string_view port_text;
    if (!authority.empty() && authority.front() == '[') {  // [::1]:6379
      std::size_t close = authority.find(']');
      if (close == std::string_view::npos) {
        return Status::InvalidArgument("redis:// URL has an unclosed '[' in its host");
      }
      options.host = std::string(authority.substr(1, close - 1));
      std::string_view rest = authority.substr(close + 1);
      if (!rest.empty()) {
        if (rest.front() != ':') {
          return Status::InvalidArgument("redis:// URL has junk after its IPv6 host");
        }
        port_text = rest.substr(1);
      }
    } else if (std::size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
      options.host = std::string(authority.substr(0, colon));
      port_text = authority.substr(colon + 1);
    } else if (!authority.empty()) {
      options.host = std::string(authority);
    }
    if (options.host.empty()) {
      options.host = "127.0.0.1";
    }
    if (!port_text.empty()) {
      Result<int> port = ParseInt("port", port_text, 1, 65535);
      if (!port.ok()) {
        return Status::InvalidArgument(
            fmt::format("redis:// URL has a bad port '{}' (1-65535)", port_text));
      }
      options.port = *port;
    }
    if (!url.path.empty() && url.path != "/") {
      Result<int> db = ParseInt("db", std::string_view(url.path).substr(1), 0, kMaxDb);
      if (!db.ok()) {
        return Status::InvalidArgument(fmt::format(
            "redis:// URL path must be a database number, e.g. /2; got '{}'", url.path));
      }
      options.db = *db;
    }
  }

  if (auto it = url.query.find(kConnectTimeoutParam); it != url.query.end()) {
    LH_ASSIGN_OR_RETURN(options.connect_timeout, ParseTimeout(kConnectTimeoutParam, it->second));
  }
  if (auto it = url.query.find(kCommandTimeoutParam); it != url.query.end()) {
    LH_ASSIGN_OR_RETURN(options.command_timeout, ParseTimeout(kCommandTimeoutParam, it->second));
  }
  if (auto it = url.query.find(kReplicaTimeoutParam); it != url.query.end()) {
    LH_ASSIGN_OR_RETURN(options.replica_timeout, ParseTimeout(kReplicaTimeoutParam, it->second));
  }
  if (auto it = url.query.find(kMinReplicasParam); it != url.query.end()) {
    LH_ASSIGN_OR_RETURN(options.min_replicas, ParseInt(kMinReplicasParam, it->second, 0, 100));
  }
  if (auto it = url.query.find(kPoolSizeParam); it != url.query.end()) {
    LH_ASSIGN_OR_RETURN(options.pool_size, ParseInt(kPoolSizeParam, it->second, 1, kMaxPoolSize));
  }
  if (auto it = url.query.find(kPrefixParam); it != url.query.end()) {
    if (it->second.empty() || it->second.find_first_of("{}") != std::string::npos) {
      return Status::InvalidArgument(
          "redis:// URL parameter prefix must be non-empty and contain no '{' or '}'");
    }
    options.prefix = it->second;
  }
  if (auto it = url.query.find(kFairParam); it != url.query.end()) {
    if (it->second == "true") {
      options.fair = true;
    } else if (it->second != "false") {
      return Status::InvalidArgument(
          fmt::format("redis:// URL parameter fair={} must be true or false", it->second));
    }
  }
  return options;
}

}  // namespace leasehold::internal
