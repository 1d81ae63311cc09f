#include "core/lease_core.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "core/duration.h"
#include "core/logging.h"
#include "core/owner_token.h"

namespace leasehold::internal {

LeaseCore::LeaseCore(Clock& clock, LeaseParams params)
    : clock_(clock),
      params_(std::move(params)),
      // The rule itself: the grant was created no earlier than t_send, so the store keeps it at
      // least until t_send + ttl; drift covers clock-rate differences.
      safe_until_(params_.t_send + params_.ttl - params_.drift),
      last_renew_send_(params_.t_send),
      retry_at_(SteadyTime::max()) {}

bool LeaseCore::Valid() {
  CheckExpiry();
  MutexLock lock(&mu_);
  return state_ != LeaseState::kLost && !released_;
}

LeaseState LeaseCore::state() {
  CheckExpiry();
  MutexLock lock(&mu_);
  return released_ ? LeaseState::kLost : state_;
}

SteadyTime LeaseCore::safe_until() {
  MutexLock lock(&mu_);
  return safe_until_;
}

Status LeaseCore::lost_reason() {
  MutexLock lock(&mu_);
  return lost_reason_;
}

bool LeaseCore::Active() {
  MutexLock lock(&mu_);
  return state_ != LeaseState::kLost && !released_;
}

SteadyTime LeaseCore::NextRenewDue() {
  MutexLock lock(&mu_);
  if (state_ == LeaseState::kLost || released_) {
    return SteadyTime::max();
  }
  if (failures_ > 0) {
    return retry_at_;
  }
  return last_renew_send_ + params_.renew_interval;
}

Duration LeaseCore::BatchSlack() {
  MutexLock lock(&mu_);
  return failures_ > 0 ? Duration::zero() : params_.renew_interval / 2;
}

void LeaseCore::OnRenewResult(SteadyTime t_send, const Status& result) {
  Transition t;
  {
    MutexLock lock(&mu_);
    if (state_ == LeaseState::kLost || released_) {
      return;  // lost is terminal; a late reply changes nothing
    }
    SteadyTime now = clock_.Now();
    if (now >= safe_until_) {
      // Whatever the reply says, the guarantee already lapsed: someone else may have been
      // granted the key in between. Never extend a lease past a gap.
      t = SetStateLocked(LeaseState::kLost,
                         Status::Lost(fmt::format("lease {} expired: no renewal confirmed before "
                                                  "safe_until",
                                                  params_.key),
                                      LostCause::kExpired));
    } else if (result.ok()) {
      const Duration since_confirmed = now - last_renew_send_;
      safe_until_ = std::max(safe_until_, t_send + params_.ttl - params_.drift);
      last_renew_send_ = std::max(last_renew_send_, t_send);
      failures_ = 0;
      retry_at_ = SteadyTime::max();
      t = SetStateLocked(LeaseState::kHeld, Status());
      t.renewed_until = safe_until_;
      // Due one renew interval after the last confirmation; more than half an interval past
      // that, the margin to safe_until is visibly shrinking: say so before it becomes a risk.
      if (!t.changed && since_confirmed > params_.renew_interval + params_.renew_interval / 2) {
        t.renewed_late = true;
        t.since_confirmed = since_confirmed;
        t.safe_remaining = safe_until_ - now;
      }
    } else if (result.code() == StatusCode::kLost) {
      t = SetStateLocked(LeaseState::kLost, result);
    } else {
      // Transient: retry with doubling delays (1/8, 1/4, 1/2 of the renew interval) but never
      // later than safe_until, where the watchdog declares the lease lost anyway.
      ++failures_;
      Duration base = std::max<Duration>(params_.renew_interval / 8, std::chrono::milliseconds(1));
      Duration delay =
          std::min<Duration>(base * (1 << std::min(failures_ - 1, 2)), params_.renew_interval / 2);
      retry_at_ = std::min(now + delay, safe_until_);
      t = SetStateLocked(LeaseState::kAtRisk,
                         result.WithContext(fmt::format("renewing lease {}", params_.key)));
    }
    t.latency = now - t_send;
  }
  Announce(t);
}

bool LeaseCore::CheckExpiry() {
  Transition t;
  {
    MutexLock lock(&mu_);
    if (state_ == LeaseState::kLost || released_) {
      return true;
    }
    SteadyTime now = clock_.Now();
    if (now < safe_until_) {
      if (state_ != LeaseState::kHeld || now < OverdueAtLocked()) {
        return false;
      }
      t = SetStateLocked(LeaseState::kAtRisk,
                         Status::Unavailable(fmt::format(
                             "renewal of lease {} overdue: none confirmed for {}", params_.key,
                             FormatDuration(RoundForDisplay(now - last_renew_send_)))));
    } else {
      t = SetStateLocked(
          LeaseState::kLost,
          Status::Lost(
              fmt::format("lease {} expired: no renewal confirmed before safe_until", params_.key),
              LostCause::kExpired));
    }
  }
  Announce(t);
  return t.lost;
}

SteadyTime LeaseCore::NextCheck() {
  MutexLock lock(&mu_);
  if (state_ == LeaseState::kLost || released_) {
    return SteadyTime::max();
  }
  return state_ == LeaseState::kHeld ? std::min(safe_until_, OverdueAtLocked()) : safe_until_;
}

SteadyTime LeaseCore::OverdueAtLocked() {
  // A healthy renewal is sent one interval after the last confirmed one and answered well
  // within the next: two intervals without a confirmation means it is stuck.
  return last_renew_send_ + 2 * params_.renew_interval;
}

void LeaseCore::MarkLost(Status reason) {
  Transition t;
  {
    MutexLock lock(&mu_);
    if (state_ == LeaseState::kLost || released_) {
      return;
    }
    t = SetStateLocked(LeaseState::kLost, std::move(reason));
  }
  Announce(t);
}

void LeaseCore::OnStoreClockStep(SteadyTime t_send, Duration step, const std::string& why) {
  Transition t;
  {
    MutexLock lock(&mu_);
    if (state_ == LeaseState::kLost || released_ || last_renew_send_ >= t_send) {
      return;
    }
    safe_until_ -= step;
    const SteadyTime now = clock_.Now();
    if (now >= safe_until_) {
      t = SetStateLocked(
          LeaseState::kLost,
          Status::Lost(fmt::format("lease {} may have ended early: {}", params_.key, why),
                       LostCause::kExpired));
    } else {
      ++failures_;
      retry_at_ = now;
      t = SetStateLocked(LeaseState::kAtRisk,
                         Status::Unavailable(fmt::format(
                             "lease {} may end early: {}; renewing at once", params_.key, why)));
    }
  }
  Announce(t);
}

Status LeaseCore::BeginRelease() {
  {
    MutexLock lock(&mu_);
    if (released_) {
      return Status();
    }
    released_ = true;
    if (state_ == LeaseState::kLost) {
      return Status::Lost(fmt::format("lease {} was lost or stolen before release: {}", params_.key,
                                      lost_reason_.message()));
    }
    if (clock_.Now() >= safe_until_) {
      state_ = LeaseState::kLost;
      lost_reason_ = Status::Lost(
          fmt::format("lease {} expired before release: no renewal confirmed before safe_until",
                      params_.key),
          LostCause::kExpired);
      if (params_.metrics != nullptr) {
        params_.metrics->RecordLost(KindOf(params_.mode, params_.limit), LostCause::kExpired);
      }
      // Fall through to the stop signal below; the caller still deletes the grant if ours.
      lost_source_.request_stop();
      return lost_reason_;
    }
  }
  // Work bound to the lease stops here too: after release the holder is no longer the owner.
  lost_source_.request_stop();
  return Status();
}

LeaseCore::Transition LeaseCore::SetStateLocked(LeaseState next, Status reason) {
  Transition t;
  if (state_ == next) {
    return t;
  }
  state_ = next;
  t.changed = true;
  t.state = next;
  t.lost = next == LeaseState::kLost;
  if (t.lost) {
    lost_reason_ = reason;
    if (params_.metrics != nullptr) {
      params_.metrics->RecordLost(KindOf(params_.mode, params_.limit),
                                  reason.lost_cause().value_or(LostCause::kStoreSaidNo));
    }
  }
  t.reason = std::move(reason);
  return t;
}

void LeaseCore::Announce(const Transition& t) {
  if (t.renewed_until.has_value() && params_.on_renewed) {
    params_.on_renewed(*t.renewed_until);
  }
  if (!t.changed && !t.renewed_late) {
    return;
  }
  const std::string fencing = std::to_string(params_.fencing_token);
  const std::string token = TokenPrefix(params_.owner_token);
  const std::string latency = t.latency.has_value() ? LogSeconds(*t.latency) : std::string();
  const LogField key_field{"key", params_.key};
  const LogField fencing_field{"fencing_token", fencing, true};
  const LogField token_field{"token", token};
  const LogField backend_field{"backend", params_.backend_name};
  if (!t.changed) {
    if (LogEnabled(LogLevel::kInfo)) {
      const std::string since = LogSeconds(t.since_confirmed);
      const std::string left = LogSeconds(t.safe_remaining);
      LogEvent(LogLevel::kInfo, "renewed_late",
               {key_field,
                fencing_field,
                token_field,
                backend_field,
                {"latency_seconds", latency, true},
                {"since_confirmed_seconds", since, true},
                {"safe_remaining_seconds", left, true}});
    }
    return;
  }
  if (t.lost) {
    const std::string_view cause =
        LostCauseName(t.reason.lost_cause().value_or(LostCause::kStoreSaidNo));
    if (LogEnabled(LogLevel::kWarning)) {
      if (t.latency.has_value()) {
        LogEvent(LogLevel::kWarning, "lost",
                 {key_field,
                  fencing_field,
                  token_field,
                  backend_field,
                  {"cause", cause},
                  {"latency_seconds", latency, true},
                  {"reason", t.reason.message()}});
      } else {
        LogEvent(LogLevel::kWarning, "lost",
                 {key_field,
                  fencing_field,
                  token_field,
                  backend_field,
                  {"cause", cause},
                  {"reason", t.reason.message()}});
      }
    }
    lost_source_.request_stop();
    if (params_.on_lost) {
      params_.on_lost(t.reason);
    }
  } else if (t.state == LeaseState::kAtRisk) {
    if (LogEnabled(LogLevel::kWarning)) {
      const std::string reason = t.reason.ToString();
      if (t.latency.has_value()) {
        LogEvent(LogLevel::kWarning, "at_risk",
                 {key_field,
                  fencing_field,
                  token_field,
                  backend_field,
                  {"latency_seconds", latency, true},
                  {"reason", reason}});
      } else {
        LogEvent(LogLevel::kWarning, "at_risk",
                 {key_field, fencing_field, token_field, backend_field, {"reason", reason}});
      }
    }
  } else {
    LogEvent(
        LogLevel::kInfo, "recovered",
        {key_field, fencing_field, token_field, backend_field, {"latency_seconds", latency, true}});
  }
  if (params_.on_state_change) {
    params_.on_state_change(t.state, t.reason);
  }
}

}  // namespace leasehold::internal
