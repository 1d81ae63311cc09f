// File: leasehold/election.h
//
// Election: leader election as a thin recipe over Store and Lease, in the manner of etcd's
// client/v3/concurrency election. The leader is whoever holds the lease "election:<name>"; its
// holder identity is the candidate id and its fencing token is the leader's *term*, so terms
// strictly increase across every leader of one election and a storage layer can fence a
// deposed leader with them (leasehold/fencing.h). An Election never touches TTLs itself: the
// lease is taken and kept exactly as Store::Acquire takes and keeps any lease
// (ElectionOptions::lease), and leadership ends exactly when that lease is lost or released.
//
// Events, per candidate (ElectionOptions::on_event):
//   kNotElected      a campaign found another leader (it goes on waiting if it has wait left)
//   kElected         this candidate became leader, with its term
//   kLostLeadership  its leadership lease was lost (expired, taken over, force-released);
//                    terminal for that Leadership: campaign again (see CampaignLoop)
//
// Example:
//
//   leasehold::Election election(*store, "billing", "worker-7", {.lease = {.ttl = 10s}});
//   auto leadership = election.Campaign();            // waits until elected
//   if (!leadership.ok()) return leadership.status();
//   while (leadership->valid()) {
//     DoLeaderWork(leadership->term(), leadership->lost_token());
//   }
//   (void)leadership->Resign();                       // hands over at once
//
// Thread safety: thread-safe (every member is immutable after construction). REQUIRES: the
// Store outlives the Election. A Leadership is a move-only handle with the thread-safety of
// Lease.

#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>

#include "leasehold/clock.h"
#include "leasehold/lease.h"
#include "leasehold/lease_info.h"
#include "leasehold/options.h"
#include "leasehold/status.h"

namespace leasehold {

class Store;

// Who leads an election, as Election::Leader() and Election::Observe() report it.
struct LeaderInfo {
  // The leader's candidate id.
  std::string id;
  // The leader's term: the fencing token of its leadership lease. Strictly increasing across
  // every leader of one election.
  FencingToken term = 0;
  // Time left before the store lets the leadership expire without renewal, when it answered.
  std::chrono::milliseconds remaining{0};
};

// What happened to one candidate (see the file comment).
enum class ElectionEvent {
  kNotElected,
  kElected,
  kLostLeadership,
};

// Returns "not elected", "elected" or "lost leadership".
std::string_view ElectionEventName(ElectionEvent event);

struct ElectionOptions {
  // How the leadership lease is taken and kept: ttl, renew_interval, drift, on_lost and
  // on_state_change are used as given. `holder` is replaced by the candidate id and `wait` by
  // Campaign's argument. Default: LeaseOptions{} (10 s TTL, renewed every ttl/3).
  LeaseOptions lease;

  // Called on every event of this candidate. `leader` is the candidate itself for kElected and
  // kLostLeadership, and the current leader (if the store said who) for kNotElected; `reason`
  // says why leadership was lost (OK otherwise). kNotElected and kElected run on the thread
  // that called Campaign; kLostLeadership runs where LeaseOptions::on_lost runs (usually the
  // heartbeat thread), with no leasehold lock held. Must not block for long. Default: none.
  std::function<void(ElectionEvent event, const LeaderInfo& leader, const Status& reason)> on_event;
};

// Leadership: the lease of an elected candidate. Move-only. While valid() the holder may act as
// the leader until safe_until(); attach term() to every write the leader makes. Destroying a
// held Leadership resigns (best effort).
class Leadership {
 public:
  // An empty leadership: not valid, Resign() is a no-op.
  Leadership() = default;
  Leadership(Leadership&&) noexcept = default;
  Leadership& operator=(Leadership&&) noexcept = default;
  Leadership(const Leadership&) = delete;
  Leadership& operator=(const Leadership&) = delete;
  ~Leadership() = default;

  // Returns the election's name.
  [[nodiscard]] const std::string& name() const { return name_; }

  // Returns this candidate's id.
  [[nodiscard]] const std::string& id() const { return id_; }

  // Returns the term: the leadership lease's fencing token.
  [[nodiscard]] FencingToken term() const { return lease_.fencing_token(); }

  // As Lease::valid(), state(), safe_until(), lost_token() and lost_reason().
  [[nodiscard]] bool valid() const { return lease_.valid(); }

  [[nodiscard]] LeaseState state() const { return lease_.state(); }

