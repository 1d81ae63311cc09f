#include "leasehold/store.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "backends/registry.h"
#include "core/backoff.h"
#include "core/cgroup_cpu.h"
#include "core/duration.h"
#include "core/host_config.h"
#include "core/key_waiter.h"
#include "core/lease_core.h"
#include "core/logging.h"
#include "core/owner_token.h"
#include "core/store_core.h"
#include "core/url.h"

namespace leasehold {

namespace {

using internal::Backoff;
using internal::FormatDuration;

constexpr std::size_t kMaxKeyBytes = 512;

// Polling (for stores without notification) starts at 1 ms and doubles up to 50 ms, with full
// jitter: a local store answers in microseconds, and 50 ms keeps handoff well under 100 ms.
constexpr Duration kPollBase = std::chrono::milliseconds(1);
constexpr Duration kPollCap = std::chrono::milliseconds(50);
// Transient store errors while waiting are retried more gently.
constexpr Duration kErrorBackoffBase = std::chrono::milliseconds(50);
constexpr Duration kErrorBackoffCap = std::chrono::seconds(2);
// A notification can be missed (a dropped connection); re-check at least this often.
constexpr Duration kNotificationSafetyNet = std::chrono::seconds(5);

struct ResolvedOptions {
  Duration ttl;
  std::optional<Duration> renew_interval;
  std::optional<Duration> drift;
  std::string holder;
  LeaseMode mode;
  std::uint32_t limit;
};

// Checks the options against a TTL (the requested one, and later the granted one).
Status CheckTimes(Duration ttl, const std::optional<Duration>& renew,
                  const std::optional<Duration>& drift_opt) {
  if (ttl <= Duration::zero()) {
    return Status::InvalidArgument(
        fmt::format("ttl must be positive, got {}", FormatDuration(ttl)));
  }
  Duration drift = drift_opt.value_or(LeaseOptions::DefaultDrift(ttl));
  if (drift < Duration::zero()) {
    return Status::InvalidArgument("drift must not be negative");
  }
  if (drift >= ttl) {
    return Status::InvalidArgument(
        fmt::format("ttl {} is too short: it must exceed the drift allowance {}",
                    FormatDuration(ttl), FormatDuration(drift)));
  }
  Duration interval = renew.value_or(ttl / 3);
  if (interval <= Duration::zero()) {
    return Status::InvalidArgument(
        fmt::format("renew interval must be positive, got {}", FormatDuration(interval)));
  }
  if (interval >= ttl - drift) {
    return Status::InvalidArgument(
        fmt::format("renew interval {} must be shorter than ttl {} minus the drift allowance {}",
                    FormatDuration(interval), FormatDuration(ttl), FormatDuration(drift)));
  }
  return Status();
}

Result<ResolvedOptions> Resolve(std::string_view key, const LeaseOptions& options) {
  LH_RETURN_IF_ERROR(ValidateKey(key));
  LH_RETURN_IF_ERROR(CheckTimes(options.ttl, options.renew_interval, options.drift));
  if (options.wait < Duration::zero()) {
    return Status::InvalidArgument("wait must not be negative");
  }
  LH_RETURN_IF_ERROR(ValidateHolder(options.holder));
  if (options.limit < 1 || options.limit > kMaxLeaseLimit) {
    return Status::InvalidArgument(
        fmt::format("limit must be 1..{}, got {}", kMaxLeaseLimit, options.limit));
  }
  if (options.mode == LeaseMode::kShared && options.limit != 1) {
    return Status::InvalidArgument(fmt::format(
        "a shared lease has no limit (any number of shared holders): got limit {}", options.limit));
  }
  return ResolvedOptions{
      options.ttl,   options.renew_interval,
      options.drift, options.holder.empty() ? LeaseOptions::DefaultHolder() : options.holder,
      options.mode,  options.limit};
}

// Returns true if `s` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool IsUtf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) {
      return false;
    }
    for (std::size_t k = 1; k < len; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) {
        return false;
      }
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

// The first grant of a handle whose TTL this process's CPU quota endangers (cgroup_cpu.h:
// a stop of period - quota is more than a tenth of the TTL) logs one warning, the finding
// `leasehold check` reports as area cpu. The quota is read once per process.
void WarnOfCpuQuota(internal::StoreCore& core, std::string_view key, Duration ttl) {
  if (core.cpu_quota_warned.load(std::memory_order_relaxed) ||
      !internal::LogEnabled(internal::LogLevel::kWarning)) {
    return;
  }
  static const std::optional<internal::CpuThrottling> cpu = internal::ReadCpuThrottling();
  if (!cpu || !cpu->quota || !cpu->StallsTtl(ttl) || core.cpu_quota_warned.exchange(true)) {
    return;
  }
  const Duration stall = cpu->LongestStall();
  const std::string quota = fmt::format("{} per {}", FormatDuration(cpu->quota->quota),
                                        FormatDuration(cpu->quota->period));
  const std::string fix = fmt::format(
      "renewals can come {} late, more than a tenth of the TTL: raise the quota, or the TTL to "
      "{} or more",
      FormatDuration(stall), FormatDuration(stall * 10));
  internal::LogEvent(internal::LogLevel::kWarning, "cpu_quota",
                     {{"key", key},
                      {"ttl_seconds", internal::LogSeconds(ttl), true},
                      {"stall_seconds", internal::LogSeconds(stall), true},
                      {"quota", quota},
                      {"cgroup", cpu->cgroup},
                      {"fix", fix}});
}

}  // namespace

