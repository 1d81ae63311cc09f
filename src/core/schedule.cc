// Schedule slots (leasehold/schedule.h): the grid arithmetic, the record's text form, and the
// claim: name the slot, check the record, take the lease, check the record again under it.

#include "leasehold/schedule.h"

#include <algorithm>
#include <charconv>
#include <cstdint>

#include <fmt/format.h>

#if LEASEHOLD_WITH_ZONES
#include <absl/time/civil_time.h>
#include <absl/time/time.h>
#endif

#include "leasehold/store.h"

#include "core/duration.h"
#include "core/slot_record.h"
#include "core/store_core.h"

namespace leasehold {

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

constexpr std::string_view kRecordHeader = "leasehold-slots 1";
// A holder's name is cut to this many bytes in the record, so kMaxSlotHistory runs always fit
// in a record (backends accept up to 4096 bytes).
constexpr std::size_t kMaxRecordedHolder = 256;
constexpr Duration kMaxDefaultTolerance = std::chrono::minutes(5);

std::int64_t FloorDiv(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) {
    --q;
  }
  return q;
}

std::int64_t UnixMillis(SystemTime t) {
  return duration_cast<milliseconds>(t.time_since_epoch()).count();
}

SystemTime FromUnixMillis(std::int64_t ms) {
  return SystemTime(milliseconds(ms));
}

std::string FormatUtc(SystemTime t) {
  const std::int64_t ms = UnixMillis(t);
  const std::time_t secs = static_cast<std::time_t>(FloorDiv(ms, 1000));
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms - FloorDiv(ms, 1000) * 1000);
}

// Finds why `slot_start` may not run, given the key's recorded runs: a final run of the same
// slot, or any run of a later slot.
std::optional<SlotRun> DoneBy(const std::vector<SlotRun>& runs, SystemTime slot_start) {
  for (const SlotRun& run : runs) {
    if (run.slot_start > slot_start || (run.slot_start == slot_start && run.final)) {
      return run;
    }
  }
  return std::nullopt;
}

}  // namespace

Duration SlotTolerance(const SlotGrid& grid) {
  return grid.tolerance.value_or(std::min<Duration>(grid.period / 4, kMaxDefaultTolerance));
}

Status ValidateSlotGrid(const SlotGrid& grid) {
  using internal::FormatDuration;
  if (grid.period < kMinSlotPeriod || grid.period > kMaxSlotPeriod) {
    return Status::InvalidArgument(fmt::format(
        "a slot period must be between {} and {} (every store keeps a slot record for whole "
        "milliseconds, etcd for whole seconds), got {}",
        FormatDuration(kMinSlotPeriod), FormatDuration(kMaxSlotPeriod),
        FormatDuration(grid.period)));
  }
  if (grid.period % milliseconds(1) != Duration::zero()) {
    return Status::InvalidArgument(fmt::format("a slot period must be whole milliseconds, got {}",
                                               FormatDuration(grid.period)));
  }
  if (grid.offset < Duration::zero() || grid.offset >= grid.period) {
    return Status::InvalidArgument(
        fmt::format("a slot offset must be at least 0 and less than the period {}, got {}",
                    FormatDuration(grid.period), FormatDuration(grid.offset)));
  }
  const Duration tolerance = SlotTolerance(grid);
  if (tolerance < Duration::zero() || tolerance >= grid.period / 2) {
    return Status::InvalidArgument(fmt::format(
        "a slot tolerance must be at least 0 and less than half the period ({}), got {}",
        FormatDuration(grid.period / 2), FormatDuration(tolerance)));
  }
  if (!grid.zone.empty()) {
#if LEASEHOLD_WITH_ZONES
    if (grid.period % std::chrono::seconds(1) != Duration::zero() ||
        grid.offset % std::chrono::seconds(1) != Duration::zero()) {
      return Status::InvalidArgument(
          "with a slot zone, the period and offset must be whole seconds");
    }
    absl::TimeZone tz;
    if (!absl::LoadTimeZone(grid.zone, &tz)) {
      return Status::InvalidArgument(fmt::format(
          "unknown time zone \"{}\" (want an IANA name such as Europe/Berlin or UTC, as in "
          "/usr/share/zoneinfo)",
          grid.zone));
    }
#else
    return Status::Unimplemented("this build has no time-zone support (built without absl)");
#endif
  }
  return Status::Ok();
}