  [[nodiscard]] SteadyTime safe_until() const { return lease_.safe_until(); }

  [[nodiscard]] std::stop_token lost_token() const { return lease_.lost_token(); }

  [[nodiscard]] Status lost_reason() const { return lease_.lost_reason(); }

  // Returns the leadership lease itself (key "election:<name>").
  [[nodiscard]] const Lease& lease() const { return lease_; }

  // As Lease::Confirm(): proves with one owner-checked round trip that this candidate still
  // leads, before an action outside the store that cannot be undone. Not during a Resign() or a
  // move of the same Leadership.
  Status Confirm() { return lease_.Confirm(); }

  // Gives up leadership at once: deletes the leadership lease, which wakes the waiting
  // candidates. Returns OK, also on a second call; kLost if leadership had already been lost
  // (nothing of the next leader's is touched); kUnavailable if the store did not answer, in
  // which case leadership ends at the lease's TTL.
  Status Resign() { return lease_.Release(); }

 private:
  friend class Election;

  Leadership(std::string name, std::string id, Lease lease)
      : name_(std::move(name)), id_(std::move(id)), lease_(std::move(lease)) {}

  std::string name_;
  std::string id_;
  Lease lease_;
};

class Election {
 public:
  // An election `name` on `store`, for the candidate `candidate_id` (shown to others as the
  // leader's id: make it unique among live candidates). Both are checked by every call:
  // kInvalidArgument for an empty candidate id or one over 256 bytes, or a name that does not
  // make a valid key (KeyFor). REQUIRES: `store` outlives the Election.
  Election(Store& store, std::string name, std::string candidate_id, ElectionOptions options = {});

  // Returns the lease key of election `name`: "election:" + name.
  static std::string KeyFor(std::string_view name);

  [[nodiscard]] const std::string& name() const { return name_; }

  [[nodiscard]] const std::string& candidate_id() const { return id_; }

  // Blocks until this candidate is elected, `wait` runs out or `cancel` is requested. Returns
  // the Leadership; kHeldByAnother (wait zero) or kDeadlineExceeded if another candidate kept
  // leading; kCancelled; kInvalidArgument, kUnavailable and the like as Store::Acquire (store
  // errors while waiting are retried). Fires kNotElected once if it finds another leader, and
  // kElected on success.
  Result<Leadership> Campaign(Duration wait = kWaitForever, std::stop_token cancel = {});

  // Returns the current leader, or nullopt if there is none.
  Result<std::optional<LeaderInfo>> Leader() const;

  // Blocks until `stop` is requested, calling `on_change` with the current leader (or nullopt)
  // first and then at every change of leader, in order of term, on the calling thread. Uses the
  // store's notification where it has one (Store::notifies_changes(): memory://, redis://,
  // etcd://, zk://, postgres://) and polling with capped backoff (1 ms to 50 ms) otherwise
  // (sqlite://, and postgres:// mode=table behind a transaction pooler such as PgBouncer).
  // Changes are reported in order and never twice, but two changes that happen between two
  // reads of the store (one poll, or one notification round trip) are reported as one: the
  // term then jumps by more than one, which is how a watcher knows it missed a leader.
  // Transient store errors are retried; returns OK when stopped, or a non-retryable error
  // (kInvalidArgument, kPermissionDenied...).
  Status Observe(const std::function<void(const std::optional<LeaderInfo>&)>& on_change,
                 std::stop_token stop) const;

  // Campaigns, runs `lead` while elected, resigns when it returns, and campaigns again, until
  // `stop` is requested: a process that uses it never silently stops competing. `lead` should
  // return when leadership.lost_token() fires (or its work is done); returning kLost campaigns
  // again like OK, any other error ends the loop with that error. Returns OK when stopped;
  // a non-retryable store error otherwise. A candidate that steps down (returns OK) campaigns
  // again at once and, on a store without a fair queue, often wins again before a rival that
  // polls: for rotation, keep leading until lost, or use a fair store (zk://, postgres://
  // mode=advisory, redis:// or etcd:// with fair=true).
  Status CampaignLoop(const std::function<Status(Leadership& leadership)>& lead,
                      std::stop_token stop);

 private:
  Status Validate() const;
  void Emit(ElectionEvent event, const LeaderInfo& leader, const Status& reason) const;

  // Immutable after construction.
  Store& store_;
  const std::string name_;
  const std::string id_;
  const std::string key_;
  const ElectionOptions options_;
};

}  // namespace leasehold
