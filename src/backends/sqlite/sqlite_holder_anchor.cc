// File: backends/sqlite/sqlite_holder_anchor.cc

#include "backends/sqlite/sqlite_holder_anchor.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <random>
#include <system_error>

#include <fmt/format.h>

namespace leasehold::internal {

namespace {

constexpr std::int64_t kFirstOffset = std::int64_t{1} << 40;
constexpr std::int64_t kLastOffset = (std::int64_t{1} << 62) - 1;
// Tries before giving up on finding a byte nobody locks (a collision is a 2^-61 event).
constexpr int kTries = 8;

struct flock ByteAt(std::int64_t offset, short type) {
  struct flock lock {};

  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_start = static_cast<off_t>(offset);
  lock.l_len = 1;
  return lock;
}

}  // namespace

Result<std::unique_ptr<SqliteHolderAnchor>> SqliteHolderAnchor::Open(
    const std::string& queue_path) {
  const int fd = ::open(queue_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW);
  if (fd < 0) {
    return Status::Internal(fmt::format("cannot open {} for the holder liveness lock: {}",
                                        queue_path, std::generic_category().message(errno)));
  }
  std::random_device entropy;
  std::uniform_int_distribution<std::int64_t> pick(kFirstOffset, kLastOffset);
  int err = 0;
  for (int i = 0; i < kTries; ++i) {
    const std::int64_t offset = pick(entropy);
    struct flock lock = ByteAt(offset, F_RDLCK);
    if (::fcntl(fd, F_OFD_SETLK, &lock) == 0) {
      return std::unique_ptr<SqliteHolderAnchor>(new SqliteHolderAnchor(fd, offset));
    }
    err = errno;
    if (err != EAGAIN && err != EACCES) {
      break;
    }
  }
  ::close(fd);
  return Status::Internal(fmt::format("cannot lock a byte of {} for the holder liveness lock: {}",
                                      queue_path, std::generic_category().message(err)));
}

SqliteHolderAnchor::~SqliteHolderAnchor() {
  ::close(fd_);
}

bool SqliteHolderAnchor::Alive(std::int64_t offset) const {
  if (offset == offset_ || offset < kFirstOffset) {
    return true;  // ours (a description's own lock never conflicts with its probe), or not one
  }
  struct flock probe = ByteAt(offset, F_WRLCK);
  if (::fcntl(fd_, F_OFD_GETLK, &probe) != 0) {
    return true;
  }
  return probe.l_type != F_UNLCK;
}

}  // namespace leasehold::internal
