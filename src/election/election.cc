#include "leasehold/election.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "leasehold/store.h"

#include "core/backoff.h"
#include "core/key_waiter.h"
#include "core/logging.h"

namespace leasehold {

namespace {

using internal::Backoff;

constexpr std::string_view kKeyPrefix = "election:";
constexpr std::size_t kMaxCandidateIdBytes = 256;

// Observe polls like Store::Acquire waits: a local store answers in microseconds, and 50 ms
// keeps a change visible well under 100 ms.
constexpr Duration kPollBase = std::chrono::milliseconds(1);
constexpr Duration kPollCap = std::chrono::milliseconds(50);
constexpr Duration kErrorBackoffBase = std::chrono::milliseconds(50);
constexpr Duration kErrorBackoffCap = std::chrono::seconds(2);
// A store notification says "released or expired", never "acquired", and Observe subscribes
// only after reading the store: a hand-over that falls between that read and the subscription
// would wait for the next leader's own release. Re-read at least this often to bound that.
constexpr Duration kNotificationSafetyNet = std::chrono::seconds(1);

LeaderInfo ToLeader(const LeaseInfo& info) {
  return LeaderInfo{info.holder, info.fencing_token, info.remaining};
}

}  // namespace

std::string_view ElectionEventName(ElectionEvent event) {
  switch (event) {
    case ElectionEvent::kNotElected:
      return "not elected";
    case ElectionEvent::kElected:
      return "elected";
    case ElectionEvent::kLostLeadership:
      return "lost leadership";
  }
  return "unknown";
}

Election::Election(Store& store, std::string name, std::string candidate_id,
                   ElectionOptions options)
    : store_(store),
      name_(std::move(name)),
      id_(std::move(candidate_id)),
      key_(KeyFor(name_)),
      options_(std::move(options)) {}

std::string Election::KeyFor(std::string_view name) {
  return std::string(kKeyPrefix) + std::string(name);
}

Status Election::Validate() const {
  if (name_.empty()) {
    return Status::InvalidArgument("election name must not be empty");
  }
  if (Status s = ValidateKey(key_); !s.ok()) {
    return s.WithContext(fmt::format("election name makes a bad key {}", key_));
  }
  if (id_.empty()) {
    return Status::InvalidArgument("candidate id must not be empty");
  }
  if (id_.size() > kMaxCandidateIdBytes) {
    return Status::InvalidArgument(fmt::format("candidate id is {} bytes long; the limit is {}",
                                               id_.size(), kMaxCandidateIdBytes));
  }
  return Status();
}

void Election::Emit(ElectionEvent event, const LeaderInfo& leader, const Status& reason) const {
  if (options_.on_event) {
    options_.on_event(event, leader, reason);
  }
}

Result<Leadership> Election::Campaign(Duration wait, std::stop_token cancel) {
  LH_RETURN_IF_ERROR(Validate());
  LeaseOptions lease_options = options_.lease;
  lease_options.holder = id_;
  lease_options.wait = wait;
  // The lease reports its loss; we add the election's event. The term is known only once the
  // grant is made, which is before the heartbeat could ever report a loss of it in practice; a
  // loss reported in between carries term 0.
  auto term = std::make_shared<std::atomic<FencingToken>>(0);
  if (options_.on_event) {
    lease_options.on_lost = [user = options_.lease.on_lost, on_event = options_.on_event, id = id_,
                             term](const Status& reason) {
      if (user) {
        user(reason);
      }
      on_event(ElectionEvent::kLostLeadership, LeaderInfo{id, term->load(), {}}, reason);
    };
  }
  Result<Lease> lease = store_.TryAcquire(key_, lease_options);
  if (!lease.ok() && lease.error().code() == StatusCode::kHeldByAnother) {
    LeaderInfo leader;
    if (const LeaseInfo* holder = lease.error().holder(); holder != nullptr) {
      leader = ToLeader(*holder);
    }
    Emit(ElectionEvent::kNotElected, leader, Status());
    if (wait > Duration::zero()) {
      lease = store_.Acquire(key_, lease_options, std::move(cancel));
    }
  }
  if (!lease.ok()) {
    return lease.status();
  }
  term->store(lease->fencing_token());
  internal::Log(internal::LogLevel::kDebug, fmt::format("elected election={} id={} term={}", name_,
                                                        id_, lease->fencing_token()));
  Emit(ElectionEvent::kElected,
       LeaderInfo{id_, lease->fencing_token(),
                  std::chrono::duration_cast<std::chrono::milliseconds>(lease->ttl())},
       Status());
  return Leadership(name_, id_, std::move(lease).value());
}

Result<std::optional<LeaderInfo>> Election::Leader() const {
  LH_RETURN_IF_ERROR(Validate());
  LH_ASSIGN_OR_RETURN(std::optional<LeaseInfo> info, store_.Inspect(key_));
  if (!info.has_value()) {
    return std::optional<LeaderInfo>();
  }
  return std::optional<LeaderInfo>(ToLeader(*info));
}

Status Election::Observe(const std::function<void(const std::optional<LeaderInfo>&)>& on_change,
                         std::stop_token stop) const {
  LH_RETURN_IF_ERROR(Validate());
  Clock& clock = store_.clock();
  // Held, it waits on the store's notification (Store::WaitForChange); free, or on a store
  // without notification, it polls.
  internal::KeyWaiter waiter(
      clock,
      [this](SteadyTime until, std::stop_token s) {
        return store_.WaitForChange(key_, until, std::move(s));
      },
      store_.notifies_changes(), kPollBase, kPollCap);
  Backoff on_error(kErrorBackoffBase, kErrorBackoffCap);
  bool reported = false;
  // The term last reported, 0 for "no leader" (fencing tokens start at 1), and the highest
  // term reported so far.
  FencingToken last_term = 0;
  FencingToken highest_term = 0;
  while (!stop.stop_requested()) {
    Result<std::optional<LeaseInfo>> info = store_.Inspect(key_);
    if (!info.ok()) {
      if (info.error().code() != StatusCode::kUnavailable) {
        return info.status();
      }
      internal::Log(internal::LogLevel::kInfo,
                    fmt::format("observing election {}: store unavailable, retrying: {}", name_,
                                info.error().ToString()));
      clock.SleepUntil(clock.Now() + on_error.Next(), stop);
      continue;
    }
    on_error.Reset();
    const FencingToken term = info->has_value() ? (*info)->fencing_token : 0;
    // A read that returns an older term than one already reported (a lagging replica) is not
    // a change: report only forward moves, and vacancies.
    if (!reported || (term == 0 && last_term != 0) || term > highest_term) {
      std::optional<LeaderInfo> leader;
      if (info->has_value()) {
        leader = ToLeader(**info);
      }
      on_change(leader);
      reported = true;
      last_term = term;
      highest_term = std::max(highest_term, term);
      waiter.ResetPoll();
    }
    const SteadyTime now = clock.Now();
    if (info->has_value() && waiter.notifies()) {
      // Held: sleep until the holder releases or its grant expires (the store wakes us).
      Status w = waiter.AwaitStore(now + kNotificationSafetyNet, stop);
      if (w.ok() || w.code() == StatusCode::kDeadlineExceeded ||
          w.code() == StatusCode::kCancelled) {
        continue;
      }
      // kUnimplemented turned the notification off; any other failure of the wait: fall back
      // to one poll interval, never a busy loop.
    }
    // Free (the store cannot tell us when someone takes it), or a store without notification.
    waiter.SleepPoll(info->has_value() ? std::optional<Duration>((*info)->remaining) : std::nullopt,
                     now, SteadyTime::max(), stop);
  }
  return Status();
}

Status Election::CampaignLoop(const std::function<Status(Leadership& leadership)>& lead,
                              std::stop_token stop) {
  LH_RETURN_IF_ERROR(Validate());
  while (!stop.stop_requested()) {
    Result<Leadership> leadership = Campaign(kWaitForever, stop);
    if (!leadership.ok()) {
      if (leadership.error().code() == StatusCode::kCancelled) {
        return Status();
      }
      return leadership.status();
    }
    Status led = lead(*leadership);
    // Hand over at once; kLost here only repeats what `lead` was told through lost_token().
    (void)leadership->Resign();
    if (!led.ok() && led.code() != StatusCode::kLost) {
      return led;
    }
  }
  return Status();
}

}  // namespace leasehold
