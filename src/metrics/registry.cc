#include "metrics/registry.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <string_view>

#include "leasehold/version.h"

#include "core/cgroup_cpu.h"

namespace leasehold {

namespace internal {

namespace {

constexpr double kNanosPerSecond = 1e9;

// The families of a snapshot, in the order of the exposition. kFamilies has one row per
// enumerator, in the same order (checked below), so a family is found by name, not position.
enum class FamilyId : std::size_t {
  kAcquired,
  kConflicts,
  kLost,
  kReleased,
  kRenewFailures,
  kFencedWrites,
  kAcquireLatency,
  kHeartbeatLatency,
  kWait,
  kHandoff,
  kLeasesHeld,
  kSafeRemaining,
  kTtlHeadroom,
  kTtlHeadroomWarnings,
  kStoreFailovers,
  kStoreClockJumps,
  kCgroupCpuPeriods,
  kCgroupCpuThrottledPeriods,
  kCgroupCpuThrottledSeconds,
  kCgroupCpuLimit,
  kBuildInfo,
  kCount,
};

struct FamilySpec {
  FamilyId id;
  std::string_view name;
  MetricType type;
  std::string_view help;
};

constexpr FamilySpec kFamilies[] = {
    {FamilyId::kAcquired, "leasehold_lease_acquired_total", MetricType::kCounter,
     "Leases acquired (try-acquire attempts that got the key)."},
    {FamilyId::kConflicts, "leasehold_acquire_conflicts_total", MetricType::kCounter,
     "Try-acquire attempts that found the key held by another owner."},
    {FamilyId::kLost, "leasehold_lease_lost_total", MetricType::kCounter,
     "Leases lost, by reason: expired (no renewal confirmed before safe_until), "
     "store_said_no, stolen (taken over), session_lost."},
    {FamilyId::kReleased, "leasehold_lease_released_total", MetricType::kCounter,
     "Leases released by their holder, by outcome: ok, lost (lost or taken "
     "over before the release), error (the store did not answer)."},
    {FamilyId::kRenewFailures, "leasehold_renew_failures_total", MetricType::kCounter,
     "Lease renewals that failed, by outcome: unavailable (retried until "
     "safe_until), lost (the store said the grant is not ours), error."},
    {FamilyId::kFencedWrites, "leasehold_fenced_writes_total", MetricType::kCounter,
     "Fenced writes to data in the store (Lease::Write), by outcome: accepted, "
     "fenced_out (the store no longer held the writer's grant: nothing written), "
     "error (the store refused the input or did not answer)."},
    {FamilyId::kAcquireLatency, "leasehold_acquire_latency_seconds", MetricType::kHistogram,
     "Round trip of one try-acquire to the store, by outcome."},
    {FamilyId::kHeartbeatLatency, "leasehold_heartbeat_latency_seconds", MetricType::kHistogram,
     "Round trip of one heartbeat renew round (all due leases of a store "
     "handle in one call)."},
    {FamilyId::kWait, "leasehold_wait_seconds", MetricType::kHistogram,
     "Time spent in Store::Acquire, from the call to its result, by outcome."},
    {FamilyId::kHandoff, "leasehold_handoff_seconds", MetricType::kHistogram,
     "For an acquire that waited: time from the store's notification that the "
     "key changed (release or expiry) to the new grant. Only for stores that "
     "notify waiters."},
    {FamilyId::kLeasesHeld, "leasehold_leases_held", MetricType::kGauge,
     "Leases currently held (or at risk) by the store handles recording here."},
    {FamilyId::kSafeRemaining, "leasehold_lease_safe_remaining_seconds", MetricType::kGauge,
     "Smallest safe_until - now among held leases: how long the most endangered "
     "holder may still act without another confirmed renewal."},
    {FamilyId::kTtlHeadroom, "leasehold_ttl_headroom_ratio", MetricType::kGauge,
     "Smallest TTL / p99 heartbeat round trip (over its last 100 rounds) among held leases. "
     "The rule wants at least 10; below it the heartbeat warns."},
    {FamilyId::kTtlHeadroomWarnings, "leasehold_ttl_headroom_warnings_total", MetricType::kCounter,
     "Heartbeat warnings (at most one a minute per store handle) that the p99 round trip "
     "exceeded a tenth of a lease's TTL."},
    {FamilyId::kStoreFailovers, "leasehold_store_failovers_total", MetricType::kCounter,
     "Store failovers a store handle noticed (PostgreSQL: a grant on a new timeline, a "
     "connection to a different server); the leases it held are re-checked at their next "
     "renewal on the new primary."},
    {FamilyId::kStoreClockJumps, "leasehold_store_clock_jumps_total", MetricType::kCounter,
     "Steps of the store server's wall clock a store handle noticed between two renewals "
     "(Redis TIME, PostgreSQL table mode's clock_timestamp()) that the elapsed time and the "
     "drift bound cannot explain. A forward step ends grants early: the handle's leases are put "
     "at risk and renewed at once."},
    {FamilyId::kCgroupCpuPeriods, "leasehold_cgroup_cpu_periods_total", MetricType::kCounter,
     "CPU quota enforcement periods with runnable work in the process's cgroup (the nearest "
     "one with a quota: cpu.stat nr_periods)."},
    {FamilyId::kCgroupCpuThrottledPeriods, "leasehold_cgroup_cpu_throttled_periods_total",
     MetricType::kCounter,
     "Periods in which that cgroup spent its CPU quota and every thread, the heartbeat's too, "
     "was stopped until the next one (cpu.stat nr_throttled)."},
    {FamilyId::kCgroupCpuThrottledSeconds, "leasehold_cgroup_cpu_throttled_seconds_total",
     MetricType::kCounter,
     "Time that cgroup's threads were stopped by its CPU quota, all threads together "
     "(cpu.stat throttled_usec; v1 throttled_time)."},
    {FamilyId::kCgroupCpuLimit, "leasehold_cgroup_cpu_limit_cores", MetricType::kGauge,
     "That cgroup's CPU quota per period, in CPUs (cpu.max; v1 cpu.cfs_quota_us / "
     "cpu.cfs_period_us). Absent without a quota."},
    {FamilyId::kBuildInfo, "leasehold_build_info", MetricType::kGauge,
     "Always 1; the labels say what the library was built from: version, git "
     "commit and the stores compiled in."},
};
static_assert(std::size(kFamilies) == static_cast<std::size_t>(FamilyId::kCount));

constexpr bool FamiliesInEnumOrder() {
  for (std::size_t i = 0; i < std::size(kFamilies); ++i) {
    if (static_cast<std::size_t>(kFamilies[i].id) != i) {
      return false;
    }
  }
  return true;
}

static_assert(FamiliesInEnumOrder(), "kFamilies must list the families in FamilyId order");
static_assert(std::size(kLeaseKindNames) == kLeaseKindCount);
static_assert(KindOf(LeaseMode::kExclusive, 1) == LeaseKind::kExclusive &&
              KindOf(LeaseMode::kExclusive, 2) == LeaseKind::kSemaphore &&
              KindOf(LeaseMode::kShared, 0) == LeaseKind::kShared);

// The families of a snapshot, empty, indexed by FamilyId.
class Families {
 public:
  explicit Families(std::vector<MetricFamily>& out) : out_(out) {
    out_.reserve(std::size(kFamilies));
    for (const FamilySpec& spec : kFamilies) {
      out_.push_back(MetricFamily{.name = std::string(spec.name),
                                  .help = std::string(spec.help),
                                  .type = spec.type,
                                  .points = {}});
    }
  }

