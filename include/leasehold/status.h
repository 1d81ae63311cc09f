// File: leasehold/status.h
//
// Status and Result<T>: how every leasehold call reports success or failure. No public
// leasehold function throws; contention, loss and an unreachable store are ordinary outcomes,
// reported as values.
//
// Example:
//
//   leasehold::Result<leasehold::Lease> lease = store->TryAcquire("job:invoices");
//   if (lease.status().code() == leasehold::StatusCode::kHeldByAnother) {
//     const leasehold::LeaseInfo* holder = lease.status().holder();  // may be null
//     ...
//   }
//   LH_RETURN_IF_ERROR(lease.status());
//
// Thread safety: const methods are safe to call concurrently; non-const methods need external
// synchronization (the usual value-type rule).

#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "leasehold/lease_info.h"

namespace leasehold {

// StatusCode is closed: every code maps to one CLI exit code (see the README) and one metric
// label. Retry advice follows abseil's rule: kUnavailable retries the call, kHeldByAnother waits,
// everything else needs a change of state or input first.
enum class StatusCode : int {
  kOk = 0,
  // Bad input: empty or oversized key, TTL <= 0, renew interval >= TTL, unknown URL scheme, a
  // file that is not a leasehold database. Do not retry.
  kInvalidArgument = 1,
  // Another owner holds a live grant. Status::holder() says who, where the store keeps it. Wait
  // (Store::Acquire) or retry later.
  kHeldByAnother = 2,
  // The grant expired, was force-released or was taken over: ownership cannot be guaranteed.
  // Terminal for the lease: acquire anew, never retry the call.
  kLost = 3,
  // The store could not be reached or did not answer in time. Retry the call with backoff.
  kUnavailable = 4,
  // A wait ran out before the lease became free.
  kDeadlineExceeded = 5,
  // The caller cancelled the wait through its std::stop_token.
  kCancelled = 6,
  // The store refused the credentials, or the file system refused access.
  kPermissionDenied = 7,
  // The backend was not built in, or the operation is not supported by it.
  kUnimplemented = 8,
  // A bug in leasehold or an unexpected reply from the store.
  kInternal = 9,
  // The store is set up so that it would not keep a lease safe (e.g. Redis with an eviction
  // policy that can drop a lease): the message names the setting and the fix. Do not retry until
  // the store's settings change. Status::detail() is the URL parameter that accepts the risk
  // where there is one (e.g. "accept_eviction=true"), which `leasehold check` uses to diagnose
  // such a store. Also: a Store used in a fork() child of the process that opened it.
  kFailedPrecondition = 10,
};

// Returns the code's name without the leading 'k', e.g. "HeldByAnother".
std::string_view StatusCodeName(StatusCode code);

// Why a lease was lost (kLost statuses only). Also the `reason` label of the metric
// leasehold_lease_lost_total (leasehold/metrics.h).
enum class LostCause : std::uint8_t {
  // No renewal was confirmed before safe_until (the store may not even have answered).
  kExpired,
  // The store answered that the grant is not ours: it expired there, was force-released, or is
  // gone for a reason the store does not tell.
  kStoreSaidNo,
  // The store saw another owner's grant in place of ours: the key was taken over.
  kStolen,
  // The store session that kept the grant ended (PostgreSQL advisory locks, ZooKeeper, etcd).
  kSessionLost,
};

// Returns "expired", "store_said_no", "stolen" or "session_lost".
std::string_view LostCauseName(LostCause cause);

class [[nodiscard]] Status {
 public:
  // Creates an OK status. An OK status allocates nothing.
  Status() noexcept = default;
  Status(StatusCode code, std::string message, std::string detail = {});

  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;
  ~Status() = default;

  static Status Ok() { return Status(); }

  static Status InvalidArgument(std::string message) {
    return {StatusCode::kInvalidArgument, std::move(message)};
  }

  static Status HeldByAnother(std::string message, std::optional<LeaseInfo> holder = {});
  // kHeldByAnother with the message every store uses: "job:x is held by web-3:4242 (fencing
  // token 7, 2.5s left)", then "; " and `detail` if not empty (e.g. the state of a fair queue).
  // The time left is left out when holder.remaining is zero, and said as "at most 10s left" if
  // `remaining_is_upper_bound` (a store that knows only the grant's TTL, not its age).
  static Status HeldByAnother(const LeaseInfo& holder, std::string_view detail = {},
                              bool remaining_is_upper_bound = false);

  // A kLost status. Backends say kStolen or kSessionLost when they know; the core says kExpired.
  static Status Lost(std::string message, LostCause cause = LostCause::kStoreSaidNo);

  static Status Unavailable(std::string message, std::string detail = {}) {
    return {StatusCode::kUnavailable, std::move(message), std::move(detail)};
  }

  static Status DeadlineExceeded(std::string message) {
    return {StatusCode::kDeadlineExceeded, std::move(message)};
  }

  static Status Cancelled(std::string message) {
    return {StatusCode::kCancelled, std::move(message)};
  }

  static Status PermissionDenied(std::string message, std::string detail = {}) {
    return {StatusCode::kPermissionDenied, std::move(message), std::move(detail)};
  }

