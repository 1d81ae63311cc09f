// File: core/check.cc
//
// Store::Check (leasehold/check.h): the probes, the cycle on a throwaway key, the clock, the
// backend's own findings, and the TTL advice. Every store call goes straight to the backend (no
// heartbeat, no metrics), so each one is timed alone; every one is bounded by the backend's
// timeouts, so a check of a store that does not answer ends as "unreachable", never hangs.

#include "leasehold/check.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "leasehold/store.h"

#include "core/cgroup_cpu.h"
#include "core/duration.h"
#include "core/owner_token.h"
#include "core/store_core.h"

namespace leasehold {

namespace {

using internal::Backend;
using internal::Diagnosis;
using internal::FormatDuration;
using internal::RoundForDisplay;

constexpr int kMaxProbes = 10000;
constexpr int kMaxRenewals = 1000;
// The rule: a TTL at least this many times the heartbeat's p99 round trip.
constexpr int kTtlToP99 = 10;
// The shortest TTL recommended whatever the latency: process pauses (GC, CPU throttling, a busy
// host) that a check cannot see reach hundreds of milliseconds.
constexpr Duration kMinRecommendedTtl = std::chrono::seconds(1);
// How long the cycle's wait step listens (it only shows the notification can be set up).
constexpr Duration kWaitProbe = std::chrono::milliseconds(50);
// A clock offset beyond this is worth a warning: schedule slots are named by the store's clock.
constexpr Duration kClockWarn = std::chrono::milliseconds(500);

// A measured figure for people: "0.217ms" below 1 ms, "12.3ms" below 1 s, then as
// RoundForDisplay ("1.25s").
std::string Ms(Duration d) {
  using std::chrono::milliseconds;
  double ms = static_cast<double>(d.count()) / 1e6;
  if (d < milliseconds(1) && d > -milliseconds(1))
    return fmt::format("{:.3f}ms", ms);
  if (d < milliseconds(1000) && d > -milliseconds(1000))
    return fmt::format("{:.1f}ms", ms);
  return FormatDuration(RoundForDisplay(d));
}

LatencySummary Summarize(std::vector<Duration> samples) {
  LatencySummary s;
  if (samples.empty())
    return s;
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) {
    // Nearest rank: the smallest sample with at least q of them at or below it.
    auto rank = static_cast<std::size_t>(q * static_cast<double>(samples.size()) + 0.999999);
    return samples[std::clamp<std::size_t>(rank, 1, samples.size()) - 1];
  };
  s.count = static_cast<int>(samples.size());
  s.p50 = at(0.50);
  s.p99 = at(0.99);
  s.max = samples.back();
  return s;
}

// Rounds `d` up to a multiple of `step` (unchanged if step is zero).
Duration RoundUp(Duration d, Duration step) {
  if (step <= Duration::zero())
    return d;
  auto n = (d.count() + step.count() - 1) / step.count();
  return Duration(n * step.count());
}

// Rounds a TTL up to a figure a person would type: whole 10 ms below 1 s, whole 100 ms below
// 10 s, whole seconds above.
Duration RoundTtl(Duration d) {
  using std::chrono::milliseconds;
  if (d < std::chrono::seconds(1))
    return RoundUp(d, milliseconds(10));
  if (d < std::chrono::seconds(10))
    return RoundUp(d, milliseconds(100));
  return RoundUp(d, std::chrono::seconds(1));
}

CheckVerdict VerdictOf(const Status& status) {
  switch (status.code()) {
    case StatusCode::kPermissionDenied:
      return CheckVerdict::kPermissionDenied;
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
      return CheckVerdict::kUnreachable;
    default:
      return CheckVerdict::kUnsafe;
  }
}

class Checker {
 public:
  Checker(Backend& backend, Clock& clock, CheckReport& report)
      : backend_(backend), clock_(clock), report_(report) {}

  void Add(CheckItem item) { report_.items.push_back(std::move(item)); }

