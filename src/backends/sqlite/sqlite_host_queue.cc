// File: backends/sqlite/sqlite_host_queue.cc (internal)
//
// The shared file is one page-aligned struct (Shared); every process maps the whole of it.
// Initialization (a new file, or one left by another boot) happens under flock(LOCK_EX), so
// that exactly one process initializes the mutex and the others see it ready.

#include "backends/sqlite/sqlite_host_queue.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <ctime>
#include <utility>

#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "core/duration.h"

namespace leasehold::internal {

namespace {

// 'LHQ1'.
constexpr std::uint32_t kMagic = 0x4C485131;
constexpr std::size_t kBootIdBytes = 64;

std::string Reason(int err) {
  return std::generic_category().message(err);
}

Status QueueFileError(int err, std::string_view action, const std::string& path) {
  return SqliteFileErrorStatus(
      err, fmt::format("cannot {} the sqlite write-queue file {}: {}", action, path, Reason(err)));
}

std::size_t SlotOf(std::string_view key) {
  std::uint64_t h = 14695981039346656037ULL;  // FNV-1a
  for (const char c : key) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return static_cast<std::size_t>(h % SqliteHostQueue::kSlots);
}

timespec ToTimespec(std::chrono::nanoseconds ns) {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(ns);
  return timespec{.tv_sec = static_cast<time_t>(s.count()),
                  .tv_nsec = static_cast<long>((ns - s).count())};
}

// Absolute CLOCK_MONOTONIC (or CLOCK_REALTIME) time `timeout` from now.
timespec AbsoluteIn(clockid_t clock, Duration timeout) {
  timespec now{};
  ::clock_gettime(clock, &now);
  const std::chrono::nanoseconds abs =
      std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec) +
      std::chrono::duration_cast<std::chrono::nanoseconds>(timeout);
  return ToTimespec(abs);
}

// The inode number of this process's PID namespace (namespace inode numbers are 32-bit);
// 0 if unreadable.
std::uint32_t PidNamespace() {
  struct stat ns {};

  if (::stat("/proc/self/ns/pid", &ns) != 0) {
    return 0;
  }
  return static_cast<std::uint32_t>(ns.st_ino);
}

}  // namespace

Status SqliteFileErrorStatus(int err, std::string message) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EIO:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EINTR:
      return Status::Unavailable(std::move(message));
    case EISDIR:
    case ENAMETOOLONG:
    case ELOOP:
      return Status::InvalidArgument(std::move(message));
    default:
      // EACCES, EPERM, EROFS, ENOTDIR (a path under a regular file), ENOENT (a directory that
      // cannot hold new entries, such as /proc): the file system refuses us this path.
      return Status::PermissionDenied(std::move(message));
  }
}

struct SqliteHostQueue::Shared {
  std::uint32_t magic;
  std::uint32_t pid_namespace;  // of the process that initialized the mutex
  char boot_id[kBootIdBytes];
  alignas(64) pthread_mutex_t mutex;
  alignas(64) std::atomic<std::uint32_t> generations[kSlots];
};

static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));

Result<std::unique_ptr<SqliteHostQueue>> SqliteHostQueue::Open(const std::string& db_path,
                                                               const std::string& boot_id) {
  const std::string path = db_path + "-lhq";
  // The database file's mode, as SQLite gives its -wal and -shm files: whoever may write the
  // database may queue for it.
  mode_t mode = 0600;
  if (struct stat db{}; ::stat(db_path.c_str(), &db) == 0) {
    mode = db.st_mode & 0666;
  }
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, mode);
  if (fd >= 0) {
    (void)::fchmod(fd, mode);  // open's mode is filtered by the umask
  } else if (errno == EEXIST) {
    fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW);
  }
  if (fd < 0) {
    return QueueFileError(errno, "open", path);
  }
  auto fail = [fd, &path](int err, std::string_view action) {
    ::close(fd);
    return QueueFileError(err, action, path);
  };

  struct stat st {};

  if (::fstat(fd, &st) != 0) {
    return fail(errno, "inspect");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(
        fmt::format("the sqlite write-queue file {} is not a regular file", path));
  }
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      return fail(errno, "lock");
    }
  }
  const std::size_t size = sizeof(Shared);
  if (::fstat(fd, &st) != 0) {
    return fail(errno, "inspect");
  }
  if (static_cast<std::size_t>(st.st_size) < size &&
      ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return fail(errno, "size");
  }
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    return fail(errno, "map");
  }
  auto* shared = static_cast<Shared*>(map);
  char id[kBootIdBytes] = {};
  std::memcpy(id, boot_id.data(), std::min(boot_id.size(), kBootIdBytes - 1));
  if (shared->magic != kMagic || std::memcmp(shared->boot_id, id, kBootIdBytes) != 0) {
    // New, or from another boot: nobody of this boot holds or waits on it.
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutexattr_setprotocol(&attr, PTHREAD_PRIO_INHERIT);
    const int rc = pthread_mutex_init(&shared->mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    if (rc != 0) {
      ::munmap(map, size);
      return fail(rc, "initialize the mutex of");
    }
    for (auto& generation : shared->generations) {
      generation.store(0, std::memory_order_relaxed);
    }
    std::memcpy(shared->boot_id, id, kBootIdBytes);
    shared->pid_namespace = PidNamespace();
    // No fence needed: every process reads and writes this header only under flock(LOCK_EX),
    // whose system calls order the memory accesses on either side of them.
    shared->magic = kMagic;
  }
  const std::uint32_t pid_namespace = PidNamespace();
  const bool queue_usable = pid_namespace != 0 && shared->pid_namespace == pid_namespace;
  ::flock(fd, LOCK_UN);
  return std::unique_ptr<SqliteHostQueue>(new SqliteHostQueue(fd, shared, queue_usable));
}