  static Status Unimplemented(std::string message) {
    return {StatusCode::kUnimplemented, std::move(message)};
  }

  static Status FailedPrecondition(std::string message, std::string detail = {}) {
    return {StatusCode::kFailedPrecondition, std::move(message), std::move(detail)};
  }

  static Status Internal(std::string message, std::string detail = {}) {
    return {StatusCode::kInternal, std::move(message), std::move(detail)};
  }

  [[nodiscard]] bool ok() const { return state_ == nullptr; }

  [[nodiscard]] StatusCode code() const { return ok() ? StatusCode::kOk : state_->code; }

  // Returns the human-readable message; empty for OK.
  [[nodiscard]] std::string_view message() const;

  // Returns the store's own words for the failure (a SQLite error, a Redis reply...); may be
  // empty. Never contains a password or a full owner token.
  [[nodiscard]] std::string_view detail() const;

  // For kHeldByAnother: the current holder, when the store keeps its identity; else null.
  [[nodiscard]] const LeaseInfo* holder() const;

  // For kLost: why the lease was lost (kStoreSaidNo unless the store or core said more);
  // nullopt for every other code.
  [[nodiscard]] std::optional<LostCause> lost_cause() const;

  // Returns "HeldByAnother: job:x is held by host:42 (fencing token 7)" or "OK".
  [[nodiscard]] std::string ToString() const;

  // Returns a copy whose message is prefixed with `context` and ": ".
  [[nodiscard]] Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct State {
    StatusCode code;
    std::string message;
    std::string detail;
    std::optional<LeaseInfo> holder;
    LostCause lost_cause = LostCause::kStoreSaidNo;
  };

  std::unique_ptr<State> state_;
};

namespace internal_status {
[[noreturn]] void DieOnBadAccess(const Status& status);

// The shared OK status that Result<T>::status() refers to when it holds a value.
inline const Status& OkStatus() {
  static const Status ok;
  return ok;
}
}  // namespace internal_status

// Result<T> holds either a T or a non-OK Status, with the absl::StatusOr surface.
// Accessing value() of a failed Result is a bug and aborts the process with the status text.
template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::decay_t<T>, Status>, "Result<Status> is not allowed");

 public:
  // Implicit from a value or from an error status, so `return value;` and `return status;`
  // both work. Constructing from an OK status is a bug; it becomes kInternal.
  Result(T value) : v_(std::in_place_index<1>, std::move(value)) {}  // NOLINT

  Result(Status status) : v_(std::in_place_index<0>, std::move(status)) {  // NOLINT
    if (std::get<0>(v_).ok()) {
      v_.template emplace<0>(StatusCode::kInternal, "Result constructed from an OK status");
    }
  }

  [[nodiscard]] bool ok() const { return v_.index() == 1; }

  // Returns OK when a value is held. The reference lives as long as this Result, so
  // `result.status().holder()` is safe to read while `result` is alive.
  [[nodiscard]] const Status& status() const {
    return ok() ? internal_status::OkStatus() : std::get<0>(v_);
  }

  [[nodiscard]] const Status& error() const& { return std::get<0>(v_); }

  T& value() & {
    CheckOk();
    return std::get<1>(v_);
  }

  const T& value() const& {
    CheckOk();
    return std::get<1>(v_);
  }

  T&& value() && {
    CheckOk();
    return std::get<1>(std::move(v_));
  }

  template <typename U>
  T value_or(U&& fallback) const& {
    return ok() ? std::get<1>(v_) : static_cast<T>(std::forward<U>(fallback));
  }

  T& operator*() & { return value(); }

  const T& operator*() const& { return value(); }

  T&& operator*() && { return std::move(*this).value(); }

  T* operator->() { return &value(); }

  const T* operator->() const { return &value(); }

 private:
  void CheckOk() const {
    if (!ok()) {
      internal_status::DieOnBadAccess(std::get<0>(v_));
    }
  }

  std::variant<Status, T> v_;
};

}  // namespace leasehold

// Evaluates `expr` (a Status); returns it from the enclosing function unless it is OK.
// Expands to one statement (a do-while), safe as the body of an unbraced if.
#define LH_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::leasehold::Status lh_status_tmp_ = (expr); \
    if (!lh_status_tmp_.ok()) {                  \
      return lh_status_tmp_;                     \
    }                                            \
  } while (false)

#define LH_INTERNAL_CONCAT_(a, b) a##b
#define LH_INTERNAL_CONCAT(a, b) LH_INTERNAL_CONCAT_(a, b)

// Evaluates `rexpr` (a Result<T>); on error returns its status, else moves the value into
// `lhs`, which may be a declaration (`auto x`). Expands to several statements.
#define LH_ASSIGN_OR_RETURN(lhs, rexpr) \
  LH_INTERNAL_ASSIGN_OR_RETURN(LH_INTERNAL_CONCAT(lh_result_, __LINE__), lhs, rexpr)

#define LH_INTERNAL_ASSIGN_OR_RETURN(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                 \
  if (!tmp.ok()) {                                    \
    return tmp.error();                               \
  }                                                   \
  lhs = std::move(tmp).value()