Duration LeaseOptions::DefaultDrift(Duration ttl) {
  return ttl / 100 + std::chrono::milliseconds(2);
}

const std::string& LeaseOptions::DefaultHolder() {
  static const std::string holder = [] {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) {
      std::snprintf(host, sizeof(host), "unknown-host");
    }
    return fmt::format("{}:{}", host, getpid());
  }();
  return holder;
}

namespace {

// kInvalidArgument naming the first control character of `text` (C0, DEL, or C1 encoded in
// UTF-8) and its byte offset, or OK. A key or holder id is printed by `status` and `list` and
// written in log lines: a newline or an escape sequence in it could forge an operator's output.
Status RefuseControlCharacters(std::string_view what, std::string_view text) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const bool c1 = byte == 0xC2 && i + 1 < text.size() &&
                    static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9F;
    if (byte < 0x20 || byte == 0x7F || c1) {
      const unsigned code = c1 ? static_cast<unsigned char>(text[i + 1]) : byte;
      return Status::InvalidArgument(fmt::format(
          "{} must not contain control characters: U+{:04X} at byte {}", what, code, i));
    }
  }
  return Status();
}

}  // namespace

Status ValidateKey(std::string_view key) {
  if (key.empty()) {
    return Status::InvalidArgument("key must not be empty");
  }
  if (key.size() > kMaxKeyBytes) {
    return Status::InvalidArgument(
        fmt::format("key is {} bytes long; the limit is {}", key.size(), kMaxKeyBytes));
  }
  if (!IsUtf8(key)) {
    return Status::InvalidArgument("key must be valid UTF-8");
  }
  return RefuseControlCharacters("key", key);  // a NUL byte included
}

Status ValidateHolder(std::string_view holder) {
  if (holder.size() > kMaxHolderBytes) {
    return Status::InvalidArgument(fmt::format("holder identity is {} bytes long; the limit is {}",
                                               holder.size(), kMaxHolderBytes));
  }
  if (!IsUtf8(holder)) {
    return Status::InvalidArgument("holder identity must be valid UTF-8");
  }
  return RefuseControlCharacters("holder identity", holder);
}

