#include "backends/backend.h"

#include <utility>

#include <fmt/format.h>

#include "core/duration.h"
#include "core/logging.h"
#include "metrics/registry.h"

namespace leasehold::internal {

std::vector<Status> Backend::RenewMany(std::span<const RenewRequest> requests) {
  std::vector<Status> results;
  results.reserve(requests.size());
  for (const RenewRequest& request : requests) {
    results.push_back(Renew(request));
  }
  return results;
}

Status CheckFinishRequest(const FinishRequest& request) {
  if (request.keep < Duration::zero() || request.keep > kMaxFinishDuration) {
    return Status::InvalidArgument(
        fmt::format("lease {}: the time to keep a grant must be between 0 and {}, got {}",
                    request.key, FormatDuration(kMaxFinishDuration), FormatDuration(request.keep)));
  }
  if (request.record.has_value()) {
    if (request.record->size() > kMaxRecordBytes) {
      return Status::InvalidArgument(fmt::format("lease {}: a record is at most {} bytes, got {}",
                                                 request.key, kMaxRecordBytes,
                                                 request.record->size()));
    }
    if (request.record_ttl <= Duration::zero() || request.record_ttl > kMaxFinishDuration) {
      return Status::InvalidArgument(fmt::format(
          "lease {}: a record's TTL must be positive and at most {}, got {}", request.key,
          FormatDuration(kMaxFinishDuration), FormatDuration(request.record_ttl)));
    }
  }
  return Status::Ok();
}

Status Backend::Finish(const FinishRequest& request) {
  LH_RETURN_IF_ERROR(CheckFinishRequest(request));
  if (request.keep == Duration::zero() && !request.record.has_value()) {
    return Release(request.key, request.owner_token);
  }
  return Status::Unimplemented(
      fmt::format("the {} store cannot keep a grant or a record after its holder", scheme()));
}

Result<std::optional<std::string>> Backend::ReadRecord(std::string_view /*key*/) {
  return Status::Unimplemented(fmt::format("the {} store keeps no records", scheme()));
}

Result<std::vector<std::pair<std::string, std::string>>> Backend::ListRecords(
    std::string_view /*prefix*/) {
  return Status::Unimplemented(fmt::format("the {} store cannot list records", scheme()));
}

Status FencedOut(std::string_view key, FencingToken token, std::string_view why) {
  return Status::Lost(fmt::format("fenced out: lease {} (fencing token {}) {}", key, token, why));
}

namespace {

std::string DescribeKind(LeaseMode mode, std::uint32_t limit) {
  if (mode == LeaseMode::kShared) {
    return "a shared lease";
  }
  if (limit > 1) {
    return fmt::format("a semaphore of limit {}", limit);
  }
  return "an exclusive lease";
}

}  // namespace

void TakeKeptMark(LeaseInfo& info) {
  if (info.token_prefix.ends_with(kKeptTokenSuffix)) {
    info.token_prefix.resize(info.token_prefix.size() - kKeptTokenSuffix.size());
    info.kept = true;
  }
}

Status LimitMismatch(std::string_view key, LeaseMode held_mode, std::uint32_t held_limit,
                     std::string_view holder, LeaseMode asked_mode, std::uint32_t asked_limit) {
  return Status::InvalidArgument(fmt::format(
      "lease {} is held as {}{}{}; this acquire asked for {}: every holder of a key must ask "
      "for the same kind and limit",
      key, DescribeKind(held_mode, held_limit), holder.empty() ? "" : " by ", holder,
      DescribeKind(asked_mode, asked_limit)));
}

std::optional<LeaseInfo> FirstGrant(std::vector<LeaseInfo> holders) {
  if (holders.empty() || holders.front().waiting_writer) {
    return std::nullopt;
  }
  return std::move(holders.front());
}

Result<std::vector<LeaseInfo>> Backend::Holders(std::string_view key) {
  LH_ASSIGN_OR_RETURN(std::optional<LeaseInfo> info, Inspect(key));
  std::vector<LeaseInfo> out;
  if (info.has_value()) {
    out.push_back(std::move(*info));
  }
  return out;
}

Result<bool> Backend::ForceReleaseGrant(std::string_view /*key*/,
                                        std::string_view /*token_prefix*/) {
  return Status::Unimplemented(
      fmt::format("the {} store cannot force-release one grant of a key", scheme()));
}

std::string Backend::DataKeyPrefix(std::string_view /*key*/) const {
  return {};
}

Result<std::vector<std::int64_t>> Backend::FencedWrite(const FencedWriteRequest& /*request*/) {
  return Status::Unimplemented(
      fmt::format("the {} store cannot write data under a lease", scheme()));
}

Result<StoreTime> Backend::WallClock() {
  return StoreTime{.time = std::chrono::system_clock::now(), .from_store = false};
}

Status Backend::Ping() {
  return Status::Unimplemented("this store has no round-trip probe");
}

Result<Diagnosis> Backend::Diagnose() {
  return Diagnosis{.probe = "round trip"};
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

void Backend::ObserveStoreTime(const StoreTimeReading& reading) {
  std::optional<StoreClockStep> step = store_clock_.Observe(reading);
  if (!step.has_value()) {
    return;
  }
  if (LeaseMetrics* m = metrics_.load(std::memory_order_acquire); m != nullptr) {
    m->store_clock_jumps.Add();
  }
  LogEvent(LogLevel::kWarning, "store_clock_jump",
           {{"backend", scheme()},
            {"direction", step->step > Duration::zero() ? "forward" : "backward"},
            {"step_seconds", LogSeconds(step->step), true},
            {"store_elapsed_seconds", LogSeconds(step->store_elapsed), true},
            {"local_elapsed_min_seconds", LogSeconds(step->local_min), true},
            {"local_elapsed_max_seconds", LogSeconds(step->local_max), true}});
}

void Backend::CountStoreFailover() {
  if (LeaseMetrics* m = metrics_.load(std::memory_order_acquire); m != nullptr) {
    m->store_failovers.Add();
  }
}

}  // namespace leasehold::internal
