// File: backends/zookeeper/zk_options.h (internal)
//
// ZkOptions: how a zk:// store is reached. The URL and this struct are two views of one
// configuration:
//
//   zk://[user:password@]host:port[,host:port...][/chroot][?param=value&...]
//
// Hosts are read by the one rule of every store (backends/common/host_port.h): an IPv6 address
// goes in brackets ("[::1]:2181"), a missing port is 2181. Parameters: connect_timeout,
// command_timeout (durations in (0, 1h], e.g. 500ms). Unknown parameters are errors. With
// user:password the handle authenticates with the `digest` scheme and creates every node
// readable and writable by its creator only (ZOO_CREATOR_ALL_ACL); without, nodes are open
// (ZOO_OPEN_ACL_UNSAFE).
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(Url url, ParseUrl("zk://app:secret@10.0.0.5:2181,10.0.0.6:2181/jobs"));
//   LH_ASSIGN_OR_RETURN(ZkOptions options, ZkOptions::FromUrl(url));
//
// Thread safety: a plain value type.

#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "core/url.h"

namespace leasehold::internal {

inline constexpr int kZkDefaultPort = 2181;

struct ZkOptions {
  // The ZooKeeper connection string without chroot: "host:port[,host:port...]", ports filled
  // in (default 2181), IPv6 hosts in brackets as the C client expects. Default: 127.0.0.1:2181.
  std::string hosts = "127.0.0.1:2181";

  // Node every path lives under, e.g. "/jobs" (no trailing '/'); created as a persistent node
  // if missing. Default: "" (the root). Leases live under <chroot>/leasehold/<escaped key>/.
  std::string chroot;

  // digest credentials. The password never appears in logs or errors. Default: none.
  std::optional<std::string> user;
  std::optional<std::string> password;

  // Bound on establishing a session (Open, and a new session for a new TTL).
  // URL: connect_timeout=5s. Default: 5 s.
  Duration connect_timeout = std::chrono::seconds(5);

  // Bound on one request's round trip (a pipelined batch counts as one).
  // URL: command_timeout=5s. Default: 5 s.
  Duration command_timeout = std::chrono::seconds(5);

  // Session timeout requested for the handle's own reads, watches and deletes (not for leases:
  // each lease's session timeout is its TTL). Default: 10 s.
  Duration service_session_timeout = std::chrono::seconds(10);

  // Returns hosts + chroot (never credentials), for messages.
  [[nodiscard]] std::string Address() const;

  // Builds options from a "zk" URL. Returns kInvalidArgument for another scheme, an unknown or
  // malformed parameter (named in the message), a bad host list or chroot, or a user without a
  // password.
  static Result<ZkOptions> FromUrl(const Url& url);
};

}  // namespace leasehold::internal