  // Adds `point` to family `id`.
  void Add(FamilyId id, MetricPoint point) {
    out_[static_cast<std::size_t>(id)].points.push_back(std::move(point));
  }

 private:
  std::vector<MetricFamily>& out_;
};

MetricPoint CounterPoint(std::vector<MetricLabel> labels, const Counter& counter) {
  MetricPoint p;
  p.labels = std::move(labels);
  p.value = static_cast<double>(counter.value());
  return p;
}

MetricPoint HistogramPoint(std::vector<MetricLabel> labels, const Histogram& histogram) {
  MetricPoint p;
  p.labels = std::move(labels);
  histogram.SnapshotInto(p);
  return p;
}

}  // namespace

Histogram::Histogram(std::span<const std::int64_t> bounds_ns)
    : bounds_ns_(bounds_ns.subspan(0, std::min(bounds_ns.size(), kMaxBounds))) {}

void Histogram::Observe(Duration d) {
  const std::int64_t ns = std::max<std::int64_t>(d.count(), 0);
  // A dozen compares on a span that stays in cache: cheaper than a binary search's branches.
  std::size_t i = 0;
  while (i < bounds_ns_.size() && ns > bounds_ns_[i]) {
    ++i;
  }
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
}

void Histogram::SnapshotInto(MetricPoint& point) const {
  point.buckets.clear();
  point.buckets.reserve(bounds_ns_.size() + 1);
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < bounds_ns_.size(); ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    point.buckets.push_back({static_cast<double>(bounds_ns_[i]) / kNanosPerSecond, cumulative});
  }
  cumulative += counts_[bounds_ns_.size()].load(std::memory_order_relaxed);
  point.buckets.push_back({std::numeric_limits<double>::infinity(), cumulative});
  // The count is the +Inf bucket, so that _count and the buckets always agree, even while
  // observations land between the loads.
  point.count = cumulative;
  point.sum = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / kNanosPerSecond;
}

KindMetrics::KindMetrics()
    : acquire_latency{Histogram(kLatencyBoundsNs), Histogram(kLatencyBoundsNs),
                      Histogram(kLatencyBoundsNs)},
      wait{Histogram(kWaitBoundsNs), Histogram(kWaitBoundsNs), Histogram(kWaitBoundsNs),
           Histogram(kWaitBoundsNs)},
      handoff(kLatencyBoundsNs) {}

LeaseMetrics::LeaseMetrics(std::string backend_name, bool handoff_is_observable)
    : backend(std::move(backend_name)),
      handoff_observable(handoff_is_observable),
      heartbeat_latency(kLatencyBoundsNs) {}

LeaseMetrics& MetricsRegistry::ForBackend(std::string_view backend, bool handoff_observable) {
  MutexLock lock(&mu_);
  for (const auto& s : series_) {
    if (s->backend == backend) {
      return *s;
    }
  }
  series_.push_back(std::make_unique<LeaseMetrics>(std::string(backend), handoff_observable));
  return *series_.back();
}

void MetricsRegistry::AddGaugeSource(const LeaseMetrics& series,
                                     std::weak_ptr<GaugeSource> source) {
  MutexLock lock(&mu_);
  std::erase_if(sources_, [](const auto& s) { return s.second.expired(); });
  sources_.emplace_back(&series, std::move(source));
}

MetricsSnapshot MetricsRegistry::Snapshot() {
  std::vector<const LeaseMetrics*> series;
  std::vector<std::pair<const LeaseMetrics*, std::weak_ptr<GaugeSource>>> sources;
  {
    MutexLock lock(&mu_);
    for (const auto& s : series_) {
      series.push_back(s.get());
    }
    std::erase_if(sources_, [](const auto& s) { return s.second.expired(); });
    sources = sources_;
  }
  // Gauges, computed now from each store's heartbeat, outside mu_ (a heartbeat takes its own
  // locks). A store closed meanwhile simply contributes nothing.
  std::vector<HeldLeaseGauges> gauges(series.size());
  for (const auto& [owner, weak] : sources) {
    std::shared_ptr<GaugeSource> source = weak.lock();
    auto it = std::find(series.begin(), series.end(), owner);
    if (source == nullptr || it == series.end()) {
      continue;
    }
    HeldLeaseGauges g = source->CollectGauges();
    HeldLeaseGauges& out = gauges[static_cast<std::size_t>(it - series.begin())];
    for (std::size_t k = 0; k < kLeaseKindCount; ++k) {
      out.held[k] += g.held[k];
      if (g.min_safe_remaining[k].has_value()) {
        out.min_safe_remaining[k] =
            out.min_safe_remaining[k].has_value()
                ? std::min(*out.min_safe_remaining[k], *g.min_safe_remaining[k])
                : *g.min_safe_remaining[k];
      }
    }
    if (g.min_ttl_headroom.has_value()) {
      out.min_ttl_headroom = out.min_ttl_headroom.has_value()
                                 ? std::min(*out.min_ttl_headroom, *g.min_ttl_headroom)
                                 : *g.min_ttl_headroom;
    }
    // Release the store reference here, not at the end: the last reference to a closed store
    // may be this one, and its heartbeat joins its threads when it goes.
    source.reset();
  }

  MetricsSnapshot snap;
  Families f(snap.families);
  if (const std::optional<CpuThrottling> cpu = ReadCpuThrottling()) {
    auto point = [](double value) {
      MetricPoint p;
      p.value = value;
      return p;
    };
    f.Add(FamilyId::kCgroupCpuPeriods, point(static_cast<double>(cpu->stat.periods)));
    f.Add(FamilyId::kCgroupCpuThrottledPeriods,
          point(static_cast<double>(cpu->stat.throttled_periods)));
    f.Add(FamilyId::kCgroupCpuThrottledSeconds,
          point(static_cast<double>(cpu->stat.throttled.count()) / kNanosPerSecond));
    if (cpu->quota) {
      f.Add(FamilyId::kCgroupCpuLimit, point(static_cast<double>(cpu->quota->quota.count()) /
                                             static_cast<double>(cpu->quota->period.count())));
    }
  }
  MetricPoint build;
  build.labels = {{"version", Version()}, {"commit", Commit()}, {"stores", CompiledStores()}};
  build.value = 1;
  f.Add(FamilyId::kBuildInfo, std::move(build));
  for (std::size_t si = 0; si < series.size(); ++si) {
    const LeaseMetrics& s = *series[si];
    const MetricLabel backend{"backend", s.backend};
    for (std::size_t ki = 0; ki < kLeaseKindCount; ++ki) {
      // A kind never recorded here has no series, unless a heartbeat holds a lease of it (it
      // was acquired, so recorded, but the flag is relaxed: the gauge may see the lease first).
      if (!s.KindUsed(static_cast<LeaseKind>(ki)) && gauges[si].held[ki] == 0) {
        continue;
      }
      const KindMetrics& k = s.kinds[ki];
      const MetricLabel kind{"kind", std::string(kLeaseKindNames[ki])};
      f.Add(FamilyId::kAcquired, CounterPoint({backend, kind}, k.acquired));
      f.Add(FamilyId::kConflicts, CounterPoint({backend, kind}, k.conflicts));
      for (std::size_t i = 0; i < std::size(kLostCauses); ++i) {
        f.Add(FamilyId::kLost,
              CounterPoint({backend, kind, {"reason", std::string(LostCauseName(kLostCauses[i]))}},
                           k.lost[i]));
      }
      for (std::size_t i = 0; i < std::size(kReleaseOutcomeNames); ++i) {
        f.Add(FamilyId::kReleased,
              CounterPoint({backend, kind, {"outcome", std::string(kReleaseOutcomeNames[i])}},
                           k.released[i]));
      }
      for (std::size_t i = 0; i < std::size(kRenewFailureNames); ++i) {
        f.Add(FamilyId::kRenewFailures,
              CounterPoint({backend, kind, {"outcome", std::string(kRenewFailureNames[i])}},
                           k.renew_failures[i]));
      }
      for (std::size_t i = 0; i < std::size(kFencedWriteOutcomeNames); ++i) {
        f.Add(FamilyId::kFencedWrites,
              CounterPoint({backend, kind, {"outcome", std::string(kFencedWriteOutcomeNames[i])}},
                           k.fenced_writes[i]));
      }
      for (std::size_t i = 0; i < std::size(kAcquireOutcomeNames); ++i) {
        f.Add(FamilyId::kAcquireLatency,
              HistogramPoint({backend, kind, {"outcome", std::string(kAcquireOutcomeNames[i])}},
                             k.acquire_latency[i]));
      }
      for (std::size_t i = 0; i < std::size(kWaitOutcomeNames); ++i) {
        f.Add(FamilyId::kWait,
              HistogramPoint({backend, kind, {"outcome", std::string(kWaitOutcomeNames[i])}},
                             k.wait[i]));
      }
      if (s.handoff_observable) {
        f.Add(FamilyId::kHandoff, HistogramPoint({backend, kind}, k.handoff));
      }
      MetricPoint held;
      held.labels = {backend, kind};
      held.value = static_cast<double>(gauges[si].held[ki]);
      f.Add(FamilyId::kLeasesHeld, std::move(held));
      if (gauges[si].min_safe_remaining[ki].has_value()) {
        MetricPoint margin;
        margin.labels = {backend, kind};
        margin.value =
            static_cast<double>(gauges[si].min_safe_remaining[ki]->count()) / kNanosPerSecond;
        f.Add(FamilyId::kSafeRemaining, std::move(margin));
      }
    }
    f.Add(FamilyId::kHeartbeatLatency, HistogramPoint({backend}, s.heartbeat_latency));
    if (gauges[si].min_ttl_headroom.has_value()) {
      MetricPoint headroom;
      headroom.labels = {backend};
      headroom.value = *gauges[si].min_ttl_headroom;
      f.Add(FamilyId::kTtlHeadroom, std::move(headroom));
    }
    f.Add(FamilyId::kTtlHeadroomWarnings, CounterPoint({backend}, s.ttl_headroom_warnings));
    f.Add(FamilyId::kStoreFailovers, CounterPoint({backend}, s.store_failovers));
    f.Add(FamilyId::kStoreClockJumps, CounterPoint({backend}, s.store_clock_jumps));
  }
  return snap;
}

}  // namespace internal

Metrics::Metrics() : registry_(std::make_unique<internal::MetricsRegistry>()) {}

Metrics::~Metrics() = default;

MetricsSnapshot Metrics::Snapshot() const {
  return registry_->Snapshot();
}

std::string Metrics::PrometheusText() const {
  return FormatPrometheusText(Snapshot());
}

}  // namespace leasehold