namespace internal {

std::shared_ptr<StoreCore> MakeStoreCore(std::shared_ptr<Backend> backend, Clock& clock,
                                         std::string display_url, const StoreOptions& options) {
  // In a fork() child the StoreCore is left alone (fork_guard.h): destroying it would join
  // heartbeat threads the child does not have and close the parent's sessions politely.
  std::shared_ptr<StoreCore> core(new StoreCore(std::move(backend), clock, std::move(display_url),
                                                options.metrics, options.record_metrics),
                                  [](StoreCore* c) {
                                    if (!c->forked()) {
                                      delete c;
                                    }
                                  });
  if (core->lease_metrics != nullptr) {
    core->backend->set_metrics(core->lease_metrics);
    // The gauges are read from the heartbeat at scrape time, through a weak reference that
    // shares the StoreCore's lifetime: a closed store drops out of the scrape by itself.
    internal::MetricsAccess::Of(*core->metrics)
        .AddGaugeSource(*core->lease_metrics, std::shared_ptr<GaugeSource>(core, &core->heartbeat));
  }
  return core;
}

}  // namespace internal

Status Store::Usable() const {
  if (core_->forked()) {
    return Status::FailedPrecondition(std::string(
        internal::ForkedChildStatus("store " + core_->display_url, core_->process).message()));
  }
  return Status();
}

Result<std::string> Store::DefaultUrl() {
  if (const char* env = std::getenv("LEASEHOLD_STORE"); env != nullptr && *env != '\0') {
    return std::string(env);
  }
  LH_ASSIGN_OR_RETURN(std::optional<std::string> configured, internal::HostConfigValue("store"));
  if (configured.has_value() && !configured->empty()) {
    return *std::move(configured);
  }
  return internal::DefaultStoreUrl();
}

std::vector<std::string> Store::CompiledSchemes() {
  return internal::CompiledSchemes();
}

Result<std::string> Store::SchemaSql(std::string_view url) {
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  return internal::StoreSchemaSql(parsed);
}

Result<std::unique_ptr<Store>> Store::Open(std::string_view url, StoreOptions options) {
  Clock& clock = options.clock != nullptr ? *options.clock : Clock::Real();
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<internal::Backend> backend,
                      internal::OpenBackend(parsed, clock));
  return std::unique_ptr<Store>(
      new Store(internal::MakeStoreCore(std::move(backend), clock, parsed.Redacted(), options)));
}

namespace internal {

struct StoreAccess {
  static std::unique_ptr<Store> Make(std::shared_ptr<StoreCore> core) {
    return std::unique_ptr<Store>(new Store(std::move(core)));
  }
};

std::unique_ptr<Store> OpenStoreWithBackend(std::shared_ptr<Backend> backend,
                                            StoreOptions options) {
  Clock& clock = options.clock != nullptr ? *options.clock : Clock::Real();
  std::string name = fmt::format("{}://(testing)", backend->scheme());
  return StoreAccess::Make(MakeStoreCore(std::move(backend), clock, name, options));
}

}  // namespace internal

Store::Store(std::shared_ptr<internal::StoreCore> core) : core_(std::move(core)) {}

Store::~Store() = default;

std::string_view Store::backend_name() const {
  return core_->backend->scheme();
}

const std::string& Store::display_url() const {
  return core_->display_url;
}

std::string Store::RedactUrl(std::string_view url) {
  auto parsed = internal::ParseUrl(url);
  return parsed.ok() ? parsed->Redacted() : std::string("(a URL that does not parse)");
}

const std::shared_ptr<Metrics>& Store::metrics() const {
  return core_->metrics;
}

Clock& Store::clock() const {
  return core_->clock;
}

bool Store::SupportsFencedOp(FencedOp::Kind kind) const {
  return (core_->backend->fenced_ops() & internal::FencedOpBit(kind)) != 0;
}

std::string Store::DataKey(std::string_view key, std::string_view name) const {
  return core_->backend->DataKeyPrefix(key) + std::string(name);
}

bool Store::fencing_survives_restart() const {
  return core_->backend->capabilities().fencing_survives_restart;
}