Result<SystemTime> SlotStartAt(const SlotGrid& grid, SystemTime now) {
  LH_RETURN_IF_ERROR(ValidateSlotGrid(grid));
  const std::int64_t period_ms = duration_cast<milliseconds>(grid.period).count();
  const std::int64_t offset_ms = duration_cast<milliseconds>(grid.offset).count();
  const std::int64_t t_ms =
      UnixMillis(now) + duration_cast<milliseconds>(SlotTolerance(grid)).count();
  if (grid.zone.empty()) {
    return FromUnixMillis(FloorDiv(t_ms - offset_ms, period_ms) * period_ms + offset_ms);
  }
#if LEASEHOLD_WITH_ZONES
  absl::TimeZone tz;
  absl::LoadTimeZone(grid.zone, &tz);
  // Lay the grid on local civil time: seconds since 1970-01-01 00:00 local.
  const std::int64_t t_s = FloorDiv(t_ms, 1000);
  const absl::CivilSecond local = absl::ToCivilSecond(absl::FromUnixSeconds(t_s), tz);
  const absl::CivilSecond local_epoch(1970, 1, 1, 0, 0, 0);
  const std::int64_t local_s = local - local_epoch;
  const std::int64_t period_s = period_ms / 1000;
  const std::int64_t offset_s = offset_ms / 1000;
  const std::int64_t start_local_s = FloorDiv(local_s - offset_s, period_s) * period_s + offset_s;
  // A local start that does not exist (skipped by a spring-forward) maps to the instant the
  // clocks jumped; a repeated one (fall-back) to its first occurrence.
  const absl::TimeZone::TimeInfo info = tz.At(local_epoch + start_local_s);
  const absl::Time start = info.kind == absl::TimeZone::TimeInfo::SKIPPED ? info.trans : info.pre;
  return FromUnixMillis(absl::ToUnixMillis(start));
#else
  return Status::Unimplemented("this build has no time-zone support (built without absl)");
#endif
}

