#include "leasehold/lease.h"

#include <fmt/format.h>

#include "core/duration.h"
#include "core/lease_core.h"
#include "core/logging.h"
#include "core/owner_token.h"
#include "core/store_core.h"

namespace leasehold {

namespace {
const std::string kEmpty;
}  // namespace

Lease::Lease(std::shared_ptr<internal::StoreCore> store, std::shared_ptr<internal::LeaseCore> core)
    : store_(std::move(store)), core_(std::move(core)) {}

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    ReleaseOnDestroy();
    store_ = std::move(other.store_);
    core_ = std::move(other.core_);
  }
  return *this;
}

Lease::~Lease() {
  ReleaseOnDestroy();
}

bool Lease::Forked() const {
  return store_ != nullptr && store_->forked();
}

void Lease::ReleaseOnDestroy() noexcept {
  if (!core_) {
    return;
  }
  if (Forked()) {
    // The parent's grant: nothing to do here (the leaked heartbeat keeps the LeaseCore alive).
    store_.reset();
    core_.reset();
    return;
  }
  // A lease already known to be lost was reported when it was lost: say it again only in
  // debug logs.
  const bool already_lost = store_ != nullptr && !core_->Active();
  Status s = Release();
  if (!s.ok()) {
    internal::Log(already_lost ? internal::LogLevel::kDebug : internal::LogLevel::kWarning,
                  fmt::format("release on destruction key={} token={}: {}", core_->key(),
                              internal::TokenPrefix(core_->owner_token()), s.ToString()));
  }
}

const std::string& Lease::key() const {
  return core_ ? core_->key() : kEmpty;
}

std::string Lease::token_prefix() const {
  return core_ ? internal::TokenPrefix(core_->owner_token()) : std::string();
}

int Lease::holder_liveness_fd() const {
  return store_ ? store_->backend->HolderLivenessFd() : -1;
}

FencingToken Lease::fencing_token() const {
  return core_ ? core_->fencing_token() : 0;
}

const std::string& Lease::store_key() const {
  return core_ ? core_->store_key() : kEmpty;
}

std::string Lease::DataKey(std::string_view name) const {
  return core_ ? core_->data_key_prefix() + std::string(name) : std::string(name);
}

std::uint32_t Lease::slot() const {
  return core_ ? core_->slot() : 0;
}

LeaseMode Lease::mode() const {
  return core_ ? core_->mode() : LeaseMode::kExclusive;
}

std::uint32_t Lease::limit() const {
  return core_ ? core_->limit() : 1;
}

const char* FencedOpKindName(FencedOp::Kind kind) {
  switch (kind) {
    case FencedOp::Kind::kPut:
      return "put";
    case FencedOp::Kind::kDelete:
      return "delete";
    case FencedOp::Kind::kHashSet:
      return "hash-set";
    case FencedOp::Kind::kSql:
      return "sql";
  }
  return "unknown";
}

