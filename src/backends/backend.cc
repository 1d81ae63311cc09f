#include "backends/backend.h"

#include <utility>

namespace leasehold::internal {

std::vector<Status> Backend::RenewMany(std::span<const RenewRequest> requests) {
  std::vector<Status> results;
  results.reserve(requests.size());
  for (const RenewRequest& request : requests) {
    results.push_back(Renew(request));
  }
  return results;
}

void Backend::AbandonWait(std::string_view /*key*/, std::string_view /*waiter_id*/) {}

Status Backend::WaitForChange(std::string_view /*key*/, SteadyTime /*deadline*/,
                              std::stop_token /*stop*/) {
  return Status::Unimplemented("this store has no change notification; poll instead");
}

Status Backend::WaitForTurn(std::string_view key, std::string_view /*waiter_id*/,
                            SteadyTime deadline, std::stop_token stop) {
  return WaitForChange(key, deadline, std::move(stop));
}

}  // namespace leasehold::internal
