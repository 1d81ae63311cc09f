// File: backends/facets/doctor.h (internal)
//
// DoctorFacet: what the store doctor (Store::Check, `leasehold check`) asks a backend beyond the
// grant operations, handed out by Backend::facets(). A backend without one leaves it null: the
// doctor times no probe and reports no findings of the store's own.
//
// Thread safety: as the backend that hands it out.

#pragma once

#include <string>
#include <vector>

#include "leasehold/check.h"
#include "leasehold/clock.h"
#include "leasehold/status.h"

namespace leasehold::internal {

// What a backend reports about its store for the store doctor.
struct Diagnosis {
  // The name of Ping's round trip, as `leasehold check` prints it: "PING", "SELECT 1".
  std::string probe;
  // The step the store counts TTLs in (etcd: 1 s; ZooKeeper: its tickTime, where it can be
  // learnt); zero if it has none. Store::Check rounds its TTL advice up to it.
  Duration ttl_granularity{};
  // The shortest TTL the store grants (etcd: its minimum lease TTL, 2 s by default; ZooKeeper:
  // minSessionTimeout), where it can be learnt; zero if not. Store::Check advises no TTL below it.
  Duration shortest_ttl{};
  // Durability, topology and permission findings (CheckItem::area "durability", "topology",
  // "permissions", "session"), each one line, with a fix where the verdict is not a pass. A
  // setting the credentials may not read is a kWarn saying so, never a guess.
  std::vector<CheckItem> items;
  // One line naming what the credentials need for every operation of leasehold's (the Redis
  // ACL command list, the PostgreSQL privileges, ...): Store::Check prints it as the fix when a
  // step of its cycle is refused with kPermissionDenied.
  std::string permissions_fix;
};

class DoctorFacet {
 public:
  DoctorFacet() = default;
  DoctorFacet(const DoctorFacet&) = delete;
  DoctorFacet& operator=(const DoctorFacet&) = delete;

  // Performs the store's cheapest round trip on the backend's own connection (the probe
  // leasehold-bench calls the floor: Redis PING, PostgreSQL SELECT 1, an etcd Range of a missing
  // key, a ZooKeeper exists, an empty SQLite transaction), for Store::Check to time. Exactly one
  // round trip; no write.
  virtual Status Ping() = 0;

  // Reports what Store::Check cannot learn through the other methods: durability (will fencing
  // counters survive a restart?), topology (replicas, members, leader, pooling), permissions
  // beyond those the cycle exercises, session bounds. Bounded by the backend's timeouts; a
  // finding the store will not disclose is an item, not an error. Returns kUnavailable if the
  // store cannot be reached.
  virtual Result<Diagnosis> Diagnose() = 0;

 protected:
  ~DoctorFacet() = default;
};

}  // namespace leasehold::internal
