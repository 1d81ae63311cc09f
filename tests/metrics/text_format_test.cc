// FormatPrometheusText against the text exposition format 0.0.4, line by line.

#include <limits>

#include <gtest/gtest.h>

#include "leasehold/metrics.h"

namespace leasehold {
namespace {

TEST(PrometheusTextTest, CounterWithHelpTypeAndEscapedLabels) {
  MetricsSnapshot snap;
  snap.families.push_back(
      {.name = "x_total",
       .help = "Counts \\ things\nacross lines",
       .type = MetricType::kCounter,
       .points = {{.labels = {{"backend", "a\"b\\c\nd"}, {"outcome", "ok"}}, .value = 3}}});
  EXPECT_EQ(FormatPrometheusText(snap),
            "# HELP x_total Counts \\\\ things\\nacross lines\n"
            "# TYPE x_total counter\n"
            "x_total{backend=\"a\\\"b\\\\c\\nd\",outcome=\"ok\"} 3\n");
}

TEST(PrometheusTextTest, GaugeWithoutLabelsAndSpecialValues) {
  MetricsSnapshot snap;
  snap.families.push_back({.name = "g",
                           .help = "A gauge.",
                           .type = MetricType::kGauge,
                           .points = {{.labels = {}, .value = 0.25}}});
  snap.families.push_back(
      {.name = "h",
       .help = "Another.",
       .type = MetricType::kGauge,
       .points = {{.labels = {{"k", "v"}}, .value = std::numeric_limits<double>::infinity()}}});
  EXPECT_EQ(FormatPrometheusText(snap),
            "# HELP g A gauge.\n# TYPE g gauge\ng 0.25\n"
            "# HELP h Another.\n# TYPE h gauge\nh{k=\"v\"} +Inf\n");
}

TEST(PrometheusTextTest, HistogramHasCumulativeBucketsInfSumAndCount) {
  MetricsSnapshot snap;
  MetricPoint p;
  p.labels = {{"backend", "sqlite"}};
  p.buckets = {{0.001, 2}, {0.5, 5}, {std::numeric_limits<double>::infinity(), 6}};
  p.sum = 1.75;
  p.count = 6;
  snap.families.push_back(
      {.name = "lat_seconds", .help = "Latency.", .type = MetricType::kHistogram, .points = {p}});
  EXPECT_EQ(FormatPrometheusText(snap),
            "# HELP lat_seconds Latency.\n"
            "# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{backend=\"sqlite\",le=\"0.001\"} 2\n"
            "lat_seconds_bucket{backend=\"sqlite\",le=\"0.5\"} 5\n"
            "lat_seconds_bucket{backend=\"sqlite\",le=\"+Inf\"} 6\n"
            "lat_seconds_sum{backend=\"sqlite\"} 1.75\n"
            "lat_seconds_count{backend=\"sqlite\"} 6\n");
}

TEST(PrometheusTextTest, HistogramWithoutInfBucketGetsOne) {
  MetricsSnapshot snap;
  MetricPoint p;
  p.buckets = {{1, 1}};
  p.sum = 0.5;
  p.count = 3;
  snap.families.push_back(
      {.name = "h", .help = "H.", .type = MetricType::kHistogram, .points = {p}});
  EXPECT_EQ(FormatPrometheusText(snap),
            "# HELP h H.\n# TYPE h histogram\n"
            "h_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 3\nh_sum 0.5\nh_count 3\n");
}

TEST(PrometheusTextTest, FindMatchesALabelSubset) {
  MetricsSnapshot snap;
  snap.families.push_back(
      {.name = "c",
       .help = "C.",
       .type = MetricType::kCounter,
       .points = {{.labels = {{"backend", "a"}, {"reason", "x"}}, .value = 1},
                  {.labels = {{"backend", "a"}, {"reason", "y"}}, .value = 2}}});
  const MetricPoint* y = snap.Find("c", {{"reason", "y"}});
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(y->value, 2);
  EXPECT_EQ(snap.Find("c", {{"reason", "z"}}), nullptr);
  EXPECT_EQ(snap.Find("nope", {}), nullptr);
}

}  // namespace
}  // namespace leasehold
