#include "heartbeat/heartbeat.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/duration.h"
#include "core/logging.h"

namespace leasehold::internal {

Heartbeat::Heartbeat(std::shared_ptr<Backend> backend, Clock& clock, LeaseMetrics* metrics)
    : backend_(std::move(backend)),
      clock_(clock),
      metrics_(metrics),
      clock_steps_seen_(backend_->store_clock().steps()) {}

Heartbeat::~Heartbeat() {
  std::jthread renewer;
  std::jthread watchdog;
  {
    MutexLock lock(&mu_);
    shutdown_ = true;
    renew_wake_.request_stop();
    watchdog_wake_.request_stop();
    renewer = std::move(renewer_);
    watchdog = std::move(watchdog_);
  }
  // jthread destructors join, outside the lock.
}

void Heartbeat::Add(std::shared_ptr<LeaseCore> lease) {
  MutexLock lock(&mu_);
  // A loop that is asleep wakes early only if this lease needs it before its planned time; one
  // that is scanning (planned == min) is always told, since its scan may predate this lease.
  // The loops read their stop token under mu_ before publishing the planned time, so a request
  // made here after that is seen by the sleep that follows: no wake-up is lost.
  if (lease->NextRenewDue() < renew_planned_) {
    renew_wake_.request_stop();
    ++early_wakes_;
  }
  if (lease->NextCheck() < watchdog_planned_) {
    watchdog_wake_.request_stop();
    ++early_wakes_;
  }
  leases_.push_back(std::move(lease));
  if (!renewer_.joinable()) {
    renewer_ = std::jthread([this] { RenewLoop(); });
    watchdog_ = std::jthread([this] { WatchdogLoop(); });
  }
}

void Heartbeat::Remove(const LeaseCore* lease) {
  MutexLock lock(&mu_);
  std::erase_if(leases_, [&](const auto& l) { return l.get() == lease; });
}

void Heartbeat::Replan() {
  MutexLock lock(&mu_);
  renew_wake_.request_stop();
  watchdog_wake_.request_stop();
}

std::size_t Heartbeat::size() {
  MutexLock lock(&mu_);
  return leases_.size();
}

std::uint64_t Heartbeat::rounds() {
  MutexLock lock(&mu_);
  return rounds_;
}

std::uint64_t Heartbeat::early_wakes() {
  MutexLock lock(&mu_);
  return early_wakes_;
}

std::uint64_t Heartbeat::headroom_warnings() {
  MutexLock lock(&mu_);
  return headroom_warnings_;
}

HeldLeaseGauges Heartbeat::CollectGauges() {
  std::vector<std::shared_ptr<LeaseCore>> leases;
  std::optional<Duration> p99;
  {
    MutexLock lock(&mu_);
    leases = leases_;
    p99 = latencies_.P99();
  }
  HeldLeaseGauges out;
  const SteadyTime now = clock_.Now();
  for (const auto& lease : leases) {
    if (!lease->Active()) {
      continue;
    }
    const auto kind = static_cast<std::size_t>(KindOf(lease->mode(), lease->limit()));
    ++out.held[kind];
    const Duration left = lease->safe_until() - now;
    std::optional<Duration>& margin = out.min_safe_remaining[kind];
    margin = margin.has_value() ? std::min(*margin, left) : left;
    if (p99.has_value() && *p99 > Duration::zero()) {
      const double ratio =
          static_cast<double>(lease->ttl().count()) / static_cast<double>(p99->count());
      out.min_ttl_headroom =
          out.min_ttl_headroom.has_value() ? std::min(*out.min_ttl_headroom, ratio) : ratio;
    }
  }
  return out;
}

void Heartbeat::PruneLocked() {
  std::erase_if(leases_, [](const auto& l) { return !l->Active(); });
}

void Heartbeat::RenewLoop() {
  while (true) {
    std::vector<std::shared_ptr<LeaseCore>> batch;
    SteadyTime next_wake = SteadyTime::max();
    std::stop_token wake;
    {
      MutexLock lock(&mu_);
      if (shutdown_) {
        return;
      }
      if (renew_wake_.stop_requested()) {
        renew_wake_ = std::stop_source();
      }
      wake = renew_wake_.get_token();
      renew_planned_ = SteadyTime::min();
      PruneLocked();
      SteadyTime now = clock_.Now();
      // A lease joins the batch if it is due now or within half its renew interval. Renewing
      // early is always safe (safe_until only grows), and half an interval makes any two groups
      // of leases merge: whichever of them is due first, the other is due within half an
      // interval before or after it, so after one interval every lease shares one round trip.
      for (const auto& lease : leases_) {
        SteadyTime due = lease->NextRenewDue();
        if (due <= now + lease->BatchSlack()) {
          batch.push_back(lease);
        } else {
          next_wake = std::min(next_wake, due);
        }
      }
      // Every lease added from here on is judged against this plan (a round first: min).
      renew_planned_ = batch.empty() ? next_wake : SteadyTime::min();
    }
    if (batch.empty()) {
      clock_.SleepUntil(next_wake, wake);
      continue;
    }
    std::vector<RenewRequest> requests;
    requests.reserve(batch.size());
    for (const auto& lease : batch) {
      requests.push_back({lease->key(), lease->owner_token(), lease->ttl()});
    }
    // Read t_send before sending: replies can be arbitrarily late.
    SteadyTime t_send = clock_.Now();
    std::vector<Status> results = backend_->RenewMany(requests);
    const Duration latency = clock_.Now() - t_send;
    results.resize(batch.size(), Status::Internal("backend returned too few renew results"));
    // A forward step of the store's clock: a refused renewal says so, and every lease not
    // confirmed in this round may end early (after the results: a confirmation stands).
    const std::optional<ClockStep> step = NewStoreClockStep();
    if (step.has_value()) {
      for (Status& result : results) {
        if (result.code() == StatusCode::kLost) {
          result = Status::Lost(fmt::format("{}: {}", result.message(), step->why),
                                result.lost_cause().value_or(LostCause::kStoreSaidNo));
        }
      }
    }
    if (metrics_ != nullptr) {
      metrics_->heartbeat_latency.Observe(latency);
    }
    {
      MutexLock lock(&mu_);
      ++rounds_;
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const Status& result = results[i];
      if (metrics_ != nullptr && !result.ok()) {
        metrics_->RecordRenewFailure(KindOf(batch[i]->mode(), batch[i]->limit()),
                                     RenewFailureOf(result.code()));
      }
      batch[i]->OnRenewResult(t_send, result);
    }
    if (step.has_value()) {
      std::vector<std::shared_ptr<LeaseCore>> leases;
      {
        MutexLock lock(&mu_);
        leases = leases_;
      }
      for (const auto& lease : leases) {
        lease->OnStoreClockStep(t_send, step->step, step->why);
      }
    }
    // A renewal can move a lease's next check earlier than the watchdog planned for (at risk
    // back to held: the overdue point comes before the old safe_until): re-plan it then.
    SteadyTime earliest_check = SteadyTime::max();
    for (const auto& lease : batch) {
      earliest_check = std::min(earliest_check, lease->NextCheck());
    }
    {
      MutexLock lock(&mu_);
      if (earliest_check < watchdog_planned_ || step.has_value()) {
        watchdog_wake_.request_stop();
      }
    }
    // Last: the results above are judged against the time they are handled at, so nothing that
    // may block (a log line) comes before them.
    Duration min_ttl = Duration::max();
    for (const auto& request : requests) {
      min_ttl = std::min(min_ttl, request.ttl);
    }
    JudgeHeadroom(latency, min_ttl);
  }
}

std::optional<Heartbeat::ClockStep> Heartbeat::NewStoreClockStep() {
  const StoreClockWatch& watch = backend_->store_clock();
  const std::uint64_t steps = watch.steps();
  if (steps == clock_steps_seen_) {
    return std::nullopt;
  }
  clock_steps_seen_ = steps;
  const std::optional<StoreClockStep> step = watch.last_step();
  if (!step.has_value() || step->step <= Duration::zero()) {
    return std::nullopt;  // backward: grants last longer than their renewals set
  }
  const std::string low = FormatDuration(RoundForDisplay(step->local_min));
  const std::string high = FormatDuration(RoundForDisplay(step->local_max));
  std::string why = fmt::format(
      "the store's clock jumped forward by {} (it counted {} between two renewals {} apart; "
      "store_clock_jump)",
      FormatDuration(RoundForDisplay(step->step)),
      FormatDuration(RoundForDisplay(step->store_elapsed)),
      low == high ? low : fmt::format("{} to {}", low, high));
  return ClockStep{step->step, std::move(why)};
}

void Heartbeat::JudgeHeadroom(Duration latency, Duration min_ttl) {
  std::optional<Duration> p99;
  std::size_t samples = 0;
  {
    MutexLock lock(&mu_);
    latencies_.Add(latency);
    p99 = latencies_.P99();
    samples = latencies_.count();
    if (!p99.has_value() || *p99 * kTtlToP99 <= min_ttl) {
      return;
    }
    const SteadyTime now = clock_.Now();
    if (last_headroom_warning_.has_value() && now - *last_headroom_warning_ < kHeadroomWarnEvery) {
      return;
    }
    last_headroom_warning_ = now;
    ++headroom_warnings_;
  }
  if (metrics_ != nullptr) {
    metrics_->ttl_headroom_warnings.Add();
  }
  if (LogEnabled(LogLevel::kWarning)) {
    // A TTL that meets the rule, in whole 100 ms (whole seconds from 10 s).
    const Duration step = *p99 * kTtlToP99 < std::chrono::seconds(10)
                              ? Duration(std::chrono::milliseconds(100))
                              : Duration(std::chrono::seconds(1));
    const Duration wanted = *p99 * kTtlToP99;
    const Duration advice = step * ((wanted.count() + step.count() - 1) / step.count());
    const std::string p99_text = LogSeconds(*p99);
    const std::string ttl_text = LogSeconds(min_ttl);
    const std::string samples_text = std::to_string(samples);
    const std::string advice_text = FormatDuration(advice);
    LogEvent(LogLevel::kWarning, "ttl_headroom_low",
             {{"backend", backend_->scheme()},
              {"heartbeat_p99_seconds", p99_text, true},
              {"ttl_seconds", ttl_text, true},
              {"renewals", samples_text, true},
              {"recommended_ttl", advice_text},
              {"reason",
               "the heartbeat's p99 round trip exceeds a tenth of the TTL: a few slow "
               "renewals in a row would lose the lease (leasehold check measures the "
               "store)"}});
  }
}

void Heartbeat::WatchdogLoop() {
  while (true) {
    SteadyTime earliest = SteadyTime::max();
    std::vector<std::shared_ptr<LeaseCore>> leases;
    std::stop_token wake;
    {
      MutexLock lock(&mu_);
      if (shutdown_) {
        return;
      }
      if (watchdog_wake_.stop_requested()) {
        watchdog_wake_ = std::stop_source();
      }
      wake = watchdog_wake_.get_token();
      watchdog_planned_ = SteadyTime::min();
      leases = leases_;
    }
    for (const auto& lease : leases) {
      if (!lease->CheckExpiry()) {
        earliest = std::min(earliest, lease->NextCheck());
      }
    }
    {
      MutexLock lock(&mu_);
      if (earliest == SteadyTime::max() && !leases.empty()) {
        // Every lease we saw is inactive: drop them; re-check soon after a change.
        PruneLocked();
      }
      // A lease added during the scan above already requested `wake` (planned was min); from
      // here on Add compares with the plan.
      watchdog_planned_ = earliest;
    }
    leases.clear();
    clock_.SleepUntil(earliest, wake);
  }
}

}  // namespace leasehold::internal
