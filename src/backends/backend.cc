#include "backends/backend.h"

#include <utility>

#include <fmt/format.h>

#include "core/duration.h"
#include "core/logging.h"
#include "metrics/registry.h"

namespace leasehold::internal {

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
  for (LeaseInfo& info : holders) {
    if (!info.waiting_writer && !info.holder_gone) {
      return std::move(info);
    }
  }
  return std::nullopt;
}

// ---- The facets' defaults.

Status WaitFacet::WaitForTurn(std::string_view key, std::string_view /*waiter_id*/,
                              SteadyTime deadline, std::stop_token stop) {
  return WaitForChange(key, deadline, std::move(stop));
}

void WaitFacet::AbandonWait(std::string_view /*key*/, std::string_view /*waiter_id*/) {}

Result<StoreTime> RecordsFacet::WallClock() {
  return StoreTime{.time = std::chrono::system_clock::now(), .from_store = false};
}

std::string FencedWriteFacet::DataKeyPrefix(std::string_view /*key*/) const {
  return {};
}

// ---- The calls.

Status Backend::Renew(const RenewRequest& request) {
  std::vector<Status> results = RenewMany(std::span(&request, 1));
  if (results.size() != 1) {
    return Status::Internal(
        fmt::format("the {} store answered {} renewals for one", scheme(), results.size()));
  }
  return std::move(results.front());
}

Status Backend::Release(std::string_view key, std::string_view owner_token) {
  return Finish(FinishRequest{.key = std::string(key), .owner_token = std::string(owner_token)});
}

Result<std::optional<LeaseInfo>> Backend::Inspect(std::string_view key) {
  LH_ASSIGN_OR_RETURN(std::vector<LeaseInfo> holders, Holders(key));
  return FirstGrant(std::move(holders));
}

Result<bool> Backend::ForceRelease(std::string_view key) {
  return ForceEnd(key, {});
}

Result<bool> Backend::ForceReleaseGrant(std::string_view key, std::string_view token_prefix) {
  if (token_prefix.empty()) {
    return Status::InvalidArgument(
        fmt::format("lease {}: force-releasing one grant needs its token prefix", key));
  }
  return ForceEnd(key, token_prefix);
}

Result<std::optional<std::string>> Backend::ReadRecord(std::string_view key) {
  if (RecordsFacet* records = facets().records; records != nullptr) {
    return records->ReadRecord(key);
  }
  return Status::Unimplemented(fmt::format("the {} store keeps no records", scheme()));
}

Result<std::vector<std::pair<std::string, std::string>>> Backend::ListRecords(
    std::string_view prefix) {
  if (RecordsFacet* records = facets().records; records != nullptr) {
    return records->ListRecords(prefix);
  }
  return Status::Unimplemented(fmt::format("the {} store cannot list records", scheme()));
}

Result<StoreTime> Backend::WallClock() {
  if (RecordsFacet* records = facets().records; records != nullptr) {
    return records->WallClock();
  }
  return StoreTime{.time = std::chrono::system_clock::now(), .from_store = false};
}

Result<std::vector<std::int64_t>> Backend::FencedWrite(const FencedWriteRequest& request) {
  if (FencedWriteFacet* writes = facets().fenced_write; writes != nullptr) {
    return writes->FencedWrite(request);
  }
  return Status::Unimplemented(
      fmt::format("the {} store cannot write data under a lease", scheme()));
}

unsigned Backend::fenced_ops() {
  FencedWriteFacet* writes = facets().fenced_write;
  return writes != nullptr ? writes->fenced_ops() : 0U;
}

std::string Backend::DataKeyPrefix(std::string_view key) {
  FencedWriteFacet* writes = facets().fenced_write;
  return writes != nullptr ? writes->DataKeyPrefix(key) : std::string();
}

Status Backend::Ping() {
  if (DoctorFacet* doctor = facets().doctor; doctor != nullptr) {
    return doctor->Ping();
  }
  return Status::Unimplemented("this store has no round-trip probe");
}

Result<Diagnosis> Backend::Diagnose() {
  if (DoctorFacet* doctor = facets().doctor; doctor != nullptr) {
    return doctor->Diagnose();
  }
  return Diagnosis{.probe = "round trip"};
}

Status Backend::WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token stop) {
  if (WaitFacet* wait = facets().wait; wait != nullptr) {
    return wait->WaitForChange(key, deadline, std::move(stop));
  }
  return Status::Unimplemented("this store has no change notification; poll instead");
}

Status Backend::WaitForTurn(std::string_view key, std::string_view waiter_id, SteadyTime deadline,
                            std::stop_token stop) {
  if (WaitFacet* wait = facets().wait; wait != nullptr) {
    return wait->WaitForTurn(key, waiter_id, deadline, std::move(stop));
  }
  return Status::Unimplemented("this store has no change notification; poll instead");
}

void Backend::AbandonWait(std::string_view key, std::string_view waiter_id) {
  if (WaitFacet* wait = facets().wait; wait != nullptr) {
    wait->AbandonWait(key, waiter_id);
  }
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