namespace internal {

std::string FormatSlotRecord(const std::vector<SlotRun>& runs) {
  std::string text(kRecordHeader);
  text += '\n';
  const std::size_t n = std::min(runs.size(), kMaxSlotHistory);
  for (std::size_t i = 0; i < n; ++i) {
    const SlotRun& run = runs[i];
    std::string holder = run.holder.substr(0, kMaxRecordedHolder);
    if (holder.size() < run.holder.size()) {
      // Never cut a UTF-8 sequence in two: drop the continuation bytes and their lead byte.
      while (!holder.empty() && (static_cast<unsigned char>(holder.back()) & 0xC0) == 0x80) {
        holder.pop_back();
      }
      if (!holder.empty() && (static_cast<unsigned char>(holder.back()) & 0x80) != 0) {
        holder.pop_back();
      }
    }
    std::replace_if(
        holder.begin(), holder.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
    const char outcome = run.succeeded ? 'd' : (run.final ? 'F' : 'f');
    fmt::format_to(std::back_inserter(text), "{} {} {} {} {} {} {}\n", UnixMillis(run.slot_start),
                   outcome, run.exit_code, run.fencing_token, UnixMillis(run.started),
                   UnixMillis(run.ended), holder);
  }
  return text;
}

Result<std::vector<SlotRun>> ParseSlotRecord(std::string_view text) {
  auto bad = [](std::string_view why) {
    return Status::Internal(fmt::format("the key's slot record is not understood: {}", why));
  };
  if (!text.starts_with(kRecordHeader) || text.size() < kRecordHeader.size() + 1 ||
      text[kRecordHeader.size()] != '\n') {
    return bad("no \"leasehold-slots 1\" header");
  }
  text.remove_prefix(kRecordHeader.size() + 1);
  std::vector<SlotRun> runs;
  while (!text.empty()) {
    const std::size_t eol = text.find('\n');
    if (eol == std::string_view::npos) {
      return bad("a line without its end");
    }
    std::string_view line = text.substr(0, eol);
    text.remove_prefix(eol + 1);
    // Six numeric fields (the second one a letter), then the holder: the rest of the line.
    std::int64_t fields[6] = {};
    char outcome = 0;
    for (int i = 0; i < 6; ++i) {
      const std::size_t space = line.find(' ');
      if (space == std::string_view::npos) {
        return bad("a line with too few fields");
      }
      std::string_view field = line.substr(0, space);
      line.remove_prefix(space + 1);
      if (i == 1) {
        if (field.size() != 1 || (field[0] != 'd' && field[0] != 'f' && field[0] != 'F')) {
          return bad("an unknown outcome");
        }
        outcome = field[0];
        continue;
      }
      auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), fields[i]);
      if (ec != std::errc() || end != field.data() + field.size()) {
        return bad("a field that is not a number");
      }
    }
    // Times within ±3000 years of the epoch, so that milliseconds convert to SystemTime's
    // nanoseconds without overflow.
    constexpr std::int64_t kMaxMillis = 100'000'000'000'000;
    auto time_ok = [&](std::int64_t ms) { return ms >= -kMaxMillis && ms <= kMaxMillis; };
    if (fields[2] < INT32_MIN || fields[2] > INT32_MAX || fields[3] < 0 || !time_ok(fields[0]) ||
        !time_ok(fields[4]) || !time_ok(fields[5])) {
      return bad("a field out of range");
    }
    SlotRun run;
    run.slot_start = FromUnixMillis(fields[0]);
    run.succeeded = outcome == 'd';
    run.final = outcome != 'f';
    run.exit_code = static_cast<int>(fields[2]);
    run.fencing_token = static_cast<FencingToken>(fields[3]);
    run.started = FromUnixMillis(fields[4]);
    run.ended = FromUnixMillis(fields[5]);
    run.holder = std::string(line);
    runs.push_back(std::move(run));
    if (runs.size() > kMaxSlotHistory) {
      return bad("too many runs");
    }
  }
  return runs;
}

}  // namespace internal

Status SlotClaim::Finish(const SlotFinish& result) {
  if (!claimed() || !lease_.core_) {
    return Status::Ok();
  }
  if (result.keep_history < Duration::zero() || result.keep_history > kMaxKeepHistory) {
    Status released = lease_.Release();
    return Status::InvalidArgument(fmt::format(
        "keep_history must be between 0 and {}, got {} (the lease was released, the run not "
        "recorded: {})",
        internal::FormatDuration(kMaxKeepHistory), internal::FormatDuration(result.keep_history),
        released.ToString()));
  }
  if (result.hold_at_least < Duration::zero() || result.hold_at_least > kMaxHoldAtLeast) {
    // As Lease::Release(ReleaseOptions): released all the same, the run not recorded.
    Status released = lease_.Release();
    return Status::InvalidArgument(fmt::format(
        "hold_at_least must be between 0 and {}, got {} (the lease was released, the run not "
        "recorded: {})",
        internal::FormatDuration(kMaxHoldAtLeast), internal::FormatDuration(result.hold_at_least),
        released.ToString()));
  }
  SlotRun run;
  run.slot_start = slot_start_;
  run.succeeded = result.succeeded;
  run.exit_code = result.exit_code;
  run.final = result.succeeded || !result.retry_failed;
  run.holder = lease_.core_->holder();
  run.fencing_token = lease_.fencing_token();
  run.started = started_;
  run.ended = std::chrono::system_clock::now();
  std::vector<SlotRun> runs;
  runs.reserve(history_.size() + 1);
  runs.push_back(std::move(run));
  // Newest first; older runs of this key's other grids or of earlier slots stay as history.
  for (SlotRun& old : history_) {
    runs.push_back(std::move(old));
  }
  history_.clear();
  // Kept for two periods and the tolerance after this run at least: longer than any host that
  // fires within the slot (or up to a period late) needs to find it; longer if asked.
  const Duration record_ttl =
      std::max<Duration>(2 * grid_.period + SlotTolerance(grid_), result.keep_history);
  const SteadyTime keep_until = lease_.core_->granted_at() + result.hold_at_least;
  return lease_.Finish(result.hold_at_least > Duration::zero() ? keep_until : SteadyTime::min(),
                       internal::FormatSlotRecord(runs), record_ttl);
}

