// File: core/store_core.h (internal)
//
// StoreCore: what a Store handle and its Leases share: the backend, the clock, the metrics and
// the heartbeat. Leases keep it alive, so a Lease may outlive its Store; the heartbeat threads
// hold no reference to it, so it is never destroyed on one of them. (A metrics scrape may hold
// the last reference for a moment; it runs on the scraping thread, never a heartbeat thread.)
//
// Thread safety: thread-safe.

#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "leasehold/clock.h"
#include "leasehold/metrics.h"
#include "leasehold/options.h"

#include "backends/backend.h"
#include "core/fork_guard.h"
#include "heartbeat/heartbeat.h"
#include "metrics/registry.h"

namespace leasehold::internal {

struct StoreCore {
  // `m` may be null (a new registry is made); `record` false records nothing.
  StoreCore(std::shared_ptr<Backend> b, Clock& c, std::string url, std::shared_ptr<Metrics> m,
            bool record)
      : backend(std::move(b)),
        clock(c),
        display_url(std::move(url)),
        metrics(m != nullptr ? std::move(m) : std::make_shared<Metrics>()),
        lease_metrics(record ? &MetricsAccess::Of(*metrics).ForBackend(
                                   backend->scheme(), backend->facets().wait != nullptr)
                             : nullptr),
        heartbeat(backend, clock, lease_metrics) {}

  // True in a fork() child of the process that made this (fork_guard.h): then nothing may
  // use the backend or the heartbeat, nor destroy them.
  [[nodiscard]] bool forked() const { return IsForkedFrom(process); }

  const ProcessStamp process = CurrentProcess();
  const std::shared_ptr<Backend> backend;
  Clock& clock;
  const std::string display_url;
  const std::shared_ptr<Metrics> metrics;
  // Where this handle records; null when StoreOptions::record_metrics is false. Owned by
  // *metrics, which outlives every user (leases and the heartbeat only record while this
  // StoreCore is alive).
  LeaseMetrics* const lease_metrics;
  Heartbeat heartbeat;
  // Set by the first grant whose TTL this process's CPU quota endangers: the warning is logged
  // once per handle (store.cc, WarnOfCpuQuota).
  std::atomic<bool> cpu_quota_warned{false};
};

// Makes a StoreCore and registers its heartbeat for the gauges of its metrics.
std::shared_ptr<StoreCore> MakeStoreCore(std::shared_ptr<Backend> backend, Clock& clock,
                                         std::string display_url, const StoreOptions& options);

}  // namespace leasehold::internal