Result<FencedWriteResult> Lease::Write(const FencedWrite& write) const {
  if (!core_) {
    return Status::InvalidArgument("an empty Lease cannot write");
  }
  const std::shared_ptr<internal::StoreCore>& store = store_;
  if (Forked()) {
    return internal::ForkedChildStatus("lease " + core_->key(), store->process);
  }
  if (!store) {
    return internal::FencedOut(core_->key(), core_->fencing_token(),
                               "was released: a released lease writes nothing");
  }
  const std::vector<FencedOp>& ops = write.ops();
  if (ops.empty()) {
    return Status::InvalidArgument("a fenced write needs at least one op");
  }
  if (ops.size() > kMaxFencedOps) {
    return Status::InvalidArgument(
        fmt::format("a fenced write has at most {} ops, got {}", kMaxFencedOps, ops.size()));
  }
  const unsigned supported = store->backend->fenced_ops();
  std::size_t bytes = 0;
  for (const FencedOp& op : ops) {
    if ((supported & internal::FencedOpBit(op.kind)) == 0) {
      return Status::Unimplemented(fmt::format(
          "the {} store has no fenced {} op", store->backend->scheme(), FencedOpKindName(op.kind)));
    }
    if (op.key.empty()) {
      return Status::InvalidArgument(
          fmt::format("a fenced {} op needs a {}", FencedOpKindName(op.kind),
                      op.kind == FencedOp::Kind::kSql ? "statement" : "key"));
    }
    bytes += op.key.size() + op.field.size() + op.value.size();
    for (const std::string& p : op.params) {
      bytes += p.size();
    }
  }
  if (bytes > kMaxFencedWriteBytes) {
    return Status::InvalidArgument(fmt::format("a fenced write carries at most {} bytes, got {}",
                                               kMaxFencedWriteBytes, bytes));
  }
  Result<std::vector<std::int64_t>> affected =
      store->backend->FencedWrite({.key = core_->key(),
                                   .owner_token = core_->owner_token(),
                                   .fencing_token = core_->fencing_token(),
                                   .store_key = core_->store_key(),
                                   .ops = ops});
  if (affected.ok() && affected->size() != ops.size()) {
    affected = Status::Internal(
        fmt::format("the {} store answered a fenced write of {} ops with {} counts",
                    store->backend->scheme(), ops.size(), affected->size()));
  }
  if (store->lease_metrics != nullptr) {
    const internal::FencedWriteOutcome outcome =
        affected.ok()                                   ? internal::FencedWriteOutcome::kAccepted
        : affected.status().code() == StatusCode::kLost ? internal::FencedWriteOutcome::kFencedOut
                                                        : internal::FencedWriteOutcome::kError;
    store->lease_metrics->RecordFencedWrite(internal::KindOf(core_->mode(), core_->limit()),
                                            outcome);
  }
  if (!affected.ok()) {
    if (affected.status().code() == StatusCode::kLost &&
        internal::LogEnabled(internal::LogLevel::kWarning)) {
      const std::string fencing = std::to_string(core_->fencing_token());
      const std::string prefix = internal::TokenPrefix(core_->owner_token());
      const std::string result = affected.status().ToString();
      internal::LogEvent(internal::LogLevel::kWarning, "fenced_out",
                         {{"key", core_->key()},
                          {"fencing_token", fencing, true},
                          {"token", prefix},
                          {"backend", store->backend->scheme()},
                          {"store_reply", result}});
    }
    return affected.status();
  }
  return FencedWriteResult{.affected = std::move(affected).value()};
}

// In a fork() child the lease is lost, and its LeaseCore is not asked: a heartbeat thread of
// the parent may have held its lock at the fork, and that lock stays held in the child.
bool Lease::valid() const {
  return core_ && !Forked() && core_->Valid();
}

LeaseState Lease::state() const {
  return core_ && !Forked() ? core_->state() : LeaseState::kLost;
}

SteadyTime Lease::safe_until() const {
  return core_ && !Forked() ? core_->safe_until() : SteadyTime();
}

std::stop_token Lease::lost_token() const {
  if (!core_ || Forked()) {
    std::stop_source stopped;
    stopped.request_stop();
    return stopped.get_token();
  }
  return core_->lost_token();
}

Status Lease::lost_reason() const {
  if (Forked()) {
    return internal::ForkedChildStatus("lease " + core_->key(), store_->process);
  }
  return core_ ? core_->lost_reason() : Status();
}

Duration Lease::ttl() const {
  return core_ ? core_->ttl() : Duration();
}

Duration Lease::renew_interval() const {
  return core_ ? core_->renew_interval() : Duration();
}

Status Lease::Confirm() {
  if (!core_) {
    return Status::InvalidArgument("an empty Lease has no grant to confirm");
  }
  if (Forked()) {
    return internal::ForkedChildStatus("lease " + core_->key(), store_->process);
  }
  const std::shared_ptr<internal::StoreCore>& store = store_;
  auto over = [&] {
    Status why = core_->lost_reason();
    return why.ok() ? Status::Lost(fmt::format("lease {} was released", core_->key())) : why;
  };
  if (!store || !core_->Valid()) {
    return over();
  }
  // Read before sending, as the heartbeat does: the reply can be arbitrarily late.
  const SteadyTime t_send = store->clock.Now();
  Status result = store->backend->Renew(
      {.key = core_->key(), .owner_token = core_->owner_token(), .ttl = core_->ttl()});
  if (store->lease_metrics != nullptr && !result.ok()) {
    store->lease_metrics->RecordRenewFailure(internal::KindOf(core_->mode(), core_->limit()),
                                             internal::RenewFailureOf(result.code()));
  }
  core_->OnRenewResult(t_send, result);
  store->heartbeat.Replan();
  if (!core_->Valid()) {
    return over();
  }
  if (!result.ok()) {
    return result.WithContext(fmt::format("confirming lease {}", core_->key()));
  }
  return Status();
}

