// File: backends/sqlite/sqlite_host_queue.h (internal)
//
// SqliteHostQueue: what every leasehold connection to one SQLite file on this host shares
// besides the file itself, in a small file beside it (<db>-lhq, with the database file's mode)
// mapped MAP_SHARED:
//
// - The write queue: a process-shared, robust, priority-inheritance pthread mutex that a
//   connection holds from before BEGIN IMMEDIATE until after COMMIT or ROLLBACK. SQLite's busy
//   handler sleeps and retries, so a writer can lose every retry to others and fail after
//   busy_timeout; the queue makes leasehold's writers wait their turn instead. A PI futex is
//   handed by the kernel straight to its longest waiter (waiters of equal priority queue
//   first come, first served; a newcomer cannot barge), so the wait of one writer is bounded by
//   the transactions queued ahead of it. Robust: a holder that dies (kill -9) releases it; the
//   next owner is told (EOWNERDEAD), marks it consistent and goes on (SQLite rolls the dead
//   holder's transaction back itself). Waiting is a timed futex wait, bounded by busy_timeout.
//   Connections that are not leasehold's (a user's own sqlite3 handle) do not pass through the
//   queue: they still meet only SQLite's busy handler, which stays as the second line for both.
// - Change generations: kSlots 32-bit futex words; a key maps to one slot by hash. Whatever
//   can free a key (release, finish, force-release) bumps the key's slot after COMMIT and
//   wakes its waiters (FUTEX_WAKE); a waiter reads the slot before it reads the grant and
//   sleeps only while the slot still holds what it read, so a release that commits after that
//   read is never missed. Keys that share a slot wake each other (a spurious wake-up).
//
// The header records the boot id: a file from another boot (whose mutex may name a dead owner
// that was never cleaned up) is initialized afresh, under flock, by the first process to map
// it in this boot. It also records the PID namespace of that process: a PI futex names its
// owner by thread id, which means nothing in another PID namespace (two containers sharing the
// file through a volume), so a process of another namespace does not take the write queue at
// all (Lock returns at once; it meets SQLite's busy handler, as before the queue) and still
// shares the change generations (plain futex words, which need no thread ids).

//
// Thread safety: thread-safe. Lock and Unlock must be called by the same thread.

#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "leasehold/clock.h"
#include "leasehold/status.h"

namespace leasehold::internal {

// The status for a file-system error `err` (errno) on one of the store's files, with `message`:
// kUnavailable for what may pass (no space, I/O, out of descriptors), kInvalidArgument for a
// path that cannot name such a file, kPermissionDenied for a refusal of the path (EACCES,
// EPERM, EROFS, ENOTDIR, ENOENT in a directory that cannot hold new entries, ...).
Status SqliteFileErrorStatus(int err, std::string message);

class SqliteHostQueue {
 public:
  // The number of change-generation slots.
  static constexpr std::size_t kSlots = 1024;

  // Opens (creating, with the database file's mode, if missing) `db_path` + "-lhq" and maps it.
  // Returns kPermissionDenied (or kUnavailable, kInvalidArgument: as the database file's own
  // errors) if it cannot be created, sized or mapped.
  static Result<std::unique_ptr<SqliteHostQueue>> Open(const std::string& db_path,
                                                       const std::string& boot_id);

  SqliteHostQueue(const SqliteHostQueue&) = delete;
  SqliteHostQueue& operator=(const SqliteHostQueue&) = delete;
  SqliteHostQueue(SqliteHostQueue&&) = delete;
  SqliteHostQueue& operator=(SqliteHostQueue&&) = delete;
  ~SqliteHostQueue();

  // Waits for this thread's turn at the file's write lock, at most `timeout` (zero: only if
  // free now). Returns OK when held (then Unlock on this thread), kUnavailable when the wait ran
  // out, kInternal if the mutex is unusable.
  Status Lock(Duration timeout);

  // Hands the write queue to the next waiter. REQUIRES: Lock returned OK on this thread.
  void Unlock();

  // The change generation of `key`'s slot.
  [[nodiscard]] std::uint32_t Generation(std::string_view key) const;

  // Bumps `key`'s slot and wakes every waiter on it (after the change has committed).
  void Notify(std::string_view key);

  // Sleeps while `key`'s slot still reads `seen`, at most `timeout`. Returns true if the slot
  // changed (or may have: spurious wake-ups happen), false when the time ran out.
  bool WaitChange(std::string_view key, std::uint32_t seen, Duration timeout);

 private:
  struct Shared;

  SqliteHostQueue(int fd, Shared* shared, bool queue_usable)
      : fd_(fd), shared_(shared), queue_usable_(queue_usable) {}

  const int fd_;
  Shared* const shared_;
  // False in a PID namespace other than the one that initialized the file: no write queue.
  const bool queue_usable_;
};

}  // namespace leasehold::internal
