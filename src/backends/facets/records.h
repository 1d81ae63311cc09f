// File: backends/facets/records.h (internal)
//
// RecordsFacet: the records a key keeps beside its grants (written by Backend::Finish with a
// record: the once-per-slot schedule's runs) and the store's wall clock they are judged by,
// handed out by Backend::facets(). A backend without one leaves it null: Finish refuses a
// record, and the schedule recipe refuses the store.
//
// Thread safety: as the backend that hands it out.

#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/status.h"

namespace leasehold::internal {

// The wall-clock time a store reported.
struct StoreTime {
  SystemTime time;
  // True if `time` is the store's own clock; false if the store has none and `time` is the
  // local wall clock (same host for sqlite://: that is the store's clock, and is reported true).
  bool from_store = true;
};

class RecordsFacet {
 public:
  RecordsFacet() = default;
  RecordsFacet(const RecordsFacet&) = delete;
  RecordsFacet& operator=(const RecordsFacet&) = delete;

  // Returns the key's record (FinishRequest::record), or nullopt if it has none or it expired.
  virtual Result<std::optional<std::string>> ReadRecord(std::string_view key) = 0;

  // Returns the records (key, record) of the keys that start with `prefix`, ordered by key,
  // expired ones left out.
  virtual Result<std::vector<std::pair<std::string, std::string>>> ListRecords(
      std::string_view prefix) = 0;

  // Returns the store's wall clock, read in one round trip, where the store has one (Redis
  // TIME, PostgreSQL clock_timestamp(), the ZooKeeper leader's transaction time); the default
  // returns the local wall clock with from_store = false.
  virtual Result<StoreTime> WallClock();

 protected:
  ~RecordsFacet() = default;
};

}  // namespace leasehold::internal
