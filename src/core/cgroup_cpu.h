// File: core/cgroup_cpu.h (internal)
//
// CPU throttling of this process's cgroup. A CPU quota (the CFS bandwidth controller that
// container runtimes set from a CPU limit: cgroup v2's cpu.max "QUOTA PERIOD", v1's
// cpu.cfs_quota_us and cpu.cfs_period_us) stops every thread of the
// cgroup for the rest of a period once the quota is spent: the heartbeat's renewal waits as
// long, and a stall of period - quota comes from the quota alone, without any load on the host.
// The cgroup that throttles may be the process's own or an ancestor (a pod's limit on its
// parent): the nearest one with a quota is the one read.
//
// Thread safety: the functions are thread-safe (they read files; no state).

#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "leasehold/clock.h"

namespace leasehold::internal {

struct CpuStat {
  std::uint64_t periods = 0;            // nr_periods: enforcement periods that had runnable work
  std::uint64_t throttled_periods = 0;  // nr_throttled: periods in which the quota ran out
  // The time stopped, all threads together: v2's throttled_usec, v1's throttled_time (ns).
  Duration throttled{};
};

struct CpuQuota {
  Duration quota{};   // CPU time per period, all CPUs together
  Duration period{};  // the enforcement period
};

struct CpuThrottling {
  int version = 2;                // the cgroup version of the CPU controller read
  std::string cgroup;             // the cgroup read, as in /proc/self/cgroup ("/a/b")
  std::optional<CpuQuota> quota;  // none: "max" on it and every ancestor
  CpuStat stat;                   // of `cgroup`
  // The longest a period's quota can stop a single-threaded process: period - quota, zero when
  // the quota is a whole CPU per period or more.
  [[nodiscard]] Duration LongestStall() const;
  // Whether that stop is more than a tenth of `ttl`, the share check allows a round trip (a
  // stop delays a renewal as much): renewals then come late and a healthy holder can lose its
  // lease. `leasehold check` (area cpu) and the first grant of a Store judge by it.
  [[nodiscard]] bool StallsTtl(Duration ttl) const;
};

// The process's cgroup in /proc/self/cgroup's text: the v2 line's ("0::/a/b" -> "/a/b") with
// `v1_controller` empty, else the v1 line whose controllers include it ("4:cpu,cpuacct:/a").
// nullopt without such a line.
std::optional<std::string> ParseCgroupPath(std::string_view proc_self_cgroup,
                                           std::string_view v1_controller = {});

// cpu.stat's text, v2 (throttled_usec) or v1 (throttled_time, in ns); nullopt if nr_periods,
// nr_throttled or both times are missing (no CPU controller for the cgroup).
std::optional<CpuStat> ParseCpuStat(std::string_view text);

// cpu.max's text ("max 100000" -> nullopt quota, returned as an engaged optional of nullopt;
// "10000 100000" -> 10 ms per 100 ms). The outer nullopt: not cpu.max's format.
std::optional<std::optional<CpuQuota>> ParseCpuMax(std::string_view text);

// v1's cpu.cfs_quota_us and cpu.cfs_period_us ("-1" -> no quota), as ParseCpuMax.
std::optional<std::optional<CpuQuota>> ParseCfsQuota(std::string_view quota_us,
                                                     std::string_view period_us);

// Reads this process's throttling: cgroup v2 where its CPU controller is enabled (the mount at
// /sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host), else v1's cpu hierarchy
// (/sys/fs/cgroup/cpu or /sys/fs/cgroup/cpu,cpuacct). nullopt where neither can be read (a
// container without /sys/fs/cgroup).
std::optional<CpuThrottling> ReadCpuThrottling();

}  // namespace leasehold::internal
