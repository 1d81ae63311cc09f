// File: core/store_core.h (internal)
//
// StoreCore: what a Store handle and its Leases share: the backend, the clock and the
// heartbeat. Leases keep it alive, so a Lease may outlive its Store; the heartbeat threads hold
// no reference to it, so it is never destroyed on one of them.
//
// Thread safety: thread-safe.

#pragma once

#include <memory>
#include <string>

#include "backends/backend.h"
#include "heartbeat/heartbeat.h"
#include "leasehold/clock.h"

namespace leasehold::internal {

struct StoreCore {
  StoreCore(std::shared_ptr<Backend> b, Clock& c, std::string url)
      : backend(std::move(b)), clock(c), display_url(std::move(url)), heartbeat(backend, clock) {}

  const std::shared_ptr<Backend> backend;
  Clock& clock;
  const std::string display_url;
  Heartbeat heartbeat;
};

}  // namespace leasehold::internal
