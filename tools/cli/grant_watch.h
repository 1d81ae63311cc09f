// File: tools/cli/grant_watch.h
//
// GrantWatch: while `run` or `elect` holds its lease, a thread waits on the store's change
// notification for the key (Store::WaitForChange: Redis pub/sub, PostgreSQL NOTIFY, etcd and
// ZooKeeper watches, the embedded store's wake-ups) and, when the key may have changed,
// proves the grant with one owner-checked round trip (Lease::Confirm). A `release --force` by
// an operator is then seen within a round trip of its notification, and the lease's on_lost
// stops the command's tree at once, instead of at the heartbeat's next renewal (ttl/3).
//
// Thread safety: the constructor and Stop() (or the destructor) are called by one thread; the
// watch's thread calls only `confirm` and Store::WaitForChange.

#pragma once

#include <functional>
#include <stop_token>
#include <thread>

#include "leasehold/lease.h"
#include "leasehold/status.h"
#include "leasehold/store.h"

namespace leasehold::cli {

class GrantWatch {
 public:
  // Starts watching `lease`'s key in `store`. `confirm` is Lease::Confirm (or Leadership's) of
  // the same grant. Where the store does not wake a holder (Store::notifies_holder() false:
  // no notification, PostgreSQL advisory mode) no thread is started: the heartbeat's renewals
  // alone find the loss. REQUIRES: `store` and `lease` outlive the GrantWatch, and nothing
  // releases or moves the lease before Stop() returns (Lease::Confirm's rule).
  GrantWatch(Store& store, const Lease& lease, std::function<Status()> confirm);

  GrantWatch(const GrantWatch&) = delete;
  GrantWatch& operator=(const GrantWatch&) = delete;

  ~GrantWatch() { Stop(); }

  // Ends the watch (a wait in the store is cancelled) and joins its thread. Idempotent.
  void Stop();

 private:
  void Watch(std::stop_token stop);

  Store& store_;
  const Lease& lease_;
  std::function<Status()> confirm_;
  std::stop_source stop_;  // Stop(), or the lease's loss
  std::thread thread_;
};

}  // namespace leasehold::cli