StoreScope Store::scope() const {
  return core_->backend->capabilities().scope;
}

bool Store::notifies_changes() const {
  return core_->backend->facets().wait != nullptr;
}

bool Store::notifies_holder() const {
  return core_->backend->capabilities().notifies_holder;
}

Status Store::WaitForChange(std::string_view key, SteadyTime deadline, std::stop_token cancel) {
  LH_RETURN_IF_ERROR(Usable());
  LH_RETURN_IF_ERROR(ValidateKey(key));
  return core_->backend->WaitForChange(key, deadline, std::move(cancel));
}

Result<Lease> Store::TryAcquire(std::string_view key, const LeaseOptions& options) {
  LH_ASSIGN_OR_RETURN(std::string token, internal::NewOwnerToken());
  return TryAcquireAs(key, options, std::string(), token);
}

Result<Lease> Store::TryAcquireAs(std::string_view key, const LeaseOptions& options,
                                  const std::string& waiter_id, const std::string& owner_token) {
  LH_RETURN_IF_ERROR(Usable());
  LH_ASSIGN_OR_RETURN(ResolvedOptions resolved, Resolve(key, options));
  const std::string& token = owner_token;
  internal::Backend& backend = *core_->backend;
  const bool plain = resolved.mode == LeaseMode::kExclusive && resolved.limit == 1;
  if (const internal::Capabilities caps = backend.capabilities(); !plain && !caps.shared_leases) {
    return Status::Unimplemented(
        caps.no_shared_leases_why.empty()
            ? fmt::format("the {} store has no {} leases", backend.scheme(),
                          LeaseKindName(resolved.mode, resolved.limit))
            : fmt::format("{} {} lease: {}", key, LeaseKindName(resolved.mode, resolved.limit),
                          caps.no_shared_leases_why));
  }
  internal::LeaseMetrics* metrics = core_->lease_metrics;
  const internal::LeaseKind kind = internal::KindOf(resolved.mode, resolved.limit);
  // Read t_send before sending: the grant cannot have started earlier than this.
  SteadyTime t_send = core_->clock.Now();
  Result<internal::Grant> granted = backend.TryAcquire({.key = std::string(key),
                                                        .owner_token = token,
                                                        .holder = resolved.holder,
                                                        .ttl = resolved.ttl,
                                                        .waiter_id = waiter_id,
                                                        .mode = resolved.mode,
                                                        .limit = resolved.limit});
  const Duration latency = core_->clock.Now() - t_send;
  if (!granted.ok()) {
    if (metrics != nullptr) {
      metrics->RecordAcquire(kind,
                             granted.error().code() == StatusCode::kHeldByAnother
                                 ? internal::AcquireOutcome::kHeldByAnother
                                 : internal::AcquireOutcome::kError,
                             latency);
    }
    return granted.error();
  }
  const internal::Grant grant = *granted;
  // The store's word on the TTL is the truth, longer (etcd rounds up) or shorter (etcd's spare
  // lease, already aged; ZooKeeper's session-timeout bounds) than asked: safe_until must never
  // outlast the store's grant.
  Duration ttl = grant.ttl > Duration::zero() ? grant.ttl : resolved.ttl;
  if (Status s = CheckTimes(ttl, resolved.renew_interval, resolved.drift); !s.ok()) {
    (void)backend.Release(key, token);
    return s;
  }
  WarnOfCpuQuota(*core_, key, ttl);
  internal::LeaseParams params{
      .key = std::string(key),
      .owner_token = token,
      .holder = resolved.holder,
      .fencing_token = grant.fencing_token,
      .store_key = grant.store_key.empty() ? std::string(key) : grant.store_key,
      .data_key_prefix = backend.DataKeyPrefix(key),
      .slot = grant.slot,
      .mode = resolved.mode,
      .limit = resolved.limit,
      .ttl = ttl,
      .renew_interval = resolved.renew_interval.value_or(ttl / 3),
      .drift = resolved.drift.value_or(LeaseOptions::DefaultDrift(ttl)),
      .t_send = t_send,
      .t_granted = t_send + latency,
      .backend_name = std::string(backend.scheme()),
      .metrics = metrics,
      .on_lost = options.on_lost,
      .on_state_change = options.on_state_change,
      .on_renewed = options.on_renewed,
  };
  auto core = std::make_shared<internal::LeaseCore>(core_->clock, std::move(params));
  if (core_->clock.Now() >= core->safe_until()) {
    // The reply came so late that the grant may already have expired: it is worthless.
    (void)backend.Release(key, token);
    if (metrics != nullptr) {
      metrics->RecordAcquire(kind, internal::AcquireOutcome::kError, latency);
    }
    return Status::Unavailable(fmt::format("the store granted {} only after its ttl {} had passed",
                                           key, FormatDuration(ttl)));
  }
  core_->heartbeat.Add(core);
  if (metrics != nullptr) {
    metrics->RecordAcquire(kind, internal::AcquireOutcome::kAcquired, latency);
  }
  if (internal::LogEnabled(internal::LogLevel::kInfo)) {
    const std::string fencing = std::to_string(grant.fencing_token);
    const std::string prefix = internal::TokenPrefix(token);
    const std::string latency_s = internal::LogSeconds(latency);
    const std::string ttl_s = internal::LogSeconds(ttl);
    const std::string renew_s = internal::LogSeconds(core->renew_interval());
    internal::LogEvent(internal::LogLevel::kInfo, "acquired",
                       {{"key", key},
                        {"fencing_token", fencing, true},
                        {"token", prefix},
                        {"backend", backend.scheme()},
                        {"kind", LeaseKindName(resolved.mode, resolved.limit)},
                        {"slot", std::to_string(grant.slot), true},
                        {"latency_seconds", latency_s, true},
                        {"ttl_seconds", ttl_s, true},
                        {"renew_interval_seconds", renew_s, true}});
  }
  return Lease(core_, std::move(core));
}