SqliteHostQueue::~SqliteHostQueue() {
  ::munmap(shared_, sizeof(Shared));
  ::close(fd_);
}

Status SqliteHostQueue::Lock(Duration timeout) {
  if (!queue_usable_) {
    return Status::Ok();  // another PID namespace: SQLite's busy handler alone (see the header)
  }
  int rc = 0;
  if (timeout <= Duration::zero()) {
    rc = pthread_mutex_trylock(&shared_->mutex);
  } else {
    timespec until = AbsoluteIn(CLOCK_MONOTONIC, timeout);
#if defined(__SANITIZE_THREAD__)
    // ThreadSanitizer (gcc 12) does not intercept pthread_mutex_clocklock, so it would miss
    // the lock and report its unlock: its builds time the wait on CLOCK_REALTIME instead.
    rc = EINVAL;
#else
    rc = pthread_mutex_clocklock(&shared_->mutex, CLOCK_MONOTONIC, &until);
#endif
    if (rc == EINVAL) {
      // A kernel without FUTEX_LOCK_PI2 times PI waits on CLOCK_REALTIME only.
      until = AbsoluteIn(CLOCK_REALTIME, timeout);
      rc = pthread_mutex_timedlock(&shared_->mutex, &until);
    }
  }
  if (rc == EOWNERDEAD) {
    // The previous holder died holding it; SQLite rolls its transaction back on its own.
    rc = pthread_mutex_consistent(&shared_->mutex);
  }
  if (rc == 0) {
    return Status::Ok();
  }
  if (rc == ETIMEDOUT || rc == EBUSY) {
    return Status::Unavailable(fmt::format(
        "the sqlite write queue stayed busy for {} (busy_timeout)", FormatDuration(timeout)));
  }
  return Status::Internal(fmt::format("the sqlite write queue failed: {}", Reason(rc)));
}

void SqliteHostQueue::Unlock() {
  if (queue_usable_) {
    pthread_mutex_unlock(&shared_->mutex);
  }
}

std::uint32_t SqliteHostQueue::Generation(std::string_view key) const {
  return shared_->generations[SlotOf(key)].load(std::memory_order_seq_cst);
}

void SqliteHostQueue::Notify(std::string_view key) {
  std::atomic<std::uint32_t>& word = shared_->generations[SlotOf(key)];
  word.fetch_add(1, std::memory_order_seq_cst);
  // Shared (not FUTEX_PRIVATE_FLAG): the waiters are in other processes.
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
}

bool SqliteHostQueue::WaitChange(std::string_view key, std::uint32_t seen, Duration timeout) {
  std::atomic<std::uint32_t>& word = shared_->generations[SlotOf(key)];
  if (word.load(std::memory_order_seq_cst) != seen) {
    return true;
  }
  if (timeout <= Duration::zero()) {
    return false;
  }
  const timespec relative =
      ToTimespec(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout));
  const long rc = ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, seen,
                            &relative, nullptr, 0);
  if (rc != 0 && errno == ETIMEDOUT) {
    return word.load(std::memory_order_seq_cst) != seen;
  }
  return true;  // woken, the word changed before we slept (EAGAIN), or a signal (EINTR)
}

}  // namespace leasehold::internal
