// File: backends/etcd/etcd_options.h (internal)
//
// EtcdOptions: how an etcd:// store is reached. The URL and this struct are two views of one
// configuration:
//
//   etcd://[user:password@]host:port[,host:port...][?param=value&...]
//   etcds://[user:password@]host:port[,host:port...]?ca=/ca.pem[&cert=/c.pem&key=/k.pem]
//
// A host without a port gets 2379; an IPv6 address goes in brackets ("[::1]:2379"), as in
// every store URL (backends/common/host_port.h).
//
// Parameters: prefix (key namespace), command_timeout (deadline of every call, e.g. 2s),
// spare_lease and fair (true/false), ca/cert/key (etcds:// only: PEM files). Unknown parameters are
// errors.
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(Url url, ParseUrl("etcd://10.0.0.5:2379,10.0.0.6:2379?prefix=jobs"));
//   LH_ASSIGN_OR_RETURN(EtcdOptions options, EtcdOptions::FromUrl(url));
//
// Thread safety: a plain value type.

#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "core/url.h"

namespace leasehold::internal {

inline constexpr int kEtcdDefaultPort = 2379;

struct EtcdOptions {
  // "host:port" of each member, tried in order; a call that finds its member unreachable
  // (UNAVAILABLE, or no answer within command_timeout) moves on to the next.
  // Default: 127.0.0.1:2379.
  std::vector<std::string> endpoints = {"127.0.0.1:2379"};

  // TLS (etcds://): PEM file of the CA that signed the members' certificates (empty: the
  // system roots), and optionally a client certificate and its key. Default: plaintext.
  bool tls = false;
  std::string ca_file;
  std::string cert_file;
  std::string key_file;

  // etcd user and password (Auth.Authenticate); the token is sent with every call and fetched
  // again when the server says it is invalid. Never logged. Default: none (auth off).
  std::optional<std::string> user;
  std::optional<std::string> password;

  // Namespace of every key leasehold writes: "<prefix>/<lease name>".
  // URL: prefix=myapp. Default: "leasehold".
  std::string prefix = "leasehold";

  // Deadline of every call (each unary RPC, each keep-alive round, connecting).
  // URL: command_timeout=2s. Default: 2 s.
  Duration command_timeout = std::chrono::seconds(2);

  // Grants share one etcd lease per TTL (in whole seconds) of the handle; with spare_lease
  // the lease of a TTL stays (no key attached, kept alive in the renewal rounds) when its last
  // grant goes, so the next acquire needs only its Txn; without, it is revoked then. The
  // granted TTL reported for an acquire is the lease's TTL less its age (a lease with less
  // than 2/3 of its TTL left is refreshed first). URL: spare_lease=false. Default: true.
  bool spare_lease = true;

  // Waiters queue in etcd beside the lease ("<prefix>\0queue/<name>\0<waiter id>", each on a
  // lease of its own, max(ttl, 10 s)) and get the key in arrival order (create revision), as
  // in etcd's own concurrency.Mutex; a TryAcquire without a place in the queue does not barge
  // ahead. Every handle that uses a key must agree on it. URL: fair=true. Default: false.
  bool fair = false;

  // Returns the endpoints joined with ',' (never credentials), for messages.
  [[nodiscard]] std::string Address() const;

  // Builds options from an "etcd" or "etcds" URL. Returns kInvalidArgument for another scheme,
  // an unknown or malformed parameter (named in the message), a bad port, TLS files on a
  // plaintext URL, or a key without a certificate.
  static Result<EtcdOptions> FromUrl(const Url& url);
};

}  // namespace leasehold::internal