Result<Lease> Store::Acquire(std::string_view key, const LeaseOptions& options,
                             std::stop_token cancel) {
  LH_RETURN_IF_ERROR(Usable());
  LH_RETURN_IF_ERROR(Resolve(key, options).status());
  Clock& clock = core_->clock;
  const SteadyTime start = clock.Now();
  const SteadyTime deadline =
      options.wait >= SteadyTime::max() - start ? SteadyTime::max() : start + options.wait;
  // One id for every attempt of this call, so that a fair store keeps our place in its queue;
  // if we give up, we leave the queue rather than block it until our entry expires.
  LH_ASSIGN_OR_RETURN(const std::string waiter_id, internal::NewOwnerToken());
  // One owner token for every attempt too, so that a store that hands the key to the head of
  // its queue inside the holder's release grants it under the token this call will renew and
  // release with. An attempt whose reply was lost may have been granted under it. A later
  // attempt that finds such a grant either refuses it as "held by another" (Redis, SQL stores:
  // its expiry began before that attempt's t_send) or adopts it with a Grant::ttl counted from
  // a send time of its own before the store's expiry began (etcd: the shared lease's last
  // refresh; ZooKeeper: the session's last answered request; Redis fair: the queue refresh a
  // release handed the key on), never from that attempt's t_send alone.
  LH_ASSIGN_OR_RETURN(const std::string owner_token, internal::NewOwnerToken());

  struct LeaveQueueUnlessAcquired {
    internal::Backend& backend;
    std::string_view key;
    const std::string& waiter_id;
    bool acquired = false;

    ~LeaveQueueUnlessAcquired() {
      if (!acquired) {
        backend.AbandonWait(key, waiter_id);
      }
    }
  } leave{*core_->backend, key, waiter_id};

  // Waits in this call's place in the store's queue (Backend::WaitForTurn).
  internal::KeyWaiter waiter(
      clock,
      [&backend = *core_->backend, key, &waiter_id](SteadyTime until, std::stop_token stop) {
        return backend.WaitForTurn(key, waiter_id, until, std::move(stop));
      },
      core_->backend->facets().wait != nullptr, kPollBase, kPollCap);
  Backoff on_error(kErrorBackoffBase, kErrorBackoffCap);
  internal::LeaseMetrics* const metrics = core_->lease_metrics;

  // Records the call's wait once, whichever way it ends.
  struct RecordWait {
    internal::LeaseMetrics* metrics;
    internal::LeaseKind kind;
    Clock& clock;
    SteadyTime start;
    internal::WaitOutcome outcome = internal::WaitOutcome::kError;

    ~RecordWait() {
      if (metrics != nullptr) {
        metrics->RecordWait(kind, outcome, clock.Now() - start);
      }
    }
  } record_wait{metrics, internal::KindOf(options.mode, options.limit), clock, start};

  // When the store last told us the key changed (a release or an expiry); cleared by an attempt
  // that loses the race. A grant right after such a notification is a handoff.
  // (A plain time and a flag rather than std::optional: g++ 12 -O2 warns, wrongly, that the
  // optional's value may be read uninitialised.)
  SteadyTime notified_at{};
  bool notified = false;
  // An exclusive waiter's attempts refresh its writer intent (Backend, "Writer preference"),
  // which lives one ttl: re-check at least every ttl/3 so that it never lapses while we wait.
  const Duration recheck_every =
      options.mode == LeaseMode::kExclusive && options.limit == 1
          ? std::min<Duration>(kNotificationSafetyNet,
                               std::max<Duration>(options.ttl / 3, kPollCap))
          : kNotificationSafetyNet;
  bool waited = false;
  Status last;
  while (true) {
    if (cancel.stop_requested()) {
      record_wait.outcome = internal::WaitOutcome::kCancelled;
      return Status::Cancelled(fmt::format("cancelled while waiting for {}", key));
    }
    Result<Lease> attempt = TryAcquireAs(key, options, waiter_id, owner_token);
    if (attempt.ok()) {
      leave.acquired = true;
      record_wait.outcome = internal::WaitOutcome::kAcquired;
      if (waited) {
        LogHandoff(*attempt, clock.Now() - start,
                   notified ? std::optional<Duration>(clock.Now() - notified_at) : std::nullopt);
      }
      return attempt;
    }
    notified = false;
    last = attempt.status();
    waited = waited || last.code() == StatusCode::kHeldByAnother;
    SteadyTime now = clock.Now();
    if (last.code() == StatusCode::kHeldByAnother) {
      on_error.Reset();
      if (now >= deadline) {
        break;
      }
      if (waiter.notifies()) {
        Status w = waiter.AwaitStore(std::min(deadline, now + recheck_every), cancel);
        if (w.ok()) {
          notified_at = clock.Now();
          notified = true;
        }
        if (w.code() != StatusCode::kUnimplemented) {
          continue;  // woken, timed out or cancelled: the loop head decides
        }
      }
      // The holder's grant ends by itself at its remaining TTL: never sleep past that.
      const LeaseInfo* holder = last.holder();
      waiter.SleepPoll(
          holder != nullptr ? std::optional<Duration>(holder->remaining) : std::nullopt, now,
          deadline, cancel);
    } else if (last.code() == StatusCode::kUnavailable) {
      if (now >= deadline) {
        break;
      }
      internal::Log(
          internal::LogLevel::kInfo,
          fmt::format("waiting for {}: store unavailable, retrying: {}", key, last.ToString()));
      clock.SleepUntil(std::min(now + on_error.Next(), deadline), cancel);
    } else {
      return last;
    }
  }
  if (last.code() == StatusCode::kHeldByAnother) {
    record_wait.outcome = internal::WaitOutcome::kDeadlineExceeded;
    Status out(StatusCode::kDeadlineExceeded,
               fmt::format("gave up waiting for {} after {}: {}", key,
                           FormatDuration(RoundForDisplay(clock.Now() - start)), last.message()));
    return out;
  }
  return last.WithContext(fmt::format("gave up waiting for {}", key));
}