Result<std::vector<SlotRun>> Store::SlotRuns(std::string_view key) {
  LH_RETURN_IF_ERROR(Usable());
  LH_RETURN_IF_ERROR(ValidateKey(key));
  LH_ASSIGN_OR_RETURN(std::optional<std::string> record, core_->backend->ReadRecord(key));
  if (!record.has_value()) {
    return std::vector<SlotRun>();
  }
  return internal::ParseSlotRecord(*record);
}

Result<std::vector<KeySlotRuns>> Store::ListSlotRuns(std::string_view prefix) {
  LH_RETURN_IF_ERROR(Usable());
  LH_ASSIGN_OR_RETURN(auto records, core_->backend->ListRecords(prefix));
  std::vector<KeySlotRuns> out;
  out.reserve(records.size());
  for (auto& [key, text] : records) {
    Result<std::vector<SlotRun>> runs = internal::ParseSlotRecord(text);
    if (!runs.ok()) {
      return runs.status().WithContext(fmt::format("key {}", key));
    }
    out.push_back({std::move(key), std::move(runs).value()});
  }
  return out;
}

Result<SlotClaim> Store::ClaimSlot(std::string_view key, const SlotGrid& grid,
                                   const LeaseOptions& options, std::stop_token cancel) {
  LH_RETURN_IF_ERROR(Usable());
  LH_RETURN_IF_ERROR(ValidateKey(key));
  LH_RETURN_IF_ERROR(ValidateSlotGrid(grid));
  internal::Backend& backend = *core_->backend;
  LH_ASSIGN_OR_RETURN(internal::StoreTime now, backend.WallClock());
  LH_ASSIGN_OR_RETURN(SystemTime slot_start, SlotStartAt(grid, now.time));
  SlotClaim claim;
  claim.key_ = std::string(key);
  claim.grid_ = grid;
  claim.slot_start_ = slot_start;
  claim.store_clock_ = now.from_store;
  // Look before taking the lease: the hosts that come after the slot's run find it done
  // without touching the lease (or its fencing counter).
  LH_ASSIGN_OR_RETURN(std::vector<SlotRun> runs, SlotRuns(key));
  if (std::optional<SlotRun> done = DoneBy(runs, slot_start); done.has_value()) {
    claim.done_by_ = std::move(done);
    return claim;
  }
  LH_ASSIGN_OR_RETURN(Lease lease, options.wait == Duration::zero()
                                       ? TryAcquire(key, options)
                                       : Acquire(key, options, std::move(cancel)));
  // After a wait, the slot named before it may have ended meanwhile: name it again, so that a
  // host that waited out a long run claims the slot it now stands in, never a past one.
  if (options.wait != Duration::zero()) {
    Result<internal::StoreTime> later = backend.WallClock();
    Result<SystemTime> later_slot =
        later.ok() ? SlotStartAt(grid, later->time) : Result<SystemTime>(later.status());
    if (!later_slot.ok()) {
      (void)lease.Release();
      return later_slot.status();
    }
    claim.slot_start_ = std::max(slot_start, *later_slot);
  }
  // Again under the lease: the run may have finished between the look and the grant. Only the
  // lease's holder writes the record, so what is read now stays true until Finish.
  Result<std::vector<SlotRun>> held_runs = SlotRuns(key);
  if (!held_runs.ok()) {
    (void)lease.Release();
    return held_runs.status();
  }
  if (std::optional<SlotRun> done = DoneBy(*held_runs, claim.slot_start_); done.has_value()) {
    (void)lease.Release();
    claim.done_by_ = std::move(done);
    return claim;
  }
  claim.history_ = std::move(held_runs).value();
  claim.started_ = std::chrono::system_clock::now();
  claim.lease_ = std::move(lease);
  return claim;
}

std::string FormatSlotTime(SystemTime t) {
  return FormatUtc(t);
}

}  // namespace leasehold
