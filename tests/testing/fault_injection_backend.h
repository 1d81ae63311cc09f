// File: tests/testing/fault_injection_backend.h
//
// FaultInjectionBackend: a Backend decorator in the mould of leveldb's ErrorEnv/SpecialEnv and
// Arrow's SlowFileSystem. It forwards every call to a real backend, and on request fails the
// next renewals with a given code, holds renewals until the test lets them go (a renew "in
// flight" for as long as the test likes), and counts calls.
//
// Thread safety: thread-safe.

#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "backends/forwarding_backend.h"

namespace leasehold::testing {

class FaultInjectionBackend final : public internal::ForwardingBackend {
 public:
  explicit FaultInjectionBackend(std::shared_ptr<internal::Backend> inner)
      : ForwardingBackend(std::move(inner)) {}

  // The next `n` renewals fail with `code` without reaching the store (n < 0: all of them).
  void FailRenewals(StatusCode code, int n) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_code_ = code;
    fail_left_ = n;
  }

  // Renewals block (after reaching the store, before the reply returns) until Unblock().
  void BlockRenewals() {
    std::lock_guard<std::mutex> lock(mu_);
    blocked_ = true;
  }

  void UnblockRenewals() {
    std::lock_guard<std::mutex> lock(mu_);
    blocked_ = false;
    cv_.notify_all();
  }

  // Waits (real time) until a renewal is blocked inside the backend.
  bool WaitForBlockedRenewal(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return in_flight_ > 0; });
  }

  int renew_calls() const { return renew_calls_.load(); }

  int renew_many_calls() const { return renew_many_calls_.load(); }

  std::vector<Status> RenewMany(std::span<const internal::RenewRequest> requests) override {
    ++renew_many_calls_;
    renew_calls_ += static_cast<int>(requests.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (fail_left_ != 0) {
        if (fail_left_ > 0) {
          --fail_left_;
        }
        return std::vector<Status>(requests.size(), Status(fail_code_, "injected renewal failure"));
      }
    }
    std::vector<Status> results = inner().RenewMany(requests);
    std::unique_lock<std::mutex> lock(mu_);
    ++in_flight_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return !blocked_; });
    --in_flight_;
    return results;
  }

 private:
  std::atomic<int> renew_calls_{0};
  std::atomic<int> renew_many_calls_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  StatusCode fail_code_ = StatusCode::kUnavailable;
  int fail_left_ = 0;
  bool blocked_ = false;
  int in_flight_ = 0;
};

}  // namespace leasehold::testing
