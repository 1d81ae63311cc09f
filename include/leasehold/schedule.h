// File: leasehold/schedule.h
//
// Schedule slots: a job that runs at most once successfully per slot of a time grid ("once per
// hour") across a fleet of hosts whose clocks disagree and whose cron or timers fire a little
// early or late. Every host tries; the first to claim the slot runs the job; the others find
// the slot running (kHeldByAnother) or done (SlotClaim::claimed() false).
//
// The rule (README, "Scheduled jobs"):
//   - The slot is named by the store's wall clock where the store has one (Redis TIME,
//     PostgreSQL clock_timestamp(), the ZooKeeper leader's transaction time; sqlite:// is on
//     this host), else by this host's wall clock (etcd://, memory://).
//   - A time up to `tolerance` before a slot boundary counts into the coming slot, so a host
//     that fires a little early does not run the slot that just ended a second time.
//   - A slot is done once a run of it succeeded (or failed, if retries are off). The record of
//     the key's last runs lives in the store beside the lease, written in the same atomic step
//     as the lease's release and only while the lease is still held, and kept for two periods
//     and the tolerance after the last run.
//   - A slot is refused if it is done, or if a later slot has already been run or tried.
// Limits: a host that fires more than `tolerance` early names the previous slot (refused if
// that slot is done); one that fires more than a period late names the next slot. A run that
// outlasts the record (two periods) can be repeated by a host that is that far behind.
//
// Example:
//
//   auto claim = store->ClaimSlot("job:invoices", {.period = 1h}, {.ttl = 30s});
//   if (!claim.ok()) return claim.status();   // kHeldByAnother: running elsewhere
//   if (!claim->claimed()) return Ok();        // done this hour already
//   Status ran = RunInvoices(claim->lease());
//   return claim->Finish({.succeeded = ran.ok()});
//
// Thread safety: plain values, and SlotClaim as Lease (one thread finishes it).

#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/lease.h"
#include "leasehold/lease_info.h"
#include "leasehold/status.h"

