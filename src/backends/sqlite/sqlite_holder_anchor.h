// File: backends/sqlite/sqlite_holder_anchor.h (internal)
//
// SqliteHolderAnchor: what proves, to every other process of the host, that the process that
// made a grant (or a guard it forked) still lives, so that a contender can take a dead holder's
// grant at once instead of a TTL later.
//
// Each SqliteBackend takes an open file description lock (fcntl F_OFD_SETLK, a read lock) on one
// byte of the host queue's file (<db>-lhq) at an offset of its own, drawn at random from
// [2^40, 2^62) (the queue's mapped bytes are all below 2^40, and it never locks with fcntl), and
// every grant it makes records that offset (grants.live_at). The kernel drops the lock when the
// last descriptor of that description closes: when the process has exited (exit, crash, kill -9,
// OOM kill) and every process that inherited the descriptor across fork has exited or closed it
// too. So a byte nobody locks means: nobody who could still act under the grant is left. A
// contender asks with F_OFD_GETLK; nothing is written, nothing needs cleaning up, and pid reuse,
// PID namespaces and containers that share the file through a volume change nothing (the lock is
// the file's, not a pid's). `leasehold run` and `elect` keep the descriptor open in the keeper
// that owns the command's tree (supervisor.cc), so a holder whose leasehold was killed stays
// alive until its whole tree is gone.
//
// A grant without an offset (NULL: made by an older leasehold, or kept by Finish after its holder
// exited) is judged by its TTL alone, as is one whose probe fails for any reason: the anchor can
// only end a grant early when the kernel says nobody holds it, never keep one longer.
//
// Thread safety: thread-safe (Alive only reads immutable state and asks the kernel).

#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "leasehold/status.h"

namespace leasehold::internal {

class SqliteHolderAnchor {
 public:
  // Opens `queue_path` (the existing -lhq file) and locks a byte of its own. Returns kInternal
  // naming the file if it cannot be opened or no byte can be locked.
  static Result<std::unique_ptr<SqliteHolderAnchor>> Open(const std::string& queue_path);

  SqliteHolderAnchor(const SqliteHolderAnchor&) = delete;
  SqliteHolderAnchor& operator=(const SqliteHolderAnchor&) = delete;
  SqliteHolderAnchor(SqliteHolderAnchor&&) = delete;
  SqliteHolderAnchor& operator=(SqliteHolderAnchor&&) = delete;

  // Closes the descriptor: the lock ends here unless a forked process still has it.
  ~SqliteHolderAnchor();

  // The offset that this process's grants record.
  [[nodiscard]] std::int64_t offset() const { return offset_; }

  // The descriptor that holds the lock (close-on-exec); a guard forked to outlive this process
  // keeps it open.
  [[nodiscard]] int fd() const { return fd_; }

  // False only if the kernel says no process locks the byte at `offset`: the grant that
  // recorded it has nobody left. True for this anchor's own offset, and whenever the probe
  // fails.
  [[nodiscard]] bool Alive(std::int64_t offset) const;

 private:
  SqliteHolderAnchor(int fd, std::int64_t offset) : fd_(fd), offset_(offset) {}

  const int fd_;
  const std::int64_t offset_;
};

}  // namespace leasehold::internal