void Store::LogHandoff(const Lease& lease, Duration waited, std::optional<Duration> handoff) {
  if (handoff.has_value() && core_->lease_metrics != nullptr &&
      core_->lease_metrics->handoff_observable) {
    core_->lease_metrics->RecordHandoff(internal::KindOf(lease.mode(), lease.limit()), *handoff);
  }
  if (!internal::LogEnabled(internal::LogLevel::kInfo)) {
    return;
  }
  const std::string fencing = std::to_string(lease.fencing_token());
  const std::string prefix = lease.token_prefix();
  const std::string waited_s = internal::LogSeconds(waited);
  const std::string handoff_s = handoff.has_value() ? internal::LogSeconds(*handoff) : "";
  if (handoff.has_value()) {
    internal::LogEvent(internal::LogLevel::kInfo, "handoff",
                       {{"key", lease.key()},
                        {"fencing_token", fencing, true},
                        {"token", prefix},
                        {"backend", backend_name()},
                        {"waited_seconds", waited_s, true},
                        {"latency_seconds", handoff_s, true}});
  } else {
    internal::LogEvent(internal::LogLevel::kInfo, "handoff",
                       {{"key", lease.key()},
                        {"fencing_token", fencing, true},
                        {"token", prefix},
                        {"backend", backend_name()},
                        {"waited_seconds", waited_s, true}});
  }
}

