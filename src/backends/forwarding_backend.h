// File: backends/forwarding_backend.h (internal)
//
// ForwardingBackend: a Backend that passes every call to another one. Decorators (the tests'
// FaultInjectionBackend, the benchmark's renewal counter) derive from it and override only what
// they change. It forwards the grant core and hands out the inner backend's facets, so a method
// added to the core must be added here (tests/backends/forwarding_backend_check.py fails the
// build's tests otherwise) and a method added to a facet reaches the real store through every
// decorator by itself. A decorator that changes a facet's behaviour overrides facets() and hands
// out its own.
//
// Thread safety: as thread-safe as the backend it wraps.

#pragma once

#include <memory>
#include <utility>

#include "backends/backend.h"

namespace leasehold::internal {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::shared_ptr<Backend> inner) : inner_(std::move(inner)) {
    ShareObservations(*inner_);
  }

  std::string_view scheme() const override { return inner_->scheme(); }

  Capabilities capabilities() const override { return inner_->capabilities(); }

  Facets facets() override { return inner_->facets(); }

  Result<Grant> TryAcquire(const GrantRequest& request) override {
    return inner_->TryAcquire(request);
  }

  std::vector<Status> RenewMany(std::span<const RenewRequest> requests) override {
    return inner_->RenewMany(requests);
  }

  Status Finish(const FinishRequest& request) override { return inner_->Finish(request); }

  Result<std::vector<LeaseInfo>> Holders(std::string_view key) override {
    return inner_->Holders(key);
  }

  Result<std::vector<LeaseInfo>> List(std::string_view prefix) override {
    return inner_->List(prefix);
  }

  Result<bool> ForceEnd(std::string_view key, std::string_view token_prefix) override {
    return inner_->ForceEnd(key, token_prefix);
  }

 protected:
  Backend& inner() const { return *inner_; }

 private:
  const std::shared_ptr<Backend> inner_;
};

}  // namespace leasehold::internal