  // Records a failed step under an area named by its verdict ("permissions", "connect", else
  // `area`); returns false so that callers can `return Fail(...)`.
  bool Fail(std::string_view area, std::string_view step, const Status& status,
            const std::string& permissions_fix) {
    CheckVerdict verdict = VerdictOf(status);
    std::string fix;
    if (status.code() == StatusCode::kLost) {
      fix =
          "the grant expired within the cycle: the TTL is too short for this store's round "
          "trips (see the ttl line)";
    } else if (verdict == CheckVerdict::kPermissionDenied) {
      area = "permissions";
      fix = permissions_fix.empty() ? "grant the credentials every operation leasehold needs "
                                      "(the README's section on this store lists them)"
                                    : permissions_fix;
    } else if (verdict == CheckVerdict::kUnreachable) {
      area = "connect";
      fix = "check the address, the network and that the store is running and not overloaded";
    } else {
      fix = "this is unexpected: report it with the output of --json";
    }
    Add({.area = std::string(area),
         .verdict = verdict,
         .found = fmt::format("{} failed: {}", step, status.ToString()),
         .fix = std::move(fix)});
    return false;
  }

  // Times `call` (a Status or Result) on the check's clock.
  template <typename F>
  auto Timed(Duration& elapsed, F&& call) {
    SteadyTime t0 = clock_.Now();
    auto r = call();
    elapsed = clock_.Now() - t0;
    return r;
  }

  bool Probe(int probes, const Diagnosis& diagnosis) {
    std::vector<Duration> samples;
    samples.reserve(static_cast<std::size_t>(probes));
    for (int i = 0; i < probes; ++i) {
      Duration d{};
      Status s = Timed(d, [&] { return backend_.Ping(); });
      if (s.code() == StatusCode::kUnimplemented)
        break;  // a store without a probe
      if (!s.ok())
        return Fail("round-trip", diagnosis.probe, s, diagnosis.permissions_fix);
      samples.push_back(d);
    }
    report_.round_trip = Summarize(std::move(samples));
    if (report_.round_trip.count > 0) {
      Add({.area = "round-trip",
           .found = fmt::format("{} x{}: p50 {}, p99 {}, max {}", diagnosis.probe,
                                report_.round_trip.count, Ms(report_.round_trip.p50),
                                Ms(report_.round_trip.p99), Ms(report_.round_trip.max))});
    }
    return true;
  }

  bool Cycle(Duration ttl, int renewals, const std::string& key,
             const std::string& permissions_fix) {
    auto token = internal::NewOwnerToken();
    if (!token.ok())
      return Fail("cycle", "making an owner token", token.status(), {});
    report_.cycle_key = key;
    report_.ttl_requested = ttl;
    SteadyTime start = clock_.Now();

    internal::GrantRequest grant_request{
        .key = key, .owner_token = *token, .holder = "leasehold-check", .ttl = ttl};
    auto grant = Timed(report_.acquire, [&] { return backend_.TryAcquire(grant_request); });
    if (!grant.ok())
      return Fail("cycle", "acquire", grant.status(), permissions_fix);
    report_.fencing_token = grant->fencing_token;
    report_.ttl_granted = grant->ttl;

    // From here on the grant is ours: every exit releases it, but one after a step the store
    // did not answer (that would cost another timeout): the throwaway key expires at its TTL.
    bool ok = CycleHeld(key, *token, grant->ttl, renewals, permissions_fix);
    const bool answered =
        ok || report_.items.empty() || report_.items.back().verdict != CheckVerdict::kUnreachable;
    if (answered) {
      Status released = Timed(report_.release, [&] { return backend_.Release(key, *token); });
      if (ok && !released.ok()) {
        ok = Fail("cycle", "release", released, permissions_fix);
      }
    }
    report_.cycle_total = clock_.Now() - start;
    if (ok) {
      // On the free key: shows the store's notification can be set up (SUBSCRIBE, LISTEN, a
      // watch), and costs at most kWaitProbe.
      Status waited = backend_.WaitForChange(key, clock_.Now() + kWaitProbe, {});
      if (!waited.ok() && waited.code() != StatusCode::kDeadlineExceeded &&
          waited.code() != StatusCode::kUnimplemented) {
        ok = Fail("cycle", "wait for a change", waited, permissions_fix);
      }
    }
    report_.cycle_done = ok;
    if (ok) {
      Add({.area = "cycle",
           .found = fmt::format(
               "acquire {}, renew p50 {} (x{}), release {} on {} (fencing token {}); total {}",
               Ms(report_.acquire), Ms(report_.renew.p50), report_.renew.count, Ms(report_.release),
               key, report_.fencing_token, Ms(report_.cycle_total))});
    }
    return ok;
  }

