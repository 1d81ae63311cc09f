// File: bench/metrics_overhead_bench.cc
//
// What metrics cost on the uncontended path: TryAcquire + Release of one key, in a loop, on
// memory:// (no I/O: the worst case for relative overhead) and sqlite:// (a temporary file: the
// store's own round trip). Trials with StoreOptions::record_metrics on and off alternate, so
// that drift of the machine hits both alike; prints the median per operation of each and their
// ratio, next to the spread between trials of the same kind (the noise). Log lines are
// switched off (kWarning) for both: they cost far more than metrics and are measured apart.
//
//   metrics_overhead_bench [TRIALS=9] [MEMORY_OPS=20000] [SQLITE_OPS=1000]

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "leasehold/logging.h"
#include "leasehold/store.h"

namespace {

using Clock = std::chrono::steady_clock;

// Returns nanoseconds per TryAcquire + Release pair, or -1 on error.
double Trial(const std::string& url, bool record, int ops) {
  auto store = leasehold::Store::Open(url, {.record_metrics = record});
  if (!store.ok()) {
    std::fprintf(stderr, "open %s: %s\n", url.c_str(), store.status().ToString().c_str());
    return -1;
  }
  // Warm up: the heartbeat threads start with the first lease; SQLite opens its file.
  for (int i = 0; i < 10; ++i) {
    auto lease = (*store)->TryAcquire("bench:key");
    if (!lease.ok() || !lease->Release().ok()) {
      return -1;
    }
  }
  const auto start = Clock::now();
  for (int i = 0; i < ops; ++i) {
    auto lease = (*store)->TryAcquire("bench:key");
    if (!lease.ok()) {
      std::fprintf(stderr, "acquire: %s\n", lease.status().ToString().c_str());
      return -1;
    }
    if (auto s = lease->Release(); !s.ok()) {
      std::fprintf(stderr, "release: %s\n", s.ToString().c_str());
      return -1;
    }
  }
  const auto elapsed = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
  return elapsed / ops;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// (max - min) / median: how far apart trials of the same kind land.
double Spread(const std::vector<double>& v) {
  auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return (*hi - *lo) / Median(v);
}

int Run(const std::string& name, const std::string& url, int trials, int ops) {
  std::vector<double> on;
  std::vector<double> off;
  for (int t = 0; t < trials; ++t) {
    // Alternate which goes first, so neither always runs on a warmer cache.
    const bool on_first = t % 2 == 0;
    for (int k = 0; k < 2; ++k) {
      const bool record = (k == 0) == on_first;
      double ns = Trial(url, record, ops);
      if (ns < 0) {
        return 1;
      }
      (record ? on : off).push_back(ns);
    }
  }
  const double m_on = Median(on);
  const double m_off = Median(off);
  std::printf(
      "%-8s  with metrics %9.0f ns/op   without %9.0f ns/op   ratio %.3f (%+.1f%%)   "
      "noise: spread %.1f%% / %.1f%% over %d trials of %d ops\n",
      name.c_str(), m_on, m_off, m_on / m_off, 100.0 * (m_on / m_off - 1.0), 100.0 * Spread(on),
      100.0 * Spread(off), trials, ops);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int trials = argc > 1 ? std::atoi(argv[1]) : 9;
  const int memory_ops = argc > 2 ? std::atoi(argv[2]) : 20000;
  const int sqlite_ops = argc > 3 ? std::atoi(argv[3]) : 1000;
  if (trials < 1 || memory_ops < 1 || sqlite_ops < 1) {
    std::fprintf(stderr, "usage: metrics_overhead_bench [TRIALS] [MEMORY_OPS] [SQLITE_OPS]\n");
    return 64;
  }
  leasehold::SetLogLevel(leasehold::LogLevel::kWarning);
  int rc = Run("memory", "memory://metrics-bench", trials, memory_ops);
#if LEASEHOLD_WITH_SQLITE
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("leasehold-bench-{}", ::getpid());
  std::filesystem::create_directories(dir);
  rc |= Run("sqlite", "sqlite://" + (dir / "leases.db").string(), trials, sqlite_ops);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
#endif
  return rc;
}
