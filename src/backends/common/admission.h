// File: backends/common/admission.h (internal)
//
// The admission rule of a key: whether a request is granted beside the grants ahead of it, for
// the three kinds of lease (backend.h, "Shared leases"). It is the one C++ statement of the rule:
// the memory, etcd and ZooKeeper stores decide with it, and the stores that decide inside the
// server say which of its clauses they mirror (the Lua scripts in redis/redis_scripts.h and
// redis/redis_fair_scripts.h, the SQL in postgres/postgres_sql.h and sqlite/sqlite_backend.cc).
// The conformance suite's AdmissionFollowsTheRule case runs the same sequences of requests
// through every store and this function and compares the outcomes.
//
// "Ahead" is what a request is decided against: a store without a queue passes the key's live
// grants; a queue (ZooKeeper) passes, for its i-th queued child, the live kept grants and the
// children before it. The rule:
//   - a grant ahead of another limit: refused as kMismatch (every holder of a key asks for the
//     same kind and limit; exclusive and shared are both of limit 1);
//   - a semaphore of N: granted while fewer than N are ahead;
//   - shared: granted while no exclusive grant is ahead and no exclusive waiter has recorded its
//     intent (writer preference);
//   - exclusive: granted only with nothing ahead.
//
// Thread safety: pure functions; an Ahead is a value (one thread at a time).

#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "leasehold/lease_info.h"

namespace leasehold::internal {

// The kind of a grant, or of a request: exclusive or shared with limit 1, or a semaphore of
// `limit` (> 1; its mode is ignored).
struct GrantKind {
  LeaseMode mode = LeaseMode::kExclusive;
  std::uint32_t limit = 1;
};

enum class Verdict : std::uint8_t {
  kGranted,
  kBusy,           // the key is full for this kind; `by` is the grant ahead that blocks it
  kWriterWaiting,  // shared, and an exclusive waiter's intent keeps it out
  kMismatch,       // `by` is the first grant ahead of another limit
};

struct Admission {
  Verdict verdict = Verdict::kGranted;
  // The index, among the grants ahead in the order they were added, of the grant that refuses
  // the request (kBusy, kMismatch); 0 otherwise.
  std::size_t by = 0;
};

// What the rule reads of the grants ahead, added one at a time in order: a queue adds its
// children as it walks them and decides each in constant time.
class Ahead {
 public:
  void Add(GrantKind kind);

  // The decision for `mine` beside the grants added so far; `writer_waiting`: an exclusive
  // waiter's intent is recorded on the key.
  [[nodiscard]] Admission Decide(GrantKind mine, bool writer_waiting = false) const;

  [[nodiscard]] std::size_t size() const { return count_; }

 private:
  std::size_t count_ = 0;
  std::uint32_t first_limit_ = 0;               // the limit of grant 0 (when count_ > 0)
  std::optional<std::size_t> other_limit_;      // the first grant of another limit than grant 0's
  std::optional<std::size_t> first_exclusive_;  // the first exclusive grant of limit 1
};

// Decide(mine, writer_waiting) over `ahead`, in order.
Admission Admit(std::span<const GrantKind> ahead, GrantKind mine, bool writer_waiting = false);

}  // namespace leasehold::internal