  void ReadClock() {
    SystemTime before = std::chrono::system_clock::now();
    auto t = backend_.WallClock();
    SystemTime after = std::chrono::system_clock::now();
    if (!t.ok()) {
      Add({.area = "clock",
           .verdict = CheckVerdict::kWarn,
           .found = fmt::format("the store's clock could not be read: {}", t.status().ToString()),
           .fix = "schedule slots (run --once-per) need it; see the permissions above"});
      return;
    }
    if (!t->from_store) {
      Add({.area = "clock",
           .found = "the store has no clock of its own: schedule slots are named by this "
                    "host's clock, so keep the fleet's clocks in step (NTP)"});
      return;
    }
    SystemTime mid = before + (after - before) / 2;
    Duration offset = std::chrono::duration_cast<Duration>(t->time - mid);
    Duration uncertainty = std::chrono::duration_cast<Duration>(after - before) / 2;
    report_.clock_offset = offset;
    report_.clock_uncertainty = uncertainty;
    Duration magnitude = offset < Duration::zero() ? -offset : offset;
    bool far = magnitude > kClockWarn + uncertainty;
    Add({.area = "clock",
         .verdict = far ? CheckVerdict::kWarn : CheckVerdict::kPass,
         .found = fmt::format("store - local = {}{} +/- {}", offset < Duration::zero() ? "-" : "+",
                              Ms(magnitude), Ms(uncertainty)),
         .fix = far ? "schedule slots are named by the store's clock and this host's slot "
                      "tolerance is judged against it: run NTP on the store and on this host"
                    : ""});
  }

 private:
  bool CycleHeld(const std::string& key, const std::string& token, Duration granted, int renewals,
                 const std::string& permissions_fix) {
    std::vector<Duration> samples;
    internal::RenewRequest renew{.key = key, .owner_token = token, .ttl = granted};
    for (int i = 0; i < renewals; ++i) {
      Duration d{};
      Status s = Timed(d, [&] { return backend_.Renew(renew); });
      if (!s.ok())
        return Fail("cycle", "renew", s, permissions_fix);
      samples.push_back(d);
    }
    report_.renew = Summarize(std::move(samples));

    auto info = backend_.Inspect(key);
    if (!info.ok())
      return Fail("cycle", "inspect", info.status(), permissions_fix);
    if (!info->has_value() || (*info)->fencing_token != report_.fencing_token) {
      return Fail("cycle", "inspect",
                  Status::Internal("the store does not show the grant the check just took"), {});
    }
    auto list = backend_.List(key);
    if (!list.ok())
      return Fail("cycle", "list", list.status(), permissions_fix);
    auto record = backend_.ReadRecord(key);
    if (!record.ok() && record.status().code() != StatusCode::kUnimplemented) {
      return Fail("cycle", "read the schedule record", record.status(), permissions_fix);
    }
    return true;
  }

