// File: leasehold/metrics.h
//
// Metrics: the counters, histograms and gauges that Store handles keep (the README's "Metrics"
// section lists them), and their Prometheus text exposition (format 0.0.4). Every Store records
// into a registry reachable through Store::metrics(); pass one registry as
// StoreOptions::metrics to share it between handles. Nothing is process-global. Labels are the
// backend (the URL scheme), the lease's kind (exclusive, shared, semaphore: LeaseKindName) and
// an outcome or reason, never the key (that would make the number of series unbounded).
//
// Example:
//
//   auto metrics = std::make_shared<leasehold::Metrics>();
//   auto store = leasehold::Store::Open(url, {.metrics = metrics});
//   ...
//   std::string text = metrics->PrometheusText();           // serve it at /metrics, or
//   leasehold::MetricsSnapshot snap = metrics->Snapshot();  // copy it into your own registry
//   const leasehold::MetricPoint* p =
//       snap.Find("leasehold_lease_acquired_total", {{"backend", "sqlite"}});
//
// The metrics and their labels are listed in the README ("Metrics").
//
// Thread safety: thread-safe. Recording is lock-free (relaxed atomic adds, no allocation);
// Snapshot() takes a lock only to walk the registry's label sets and stores.

#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold {

namespace internal {
class MetricsRegistry;
struct MetricsAccess;
}  // namespace internal

enum class MetricType { kCounter, kGauge, kHistogram };

struct MetricLabel {
  std::string name;
  std::string value;

  friend bool operator==(const MetricLabel&, const MetricLabel&) = default;
};

// One histogram bucket: how many observations were <= upper_bound (cumulative). The last
// bucket of a point has upper_bound = +infinity and cumulative_count = count.
struct HistogramBucket {
  double upper_bound = 0;
  std::uint64_t cumulative_count = 0;
};

// One series: a label set and its value.
struct MetricPoint {
  std::vector<MetricLabel> labels;
  // Counters and gauges.
  double value = 0;
  // Histograms: cumulative buckets ending with +Inf, the sum of observations (seconds) and
  // their count.
  std::vector<HistogramBucket> buckets;
  double sum = 0;
  std::uint64_t count = 0;
};

struct MetricFamily {
  std::string name;
  std::string help;
  MetricType type = MetricType::kCounter;
  std::vector<MetricPoint> points;
};

// A consistent-enough copy of every metric: each value is read atomically, the set as a whole
// is not (a counter may move between two reads).
struct MetricsSnapshot {
  std::vector<MetricFamily> families;

  // Returns the family named `name`, or null.
  [[nodiscard]] const MetricFamily* Find(std::string_view name) const;

  // Returns the first point of family `name` whose labels include every one of `labels`, or
  // null.
  [[nodiscard]] const MetricPoint* Find(std::string_view name,
                                        const std::vector<MetricLabel>& labels) const;
};

// Formats `snapshot` in the Prometheus text exposition format 0.0.4: # HELP and # TYPE lines,
// escaped label values, cumulative _bucket{le="..."} series ending with le="+Inf", _sum and
// _count. Families without points get their # HELP and # TYPE lines only.
std::string FormatPrometheusText(const MetricsSnapshot& snapshot);

// The content type of FormatPrometheusText's output, for an HTTP response.
inline constexpr std::string_view kPrometheusTextContentType =
    "text/plain; version=0.0.4; charset=utf-8";

class Metrics {
 public:
  // An empty registry: every metric family, no series until a Store records into it.
  Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;
  Metrics(Metrics&&) = delete;
  Metrics& operator=(Metrics&&) = delete;
  ~Metrics();

  // Returns every metric's current value. The gauges (leases held, smallest safe margin, TTL
  // headroom) are computed now from the leases of the stores that record here.
  [[nodiscard]] MetricsSnapshot Snapshot() const;

  // Returns FormatPrometheusText(Snapshot()).
  [[nodiscard]] std::string PrometheusText() const;

 private:
  friend struct internal::MetricsAccess;

  const std::unique_ptr<internal::MetricsRegistry> registry_;
};

}  // namespace leasehold