Status Lease::Release() {
  return Finish(SteadyTime::min(), std::nullopt, Duration::zero());
}

Status Lease::Release(const ReleaseOptions& options) {
  if (options.hold_at_least < Duration::zero()) {
    Status released = Release();
    return Status::InvalidArgument(
        fmt::format("hold_at_least must not be negative, got {} (the lease was released: {})",
                    internal::FormatDuration(options.hold_at_least), released.ToString()));
  }
  if (options.hold_at_least > kMaxHoldAtLeast) {
    Status released = Release();
    return Status::InvalidArgument(
        fmt::format("hold_at_least must be at most {}, got {} (the lease was released: {})",
                    internal::FormatDuration(kMaxHoldAtLeast),
                    internal::FormatDuration(options.hold_at_least), released.ToString()));
  }
  if (!core_ || !store_) {
    return Status();
  }
  return Finish(core_->granted_at() + options.hold_at_least, std::nullopt, Duration::zero());
}

Status Lease::Finish(SteadyTime keep_until, std::optional<std::string> record,
                     Duration record_ttl) {
  if (!core_ || !store_) {
    return Status();  // empty, or released before: releasing twice is harmless
  }
  if (Forked()) {
    // The parent's grant stays the parent's: no round trip, no heartbeat change.
    Status forked = internal::ForkedChildStatus("lease " + core_->key(), store_->process);
    store_.reset();
    return forked;
  }
  std::shared_ptr<internal::StoreCore> store = std::move(store_);
  Status local = core_->BeginRelease();
  store->heartbeat.Remove(core_.get());
  // End the grant only if the owner token still matches; the backend guarantees nothing of
  // anyone else's is touched. Do it even when the lease is locally lost: if the grant is still
  // ours in the store, deleting it hands the key over sooner. But a lease lost here is only
  // deleted: neither kept (its holder can no longer vouch for it) nor recorded (a run that
  // outlived its safe_until is not the slot's one clean run), whatever the store still holds.
  if (!local.ok()) {
    keep_until = SteadyTime::min();
    record.reset();
  }
  const SteadyTime t_send = store->clock.Now();
  // The store counts `keep` from no earlier than t_send, so the grant lasts until keep_until
  // at least.
  const Duration keep = keep_until > t_send ? keep_until - t_send : Duration::zero();
  Status remote = store->backend->Finish({.key = core_->key(),
                                          .owner_token = core_->owner_token(),
                                          .keep = keep,
                                          .record = std::move(record),
                                          .record_ttl = record_ttl});
  const Duration latency = store->clock.Now() - t_send;
  const internal::ReleaseOutcome outcome = !local.ok() || remote.code() == StatusCode::kLost
                                               ? internal::ReleaseOutcome::kLost
                                           : remote.ok() ? internal::ReleaseOutcome::kOk
                                                         : internal::ReleaseOutcome::kError;
  if (store->lease_metrics != nullptr) {
    store->lease_metrics->RecordRelease(internal::KindOf(core_->mode(), core_->limit()), outcome);
  }
  if (internal::LogEnabled(internal::LogLevel::kInfo)) {
    const std::string fencing = std::to_string(core_->fencing_token());
    const std::string prefix = internal::TokenPrefix(core_->owner_token());
    const std::string latency_s = internal::LogSeconds(latency);
    const std::string keep_s = internal::LogSeconds(keep);
    const std::string result = remote.ToString();
    internal::LogEvent(
        internal::LogLevel::kInfo, "released",
        {{"key", core_->key()},
         {"fencing_token", fencing, true},
         {"token", prefix},
         {"backend", store->backend->scheme()},
         {"latency_seconds", latency_s, true},
         {"kept_seconds", keep_s, true},
         {"outcome", internal::kReleaseOutcomeNames[static_cast<std::size_t>(outcome)]},
         {"store_reply", result}});
  }
  if (!local.ok()) {
    return local;
  }
  if (remote.code() == StatusCode::kLost) {
    return Status::Lost(fmt::format("lease {} was lost or stolen before release: {}", core_->key(),
                                    remote.message()));
  }
  return remote;
}

}  // namespace leasehold
