#include "core/cgroup_cpu.h"

#include <charconv>
#include <fstream>
#include <sstream>

namespace leasehold::internal {

namespace {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return std::nullopt;
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::optional<std::uint64_t> ParseUint(std::string_view s) {
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) {
    return std::nullopt;
  }
  return v;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  while (!s.empty() && s.front() == ' ') {
    s.remove_prefix(1);
  }
  return s;
}

// The parent of a cgroup path: "/a/b" -> "/a", "/a" -> "/", "/" -> nullopt.
std::optional<std::string> Parent(const std::string& path) {
  if (path == "/" || path.empty()) {
    return std::nullopt;
  }
  const std::size_t slash = path.rfind('/');
  return slash == 0 || slash == std::string::npos ? std::string("/") : path.substr(0, slash);
}

}  // namespace

Duration CpuThrottling::LongestStall() const {
  if (!quota || quota->quota >= quota->period) {
    return Duration::zero();
  }
  return quota->period - quota->quota;
}

bool CpuThrottling::StallsTtl(Duration ttl) const {
  return ttl > Duration::zero() && LongestStall() * 10 > ttl;
}

std::optional<std::string> ParseCgroupPath(std::string_view text, std::string_view v1_controller) {
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    // "ID:CONTROLLERS:PATH"
    const std::size_t c1 = line.find(':');
    const std::size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) {
      continue;
    }
    std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
    const std::string_view path = Trim(line.substr(c2 + 1));
    bool match = v1_controller.empty() && line.substr(0, c1) == "0" && controllers.empty();
    while (!v1_controller.empty() && !match && !controllers.empty()) {
      const std::size_t comma = controllers.find(',');
      match = controllers.substr(0, comma) == v1_controller;
      controllers =
          comma == std::string_view::npos ? std::string_view() : controllers.substr(comma + 1);
    }
    if (match) {
      return path.starts_with('/') ? std::optional<std::string>(path) : std::nullopt;
    }
  }
  return std::nullopt;
}

std::optional<CpuStat> ParseCpuStat(std::string_view text) {
  std::optional<std::uint64_t> periods;
  std::optional<std::uint64_t> throttled;
  std::optional<Duration> time;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    const std::size_t sp = line.find(' ');
    if (sp == std::string_view::npos) {
      continue;
    }
    const std::string_view name = line.substr(0, sp);
    const std::optional<std::uint64_t> value = ParseUint(Trim(line.substr(sp + 1)));
    if (name == "nr_periods") {
      periods = value;
    } else if (name == "nr_throttled") {
      throttled = value;
    } else if (name == "throttled_usec" && value) {
      time = std::chrono::microseconds(*value);
    } else if (name == "throttled_time" && value) {
      time = std::chrono::nanoseconds(*value);
    }
  }
  if (!periods || !throttled || !time) {
    return std::nullopt;
  }
  return CpuStat{.periods = *periods, .throttled_periods = *throttled, .throttled = *time};
}

std::optional<std::optional<CpuQuota>> ParseCpuMax(std::string_view text) {
  text = Trim(text);
  const std::size_t sp = text.find(' ');
  if (sp == std::string_view::npos) {
    return std::nullopt;
  }
  const std::optional<std::uint64_t> period = ParseUint(text.substr(sp + 1));
  if (!period || *period == 0) {
    return std::nullopt;
  }
  const std::string_view quota = text.substr(0, sp);
  if (quota == "max") {
    return std::optional<CpuQuota>();
  }
  const std::optional<std::uint64_t> q = ParseUint(quota);
  if (!q || *q == 0) {
    return std::nullopt;
  }
  return std::optional<CpuQuota>(CpuQuota{.quota = std::chrono::microseconds(*q),
                                          .period = std::chrono::microseconds(*period)});
}

std::optional<std::optional<CpuQuota>> ParseCfsQuota(std::string_view quota_us,
                                                     std::string_view period_us) {
  quota_us = Trim(quota_us);
  return ParseCpuMax(std::string(quota_us == "-1" ? "max" : quota_us) + " " +
                     std::string(Trim(period_us)));
}

namespace {

// One CPU controller hierarchy: where it is mounted and how its files are named.
struct Hierarchy {
  int version;
  std::string root;
  std::optional<std::string> own;  // the process's cgroup in it
};

std::optional<std::optional<CpuQuota>> ReadQuota(const Hierarchy& h, const std::string& dir) {
  if (h.version == 2) {
    const std::optional<std::string> max = ReadFile(dir + "/cpu.max");
    return max ? ParseCpuMax(*max) : std::nullopt;
  }
  const std::optional<std::string> quota = ReadFile(dir + "/cpu.cfs_quota_us");
  const std::optional<std::string> period = ReadFile(dir + "/cpu.cfs_period_us");
  return quota && period ? ParseCfsQuota(*quota, *period) : std::nullopt;
}

std::optional<CpuThrottling> ReadIn(const Hierarchy& h) {
  auto dir_of = [&](const std::string& path) { return h.root + (path == "/" ? "" : path); };
  auto stat_of = [&](const std::string& path) -> std::optional<CpuStat> {
    const std::optional<std::string> stat = ReadFile(dir_of(path) + "/cpu.stat");
    return stat ? ParseCpuStat(*stat) : std::nullopt;
  };
  // The nearest cgroup with a quota, else the process's own (no throttling to report, but its
  // periods still count).
  for (std::optional<std::string> path = h.own; path; path = Parent(*path)) {
    const std::optional<std::optional<CpuQuota>> quota = ReadQuota(h, dir_of(*path));
    if (quota && quota->has_value()) {
      if (std::optional<CpuStat> stat = stat_of(*path)) {
        return CpuThrottling{
            .version = h.version, .cgroup = *path, .quota = **quota, .stat = *stat};
      }
    }
  }
  std::optional<CpuStat> stat = stat_of(*h.own);
  if (!stat) {
    return std::nullopt;
  }
  return CpuThrottling{
      .version = h.version, .cgroup = *h.own, .quota = std::nullopt, .stat = *stat};
}

}  // namespace

std::optional<CpuThrottling> ReadCpuThrottling() {
  const std::optional<std::string> self = ReadFile("/proc/self/cgroup");
  if (!self) {
    return std::nullopt;
  }
  const std::optional<std::string> v2 = ParseCgroupPath(*self);
  const std::optional<std::string> v1 = ParseCgroupPath(*self, "cpu");
  for (const Hierarchy& h :
       {Hierarchy{2, "/sys/fs/cgroup", v2}, Hierarchy{2, "/sys/fs/cgroup/unified", v2},
        Hierarchy{1, "/sys/fs/cgroup/cpu", v1}, Hierarchy{1, "/sys/fs/cgroup/cpu,cpuacct", v1}}) {
    if (!h.own) {
      continue;
    }
    if (std::optional<CpuThrottling> found = ReadIn(h)) {
      return found;
    }
  }
  return std::nullopt;
}

}  // namespace leasehold::internal
