// Prometheus text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/), and snapshot lookups.

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "leasehold/metrics.h"

namespace leasehold {

namespace {

// Label values escape backslash, double quote and line feed.
void AppendLabelValue(std::string& out, std::string_view value) {
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
}

// HELP text escapes backslash and line feed only.
void AppendHelp(std::string& out, std::string_view help) {
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

// Go's ParseFloat forms: +Inf, -Inf, NaN, else the shortest round-trip decimal.
std::string FormatValue(double v) {
  if (std::isnan(v)) {
    return "NaN";
  }
  if (std::isinf(v)) {
    return v > 0 ? "+Inf" : "-Inf";
  }
  return fmt::format("{}", v);
}

// Appends `{a="x",b="y"}` (with an extra le label if given), or nothing for no labels.
void AppendLabels(std::string& out, const std::vector<MetricLabel>& labels,
                  const std::string* le = nullptr) {
  if (labels.empty() && le == nullptr) {
    return;
  }
  out += '{';
  bool first = true;
  for (const MetricLabel& label : labels) {
    if (!first) {
      out += ',';
    }
    first = false;
    out += label.name;
    out += "=\"";
    AppendLabelValue(out, label.value);
    out += '"';
  }
  if (le != nullptr) {
    if (!first) {
      out += ',';
    }
    out += "le=\"";
    out += *le;
    out += '"';
  }
  out += '}';
}

std::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

bool HasLabels(const MetricPoint& point, const std::vector<MetricLabel>& wanted) {
  for (const MetricLabel& w : wanted) {
    bool found = false;
    for (const MetricLabel& l : point.labels) {
      found = found || l == w;
    }
    if (!found) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string FormatPrometheusText(const MetricsSnapshot& snapshot) {
  std::string out;
  for (const MetricFamily& family : snapshot.families) {
    out += "# HELP ";
    out += family.name;
    out += ' ';
    AppendHelp(out, family.help);
    out += "\n# TYPE ";
    out += family.name;
    out += ' ';
    out += TypeName(family.type);
    out += '\n';
    for (const MetricPoint& point : family.points) {
      if (family.type != MetricType::kHistogram) {
        out += family.name;
        AppendLabels(out, point.labels);
        out += ' ';
        out += FormatValue(point.value);
        out += '\n';
        continue;
      }
      for (const HistogramBucket& bucket : point.buckets) {
        const std::string le = FormatValue(bucket.upper_bound);
        out += family.name;
        out += "_bucket";
        AppendLabels(out, point.labels, &le);
        out += fmt::format(" {}\n", bucket.cumulative_count);
      }
      if (point.buckets.empty() || !std::isinf(point.buckets.back().upper_bound)) {
        // Every histogram ends with +Inf, even one built by hand without it.
        const std::string le = "+Inf";
        out += family.name;
        out += "_bucket";
        AppendLabels(out, point.labels, &le);
        out += fmt::format(" {}\n", point.count);
      }
      out += family.name;
      out += "_sum";
      AppendLabels(out, point.labels);
      out += ' ';
      out += FormatValue(point.sum);
      out += '\n';
      out += family.name;
      out += "_count";
      AppendLabels(out, point.labels);
      out += fmt::format(" {}\n", point.count);
    }
  }
  return out;
}

const MetricFamily* MetricsSnapshot::Find(std::string_view name) const {
  for (const MetricFamily& family : families) {
    if (family.name == name) {
      return &family;
    }
  }
  return nullptr;
}

const MetricPoint* MetricsSnapshot::Find(std::string_view name,
                                         const std::vector<MetricLabel>& labels) const {
  const MetricFamily* family = Find(name);
  if (family == nullptr) {
    return nullptr;
  }
  for (const MetricPoint& point : family->points) {
    if (HasLabels(point, labels)) {
      return &point;
    }
  }
  return nullptr;
}

}  // namespace leasehold
