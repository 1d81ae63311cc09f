// File: leasehold/lease_info.h
//
// LeaseInfo: what a store knows about one grant, as shown by Store::Inspect, Store::List and
// the `leasehold status` command, and carried by a kHeldByAnother status.
//
// Thread safety: a plain value type.

#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace leasehold {

// A fencing token: strictly increasing per key across every grant the store ever made.
// Attach it to every write the lease guards; a storage layer rejects writes whose token is
// lower than the highest it has seen.
using FencingToken = std::uint64_t;

struct LeaseInfo {
  // The lease's name.
  std::string key;
  // Who holds it, as the holder described itself (LeaseOptions::holder), e.g. "web-3:4242".
  std::string holder;
  // The first 8 hex digits of the owner token: enough to tell grants apart in logs, useless
  // for impersonation. The full token never leaves the process that holds it.
  std::string token_prefix;
  // The grant's fencing token.
  FencingToken fencing_token = 0;
  // Time left before the store lets the grant expire without renewal, judged on the store's
  // clock when it answered.
  std::chrono::milliseconds remaining{0};
  // The TTL the grant was made or last renewed with.
  std::chrono::milliseconds ttl{0};
};

}  // namespace leasehold
