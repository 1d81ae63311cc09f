// File: tests/testing/prometheus_text.h
//
// Reading one value out of Metrics::PrometheusText(), for tests that count an event by its
// counter (the clock-step tests of the Redis and PostgreSQL stores).
//
// Example:
//
//   long long jumps = testing::BackendCounter(store->metrics()->PrometheusText(),
//                                             "leasehold_store_clock_jumps_total", "redis");
//
// Thread safety: plain functions.

#pragma once

#include <cstdlib>
#include <string>

namespace leasehold::testing {

// The value of counter `name` whose only label is backend="<backend>", or -1 if absent.
inline long long BackendCounter(const std::string& text, const std::string& name,
                                const std::string& backend) {
  const std::string prefix = name + "{backend=\"" + backend + "\"} ";
  const std::size_t at = text.find(prefix);
  return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + prefix.size());
}

}  // namespace leasehold::testing