  Backend& backend_;
  Clock& clock_;
  CheckReport& report_;
};

// The TTL advice and its items, from the figures measured.
// `shortest` is the shortest TTL the store grants (Diagnosis::shortest_ttl; zero if unknown).
void Advise(const CheckOptions& options, Duration shortest, CheckReport& report) {
  Duration p99 = std::max(report.round_trip.p99, report.renew.p99);
  Duration floor = std::max(RoundUp(RoundTtl(p99 * kTtlToP99), report.ttl_granularity), shortest);
  report.min_ttl = floor;
  Duration recommended = std::max(floor, RoundUp(kMinRecommendedTtl, report.ttl_granularity));
  report.recommended_ttl = recommended;
  report.recommended_renew_every =
      std::chrono::duration_cast<std::chrono::milliseconds>(recommended / 3);
  // Name the p99 the advice rests on as the report prints it: the round trip's (its own line)
  // or the renewals' (the cycle line prints their p50; their p99 is given here).
  const bool renewals = report.renew.p99 > report.round_trip.p99;
  std::string basis =
      fmt::format("{}x the {} p99 ({}) is {}", kTtlToP99, renewals ? "renewals'" : "round trip's",
                  Ms(p99), Ms(p99 * kTtlToP99));
  if (report.ttl_granularity > Duration::zero()) {
    basis += fmt::format(", in steps of {}", FormatDuration(report.ttl_granularity));
  }
  if (shortest > Duration::zero()) {
    basis += fmt::format(", at least the store's shortest, {}", FormatDuration(shortest));
  }

  if (report.cycle_done && report.ttl_granted != report.ttl_requested) {
    const bool less = report.ttl_granted < report.ttl_requested;
    // What decides the granted TTL, for the fix line: the two stores that change it.
    const std::string_view why =
        report.backend == "zk"     ? "the ZooKeeper server's minSessionTimeout and "
                                     "maxSessionTimeout (2 and 20 ticks by default)"
        : report.backend == "etcd" ? "etcd, which grants whole seconds, at least 2 s"
                                   : "the store";
    report.items.push_back(
        {.area = "session",
         .verdict = less ? CheckVerdict::kUnsafe : CheckVerdict::kWarn,
         .found = fmt::format("a TTL of {} is granted as {}", FormatDuration(report.ttl_requested),
                              FormatDuration(report.ttl_granted)),
         .fix = less ? fmt::format("the TTL is capped by {}: raise the upper bound or ask for "
                                   "at most {}",
                                   why, FormatDuration(report.ttl_granted))
                     : fmt::format("the TTL is set by {}: ask for {}, what you will be granted "
                                   "(a takeover after a crash waits that long)",
                                   why, FormatDuration(report.ttl_granted))});
  }

  if (!options.ttl) {
    report.items.push_back(
        {.area = "ttl",
         .found = fmt::format("recommended --ttl {} --renew-every {} ({}; at least {})",
                              FormatDuration(recommended),
                              FormatDuration(report.recommended_renew_every), basis,
                              FormatDuration(kMinRecommendedTtl))});
    return;
  }
  report.ttl_judged = true;
  Duration judged = report.cycle_done ? report.ttl_granted : *options.ttl;
  // The TTL asked for, and what the store made of it where that differs: the granted one is
  // the one judged.
  const std::string asked =
      judged == *options.ttl
          ? FormatDuration(*options.ttl)
          : fmt::format("{} (granted as {})", FormatDuration(*options.ttl), FormatDuration(judged));
  report.ttl_safe = judged >= floor;
  if (report.ttl_safe && judged < kMinRecommendedTtl) {
    // Meets the rule, but leaves no room for pauses of the holder's own process.
    report.items.push_back(
        {.area = "ttl",
         .verdict = CheckVerdict::kWarn,
         .found = fmt::format("--ttl {} meets the rule ({}) but is under {}", asked, basis,
                              FormatDuration(kMinRecommendedTtl)),
         .fix = fmt::format("a GC pause, CPU throttling or a busy host of a few hundred ms would "
                            "lose the lease: use --ttl {} --renew-every {} unless a takeover "
                            "that fast matters and the job's process never pauses",
                            FormatDuration(recommended),
                            FormatDuration(report.recommended_renew_every))});
  } else if (report.ttl_safe) {
    report.items.push_back(
        {.area = "ttl",
         .found = fmt::format("--ttl {} is safe ({}); recommended --ttl {} --renew-every {}", asked,
                              basis, FormatDuration(recommended),
                              FormatDuration(report.recommended_renew_every))});
  } else {
    report.items.push_back(
        {.area = "ttl",
         .verdict = CheckVerdict::kUnsafe,
         .found = fmt::format("--ttl {} is too short: {}", asked, basis),
         .fix = fmt::format("use --ttl {} --renew-every {}", FormatDuration(recommended),
                            FormatDuration(report.recommended_renew_every))});
  }
}

// The CPU quota of the cgroup the check runs in (core/cgroup_cpu.h; the job's when check runs
// beside it): a quota of Q per period P stops every thread, the heartbeat's too, for up to
// P - Q at a time. Judged by the round trip's rule: such a stop should fit ten times in the
// TTL (the one given, else the recommended one).
void JudgeCpu(const CheckOptions& options, CheckReport& report) {
  const std::optional<internal::CpuThrottling> cpu = internal::ReadCpuThrottling();
  if (!cpu) {
    return;  // no cgroup CPU controller to read: nothing to say
  }
  if (!cpu->quota) {
    report.items.push_back({.area = "cpu",
                            .found = fmt::format("no CPU quota on cgroup {} (cgroup v{})",
                                                 cpu->cgroup, cpu->version)});
    return;
  }
  const Duration stall = cpu->LongestStall();
  const std::string found = fmt::format(
      "CPU quota of {:.2f} CPUs ({} per {}) on cgroup {} (cgroup v{}): the holder may be "
      "stopped for up to {} at a time; throttled in {} of {} periods so far ({} in all)",
      static_cast<double>(cpu->quota->quota.count()) /
          static_cast<double>(cpu->quota->period.count()),
      FormatDuration(cpu->quota->quota), FormatDuration(cpu->quota->period), cpu->cgroup,
      cpu->version, FormatDuration(stall), cpu->stat.throttled_periods, cpu->stat.periods,
      FormatDuration(RoundForDisplay(cpu->stat.throttled)));
  const Duration ttl = options.ttl ? (report.ttl_judged ? report.ttl_granted : *options.ttl)
                                   : report.recommended_ttl;
  if (!cpu->StallsTtl(ttl)) {
    report.items.push_back({.area = "cpu", .found = found});
    return;
  }
  report.items.push_back(
      {.area = "cpu",
       .verdict = CheckVerdict::kWarn,
       .found = found,
       .fix = fmt::format("a stop of {} is more than a tenth of the TTL of {}: renewals come "
                          "late and a lease can be lost while its holder is healthy; raise the "
                          "quota to at least {} per {}, or use --ttl {}",
                          FormatDuration(stall), FormatDuration(ttl),
                          FormatDuration(cpu->quota->period - ttl / kTtlToP99),
                          FormatDuration(cpu->quota->period),
                          FormatDuration(RoundTtl(stall * kTtlToP99)))});
}

std::string ThrowawayKey() {
  auto token = internal::NewOwnerToken();
  return "leasehold-check/" + (token.ok() ? token->substr(0, 16) : std::string("0"));
}

}  // namespace

