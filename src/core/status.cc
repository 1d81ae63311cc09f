#include "leasehold/status.h"

#include <cstdio>
#include <cstdlib>
#include <iterator>

#include <fmt/format.h>

#include "leasehold/options.h"

#include "core/duration.h"

namespace leasehold {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kHeldByAnother:
      return "HeldByAnother";
    case StatusCode::kLost:
      return "Lost";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kDeadlineExceeded:
      return "DeadlineExceeded";
    case StatusCode::kCancelled:
      return "Cancelled";
    case StatusCode::kPermissionDenied:
      return "PermissionDenied";
    case StatusCode::kUnimplemented:
      return "Unimplemented";
    case StatusCode::kInternal:
      return "Internal";
    case StatusCode::kFailedPrecondition:
      return "FailedPrecondition";
  }
  return "Unknown";
}

std::string_view LostCauseName(LostCause cause) {
  switch (cause) {
    case LostCause::kExpired:
      return "expired";
    case LostCause::kStoreSaidNo:
      return "store_said_no";
    case LostCause::kStolen:
      return "stolen";
    case LostCause::kSessionLost:
      return "session_lost";
  }
  return "unknown";
}

std::string_view LeaseKindName(LeaseMode mode, std::uint32_t limit) {
  if (mode == LeaseMode::kShared) {
    return "shared";
  }
  return limit > 1 ? "semaphore" : "exclusive";
}

std::string_view LeaseStateName(LeaseState state) {
  switch (state) {
    case LeaseState::kHeld:
      return "held";
    case LeaseState::kAtRisk:
      return "at risk";
    case LeaseState::kLost:
      return "lost";
  }
  return "unknown";
}

Status::Status(StatusCode code, std::string message, std::string detail) {
  if (code != StatusCode::kOk) {
    state_ = std::make_unique<State>(State{code, std::move(message), std::move(detail), {}});
  }
}

Status::Status(const Status& other)
    : state_(other.state_ ? std::make_unique<State>(*other.state_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) {
    state_ = other.state_ ? std::make_unique<State>(*other.state_) : nullptr;
  }
  return *this;
}

Status Status::HeldByAnother(std::string message, std::optional<LeaseInfo> holder) {
  Status s(StatusCode::kHeldByAnother, std::move(message));
  s.state_->holder = std::move(holder);
  return s;
}

Status Status::HeldByAnother(const LeaseInfo& holder, std::string_view detail,
                             bool remaining_is_upper_bound) {
  std::string message = fmt::format(
      "{} is held by {} (fencing token {}{})", holder.key,
      holder.holder.empty() ? "another owner" : holder.holder, holder.fencing_token,
      holder.remaining > std::chrono::milliseconds::zero()
          ? fmt::format(", {}{} left", remaining_is_upper_bound ? "at most " : "",
                        internal::FormatDuration(internal::RoundForDisplay(holder.remaining)))
          : std::string());
  if (!detail.empty()) {
    fmt::format_to(std::back_inserter(message), "; {}", detail);
  }
  return HeldByAnother(std::move(message), holder);
}

Status Status::Lost(std::string message, LostCause cause) {
  Status s(StatusCode::kLost, std::move(message));
  s.state_->lost_cause = cause;
  return s;
}

std::optional<LostCause> Status::lost_cause() const {
  if (code() != StatusCode::kLost) {
    return std::nullopt;
  }
  return state_->lost_cause;
}

std::string_view Status::message() const {
  return ok() ? std::string_view() : std::string_view(state_->message);
}

std::string_view Status::detail() const {
  return ok() ? std::string_view() : std::string_view(state_->detail);
}

const LeaseInfo* Status::holder() const {
  return ok() || !state_->holder ? nullptr : &*state_->holder;
}

std::string Status::ToString() const {
  if (ok()) {
    return "OK";
  }
  std::string out = fmt::format("{}: {}", StatusCodeName(state_->code), state_->message);
  if (!state_->detail.empty()) {
    out += fmt::format(" ({})", state_->detail);
  }
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) {
    return *this;
  }
  Status s(state_->code, fmt::format("{}: {}", context, state_->message), state_->detail);
  s.state_->holder = state_->holder;
  s.state_->lost_cause = state_->lost_cause;
  return s;
}

namespace internal_status {

void DieOnBadAccess(const Status& status) {
  std::fprintf(stderr, "leasehold: value() of a failed Result: %s\n", status.ToString().c_str());
  std::abort();
}

}  // namespace internal_status

}  // namespace leasehold
