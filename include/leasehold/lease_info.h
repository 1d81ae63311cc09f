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
#include <string_view>

namespace leasehold {

// How a grant shares its key (LeaseOptions::mode and LeaseOptions::limit):
//   exclusive  one holder (limit 1, LeaseMode::kExclusive): the plain lease, and the writer of
//              a read/write key;
//   shared     any number of shared holders at once, while no exclusive one holds the key;
//   semaphore  at most `limit` holders at once (limit > 1), each with a slot 0..limit-1.
enum class LeaseMode {
  kExclusive,
  kShared,
};

// The largest LeaseOptions::limit.
inline constexpr std::uint32_t kMaxLeaseLimit = 1024;

// Returns "exclusive", "shared" or "semaphore" for a grant of `mode` and `limit` (the `kind`
// label of the metrics, the mode column of `leasehold status`).
std::string_view LeaseKindName(LeaseMode mode, std::uint32_t limit);

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
  // clock when it answered; at most that long where remaining_is_upper_bound.
  std::chrono::milliseconds remaining{0};
  // The TTL the grant was made or last renewed with.
  std::chrono::milliseconds ttl{0};
  // How the grant shares its key, and the limit its holder asked for (1 for an exclusive or
  // shared grant, N for a semaphore of N).
  LeaseMode mode = LeaseMode::kExclusive;
  std::uint32_t limit = 1;
  // The grant's slot: the smallest number no other live grant of the key had when it was made
  // (0 for an exclusive grant; 0..limit-1 for a semaphore, a worker index; for shared grants,
  // the smallest free among the shared holders).
  std::uint32_t slot = 0;
  // True for a grant not yet expired whose holder is gone: on a store that can tell
  // (sqlite://, where every process that could still act under the grant has exited), which
  // lists it in Store::Holders only. Nothing counts it as held: the next acquire takes the key
  // at once, with a higher fencing token.
  bool holder_gone = false;
  // True for a grant kept after its holder released it (ReleaseOptions::hold_at_least,
  // `leasehold run --hold-at-least`, SlotClaim::Finish): it keeps the key until it expires
  // (`remaining`), and no process acts under it any more.
  bool kept = false;
  // True when this is not a grant but a writer waiting for the key (an exclusive Acquire that
  // keeps new shared holders out: writer preference), as a refused shared request's
  // Status::holder() names it and Store::Holders lists it last: `holder` is that writer,
  // fencing_token 0 where it has none yet, `remaining` how long its intent lasts unless it
  // asks again.
  bool waiting_writer = false;
  // True where the store does not tell the time left exactly: `remaining` is an upper bound.
  // ZooKeeper's is the TTL (a grant lives as long as its holder's session, whose heartbeats
  // only the server sees); etcd's is its whole seconds left plus one, up to the TTL rounded up.
  bool remaining_is_upper_bound = false;
};

}  // namespace leasehold
