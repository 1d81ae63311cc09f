// File: backends/facets/wait.h (internal)
//
// WaitFacet: how a backend waits on its store's notifications (a Redis subscription, an etcd
// watch, a ZooKeeper watch, PostgreSQL LISTEN, SQLite's host queue), handed out by
// Backend::facets(). A backend without one (PostgreSQL table mode behind a pooler, where LISTEN
// cannot work) leaves it null, and the core polls with backoff.
//
// Thread safety: as the backend that hands it out.

#pragma once

#include <stop_token>
#include <string_view>

#include "leasehold/clock.h"
#include "leasehold/status.h"

namespace leasehold::internal {

class WaitFacet {
 public:
  WaitFacet() = default;
  WaitFacet(const WaitFacet&) = delete;
  WaitFacet& operator=(const WaitFacet&) = delete;

  // Blocks until the grant of `key` may have changed (released, expired, force-released),
  // `deadline` (on the backend's clock) passes or `stop` is requested. Spurious wake-ups are
  // allowed. Returns OK when woken, kDeadlineExceeded, kCancelled; kUnimplemented where this
  // handle cannot wait on `key` (a key it holds itself, on a store without
  // Capabilities::notifies_holder), in which case the core polls with backoff.
  virtual Status WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) = 0;

  // As WaitForChange, for the waiter `waiter_id` of Store::Acquire (GrantRequest::waiter_id): a
  // fair store also returns at once when the key is free and that waiter heads its queue, which
  // only the store can see. The default calls WaitForChange.
  virtual Status WaitForTurn(std::string_view key, std::string_view waiter_id, SteadyTime deadline,
                             std::stop_token stop);

  // Withdraws `waiter_id` from the key's wait queue, if the store keeps one: Store::Acquire calls
  // it when it gives up (deadline, cancellation, error). Best effort; the default does nothing.
  virtual void AbandonWait(std::string_view key, std::string_view waiter_id);

 protected:
  ~WaitFacet() = default;
};

}  // namespace leasehold::internal