namespace leasehold {

// The shortest and longest periods a grid may have. A period is whole milliseconds (whole
// seconds with a zone).
inline constexpr Duration kMinSlotPeriod = std::chrono::seconds(1);
inline constexpr Duration kMaxSlotPeriod = std::chrono::hours(24 * 366);

struct SlotGrid {
  // The slot length, e.g. 15min, 1h, 24h. REQUIRES: kMinSlotPeriod <= period <= kMaxSlotPeriod.
  Duration period{};
  // Where the grid starts: slots begin at epoch + offset + k * period (in `zone`'s local time
  // when it is set: with period 24h and offset 2h, every day at 02:00 local). REQUIRES:
  // 0 <= offset < period.
  Duration offset{};
  // An IANA time zone ("Europe/Berlin") in which slots are laid out on local time, so that
  // daily slots start at local midnight (plus offset) across daylight-saving changes. Empty:
  // UTC. On a day when the clocks go back, an hourly grid repeats the repeated local hour's
  // slot name, so that hour runs once, not twice.
  std::string zone;
  // How long before a boundary a host already counts itself into the coming slot.
  // REQUIRES: 0 <= tolerance < period / 2. Default: min(period / 4, 5 min).
  std::optional<Duration> tolerance;
};

// Checks a grid's period, offset, zone and tolerance; kInvalidArgument names the bad one.
Status ValidateSlotGrid(const SlotGrid& grid);

// Returns the tolerance the grid uses (its own, or the default).
Duration SlotTolerance(const SlotGrid& grid);

// Returns the start of the slot that `now` counts into (now + tolerance, floored to the grid).
// REQUIRES: ValidateSlotGrid(grid).ok(); otherwise returns its error.
Result<SystemTime> SlotStartAt(const SlotGrid& grid, SystemTime now);

// Formats a wall-clock time as UTC with milliseconds, e.g. "2026-12-01T17:00:00.000Z".
std::string FormatSlotTime(SystemTime t);

// One recorded run of a slot.
struct SlotRun {
  // The start of the slot the run was for.
  SystemTime slot_start;
  // True if the job succeeded.
  bool succeeded = false;
  // The job's exit code (or status code) as the runner reported it.
  int exit_code = 0;
  // True if this run makes the slot done: always for a success, and for a failure when
  // retries were turned off (SlotFinish::retry_failed false).
  bool final = false;
  std::string holder;
  FencingToken fencing_token = 0;
  // The runner's wall clock when it claimed the slot and when it finished.
  SystemTime started;
  SystemTime ended;
};

// A key's recorded runs (Store::ListSlotRuns).
struct KeySlotRuns {
  std::string key;
  // Newest first.
  std::vector<SlotRun> runs;
};

// The longest SlotFinish::keep_history: a year and a day.
inline constexpr Duration kMaxKeepHistory = std::chrono::hours(24 * 366);

// How a claimed slot's run ended (SlotClaim::Finish).
struct SlotFinish {
  bool succeeded = false;
  int exit_code = 0;
  // A failed run leaves the slot open for another host or a retry. False: the failure is
  // final and the slot is done.
  bool retry_failed = true;
  // As ReleaseOptions::hold_at_least: the lease stays in the store this long after it was
  // taken. REQUIRES: 0 <= hold_at_least <= kMaxHoldAtLeast (else kInvalidArgument, and the
  // lease is released without recording the run).
  Duration hold_at_least{};
  // How long the store keeps the key's run history (this run and up to kMaxSlotHistory - 1
  // before it: Store::SlotRuns, `leasehold status`) after this run. Zero, or anything shorter:
  // two periods and the slot tolerance, the least every host firing within the slot needs.
  // REQUIRES: 0 <= keep_history <= kMaxKeepHistory (else kInvalidArgument, and the lease is
  // released without recording the run).
  Duration keep_history{};
};

// The outcome of Store::ClaimSlot: either the slot is claimed (the lease is held and the job
// may run) or it was done already.
class SlotClaim {
 public:
  SlotClaim(SlotClaim&&) noexcept = default;
  SlotClaim& operator=(SlotClaim&&) noexcept = default;
  SlotClaim(const SlotClaim&) = delete;
  SlotClaim& operator=(const SlotClaim&) = delete;
  // Releases the lease without recording the run (so the slot stays open), if not finished.
  ~SlotClaim() = default;

  // True if the slot is this caller's to run; false if it is done (see done_by()).
  [[nodiscard]] bool claimed() const { return !done_by_.has_value(); }

  // The start of the slot, and whether the store's clock named it (else the local clock).
  [[nodiscard]] SystemTime slot_start() const { return slot_start_; }

  [[nodiscard]] bool named_by_store_clock() const { return store_clock_; }

  // The run that makes the slot done (when !claimed()): this slot's, or a later slot's.
  [[nodiscard]] const std::optional<SlotRun>& done_by() const { return done_by_; }

  // The slot's lease while claimed; an empty Lease otherwise.
  [[nodiscard]] Lease& lease() { return lease_; }

  // Records the run in the key's record and releases the lease, in one atomic store step,
  // only if the lease is still held: returns kLost (nothing recorded) if it was lost, so a
  // run that may have overlapped another is never recorded as the slot's one run. A failure
  // with retry_failed is recorded as a failed attempt that does not close the slot.
  // Returns OK with nothing to do if the slot was not claimed, or on a second call.
  Status Finish(const SlotFinish& result);

 private:
  friend class Store;
  SlotClaim() = default;

  std::string key_;
  SlotGrid grid_;
  SystemTime slot_start_;
  bool store_clock_ = false;
  SystemTime started_;
  std::optional<SlotRun> done_by_;
  // The record as read under the lease, to which Finish adds this run.
  std::vector<SlotRun> history_;
  Lease lease_;
};

// The most runs a key's record keeps, newest first (SlotRuns, `leasehold status`).
inline constexpr std::size_t kMaxSlotHistory = 8;

}  // namespace leasehold
