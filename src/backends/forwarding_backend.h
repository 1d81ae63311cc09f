// File: backends/forwarding_backend.h (internal)
//
// ForwardingBackend: a Backend that passes every call to another one. Decorators (the tests'
// FaultInjectionBackend, the benchmark's renewal counter) derive from it and override only what
// they change, so that a method added to Backend reaches the real store through all of them.
//
// Thread safety: as thread-safe as the backend it wraps.

#pragma once

#include <memory>
#include <utility>

#include "backends/backend.h"

namespace leasehold::internal {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::shared_ptr<Backend> inner) : inner_(std::move(inner)) {}

  std::string_view scheme() const override { return inner_->scheme(); }

  Capabilities capabilities() const override { return inner_->capabilities(); }

  const StoreClockWatch& store_clock() const override { return inner_->store_clock(); }

  Result<Grant> TryAcquire(const GrantRequest& request) override {
    return inner_->TryAcquire(request);
  }

  Status Renew(const RenewRequest& request) override { return inner_->Renew(request); }

  std::vector<Status> RenewMany(std::span<const RenewRequest> requests) override {
    return inner_->RenewMany(requests);
  }

  Status Release(std::string_view key, std::string_view owner_token) override {
    return inner_->Release(key, owner_token);
  }

  Status Finish(const FinishRequest& request) override { return inner_->Finish(request); }

  Result<std::optional<std::string>> ReadRecord(std::string_view key) override {
    return inner_->ReadRecord(key);
  }

  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(
      std::string_view prefix) override {
    return inner_->ListRecords(prefix);
  }

  Result<std::vector<std::int64_t>> FencedWrite(const FencedWriteRequest& request) override {
    return inner_->FencedWrite(request);
  }

  Result<StoreTime> WallClock() override { return inner_->WallClock(); }

  Status Ping() override { return inner_->Ping(); }

  Result<Diagnosis> Diagnose() override { return inner_->Diagnose(); }

  Result<std::optional<LeaseInfo>> Inspect(std::string_view key) override {
    return inner_->Inspect(key);
  }

  Result<std::vector<LeaseInfo>> List(std::string_view prefix) override {
    return inner_->List(prefix);
  }

  Result<std::vector<LeaseInfo>> Holders(std::string_view key) override {
    return inner_->Holders(key);
  }

  [[nodiscard]] int HolderLivenessFd() const override { return inner_->HolderLivenessFd(); }

  [[nodiscard]] std::string DataKeyPrefix(std::string_view key) const override {
    return inner_->DataKeyPrefix(key);
  }

  Result<bool> ForceRelease(std::string_view key) override { return inner_->ForceRelease(key); }

  Result<bool> ForceReleaseGrant(std::string_view key, std::string_view token_prefix) override {
    return inner_->ForceReleaseGrant(key, token_prefix);
  }

  void AbandonWait(std::string_view key, std::string_view waiter_id) override {
    inner_->AbandonWait(key, waiter_id);
  }

  Status WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) override {
    return inner_->WaitForChange(key, deadline, std::move(stop));
  }

  Status WaitForTurn(std::string_view key, std::string_view waiter_id, SteadyTime deadline,
                     std::stop_token stop) override {
    return inner_->WaitForTurn(key, waiter_id, deadline, std::move(stop));
  }

 protected:
  Backend& inner() const { return *inner_; }

 private:
  const std::shared_ptr<Backend> inner_;
};

}  // namespace leasehold::internal