Result<std::optional<LeaseInfo>> Store::Inspect(std::string_view key) {
  LH_RETURN_IF_ERROR(Usable());
  LH_RETURN_IF_ERROR(ValidateKey(key));
  return core_->backend->Inspect(key);
}

Result<std::vector<LeaseInfo>> Store::List(std::string_view prefix) {
  LH_RETURN_IF_ERROR(Usable());
  if (prefix.size() > kMaxKeyBytes) {
    return Status::InvalidArgument("prefix is longer than the longest key");
  }
  return core_->backend->List(prefix);
}

Result<std::vector<LeaseInfo>> Store::Holders(std::string_view key) {
  LH_RETURN_IF_ERROR(Usable());
  LH_RETURN_IF_ERROR(ValidateKey(key));
  return core_->backend->Holders(key);
}

Result<bool> Store::ForceReleaseGrant(std::string_view key, std::string_view token_prefix) {
  LH_RETURN_IF_ERROR(Usable());
  LH_RETURN_IF_ERROR(ValidateKey(key));
  if (token_prefix.empty() || token_prefix.size() > 32 ||
      token_prefix.find_first_not_of("0123456789abcdef") != std::string_view::npos) {
    return Status::InvalidArgument(
        "a token prefix is 1..32 lowercase hex digits (the token column of leasehold status)");
  }
  LH_ASSIGN_OR_RETURN(bool existed, core_->backend->ForceReleaseGrant(key, token_prefix));
  internal::LogEvent(internal::LogLevel::kInfo, "force_released",
                     {{"key", key},
                      {"token", token_prefix},
                      {"backend", backend_name()},
                      {"result", existed ? "grant deleted" : "no such grant"}});
  return existed;
}

Result<bool> Store::ForceRelease(std::string_view key) {
  LH_RETURN_IF_ERROR(Usable());
  LH_RETURN_IF_ERROR(ValidateKey(key));
  LH_ASSIGN_OR_RETURN(bool existed, core_->backend->ForceRelease(key));
  internal::LogEvent(internal::LogLevel::kInfo, "force_released",
                     {{"key", key},
                      {"backend", backend_name()},
                      {"result", existed ? "grant deleted" : "key was free"}});
  return existed;
}

}  // namespace leasehold