std::string_view CheckVerdictName(CheckVerdict verdict) {
  switch (verdict) {
    case CheckVerdict::kPass:
      return "pass";
    case CheckVerdict::kWarn:
      return "warn";
    case CheckVerdict::kUnsafe:
      return "unsafe";
    case CheckVerdict::kPermissionDenied:
      return "permission";
    case CheckVerdict::kUnreachable:
      return "unreachable";
  }
  return "unsafe";
}

std::string_view StoreScopeName(StoreScope scope) {
  switch (scope) {
    case StoreScope::kProcess:
      return "this process";
    case StoreScope::kUser:
      return "this user on this host";
    case StoreScope::kHost:
      return "this host";
    case StoreScope::kFleet:
      return "every host that reaches the store";
  }
  return "this process";
}

Result<CheckReport> Store::Check(const CheckOptions& options) {
  LH_RETURN_IF_ERROR(Usable());
  if (options.probes < 1 || options.probes > kMaxProbes) {
    return Status::InvalidArgument(
        fmt::format("probes must be 1..{}, got {}", kMaxProbes, options.probes));
  }
  if (options.renewals < 1 || options.renewals > kMaxRenewals) {
    return Status::InvalidArgument(
        fmt::format("renewals must be 1..{}, got {}", kMaxRenewals, options.renewals));
  }
  Duration ttl = options.ttl.value_or(LeaseOptions{}.ttl);
  if (ttl <= Duration::zero()) {
    return Status::InvalidArgument(
        fmt::format("ttl must be positive, got {}", FormatDuration(ttl)));
  }
  std::string key = options.key.empty() ? ThrowawayKey() : options.key;
  LH_RETURN_IF_ERROR(ValidateKey(key));

  Backend& backend = *core_->backend;
  CheckReport report;
  report.store = core_->display_url;
  report.backend = std::string(backend.scheme());
  report.scope = backend.capabilities().scope;
  Checker checker(backend, core_->clock, report);

  auto diagnosis = backend.Diagnose();
  Diagnosis found = diagnosis.ok() ? *diagnosis : Diagnosis{.probe = "round trip"};
  report.probe = found.probe;
  report.ttl_granularity = found.ttl_granularity;
  bool reachable = true;
  if (!diagnosis.ok()) {
    reachable = checker.Fail("topology", "reading the store's settings", diagnosis.status(),
                             found.permissions_fix) ||
                VerdictOf(diagnosis.status()) != CheckVerdict::kUnreachable;
  }
  if (reachable) {
    reachable = checker.Probe(options.probes, found) ||
                report.items.back().verdict != CheckVerdict::kUnreachable;
  }
  if (reachable) {
    checker.Cycle(ttl, options.renewals, key, found.permissions_fix);
    // A step the store did not answer ends the check's calls: each more would cost a timeout.
    reachable = std::none_of(report.items.begin(), report.items.end(), [](const CheckItem& i) {
      return i.verdict == CheckVerdict::kUnreachable;
    });
    if (reachable)
      checker.ReadClock();
  }
  for (auto& item : found.items)
    report.items.push_back(std::move(item));
  if (reachable && report.round_trip.count + report.renew.count > 0) {
    Advise(options, found.shortest_ttl, report);
  }
  JudgeCpu(options, report);

  for (const auto& item : report.items)
    report.verdict = std::max(report.verdict, item.verdict);
  return report;
}

}  // namespace leasehold
