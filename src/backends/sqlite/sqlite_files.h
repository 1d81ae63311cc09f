// File: backends/sqlite/sqlite_files.h (internal)
//
// The sqlite:// store's dealings with the host: the wall clock for records, errno text, the
// database file's and its directories' creation and modes, the boot id and the time namespace's
// CLOCK_BOOTTIME offset. Only the sqlite_*.cc files include it.

#pragma once

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include "backends/common/sql_statement.h"
#include "backends/sqlite/sqlite_holder_anchor.h"
#include "backends/sqlite/sqlite_host_queue.h"
#include "backends/sqlite/sqlite_schema.h"
#include "core/duration.h"

namespace leasehold::internal {

// The wall clock (CLOCK_REALTIME) in nanoseconds since the Unix epoch, for records only: a
// different time base from the Clock's on purpose (a record must outlive a reboot, and it never
// decides who holds a lease), so it is read from std::chrono::system_clock, never from the Clock.
inline std::int64_t WallNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline std::int64_t SaturatingAdd(std::int64_t a, std::int64_t b) {
  if (b > 0 && a > std::numeric_limits<std::int64_t>::max() - b) {
    return std::numeric_limits<std::int64_t>::max();
  }
  return a + b;
}

inline std::string OsReason(int err) {
  return std::generic_category().message(err);
}

// Formats a remaining or elapsed time for messages: "3.2s", "450ms", "2m0s".
inline std::string HumanDuration(std::int64_t ns) {
  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  Duration d(ns);
  if (d >= std::chrono::seconds(10)) {
    return FormatDuration(duration_cast<std::chrono::seconds>(d));
  }
  if (d >= std::chrono::seconds(1)) {
    return FormatDuration(duration_cast<milliseconds>(d) / 100 * 100);
  }
  return FormatDuration(duration_cast<milliseconds>(d));
}

inline bool IsPermissionErrno(int err) {
  return err == EACCES || err == EPERM || err == EROFS || err == ENOTDIR;
}

// The directory that holds `path` (and its -wal, -shm and -lhq files).
inline std::string DirectoryOf(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) {
    return ".";
  }
  return slash == 0 ? "/" : path.substr(0, slash);
}

// 0 if this process may create files in the directory of `path` (access(2) W_OK | X_OK), else
// the errno.
inline int DirectoryWriteErrno(const std::string& path) {
  return ::access(DirectoryOf(path).c_str(), W_OK | X_OK) == 0 ? 0 : errno;
}

// Maps a failed file-system call on `what` to a Status naming both `what` and the database.
inline Status FileSystemError(int err, std::string_view action, std::string_view what,
                              std::string_view db_path) {
  std::string message = what == db_path ? fmt::format("cannot {} the sqlite database {}: {}",
                                                      action, db_path, OsReason(err))
                                        : fmt::format("cannot {} {} for the sqlite database {}: {}",
                                                      action, what, db_path, OsReason(err));
  return SqliteFileErrorStatus(err, std::move(message));
}

// The modes of what Open creates: private to the owner, or (host scope) shared by every local
// user, the directory that holds the file sticky as /tmp is (nobody removes another's file).
struct CreateModes {
  mode_t file;
  mode_t leaf_directory;
  mode_t directory;
};

inline CreateModes ModesFor(bool host_scope) {
  return host_scope ? CreateModes{0666, 01777, 0755} : CreateModes{0600, 0700, 0700};
}

// Creates the missing directories leading to `path` with `modes` whatever the umask. Existing
// directories are left as they are. A host-scope directory that this user may not create is
// kPermissionDenied with the one command that makes it.
inline Status CreateParentDirectories(const std::string& path, bool host_scope) {
  const CreateModes modes = ModesFor(host_scope);
  const std::size_t last_slash = path.rfind('/');
  if (last_slash == std::string::npos || last_slash == 0) {
    return Status::Ok();  // In the working directory, or in "/".
  }
  const std::string dir = path.substr(0, last_slash);
  std::size_t end = dir.front() == '/' ? 1 : 0;
  while (end <= dir.size()) {
    std::size_t next = dir.find('/', end);
    if (next == std::string::npos) {
      next = dir.size();
    }
    const std::string prefix = dir.substr(0, next);
    end = next + 1;
    if (prefix.empty() || prefix.back() == '/') {
      continue;  // "a//b"
    }

    struct stat st {};

    if (::stat(prefix.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        return FileSystemError(ENOTDIR, "use the directory", prefix, path);
      }
      continue;
    }
    if (errno != ENOENT) {
      return FileSystemError(errno, "use the directory", prefix, path);
    }
    const mode_t mode = prefix == dir ? modes.leaf_directory : modes.directory;
    if (::mkdir(prefix.c_str(), mode & 0777) != 0) {
      if (errno == EEXIST) {
        continue;  // Another process made it meanwhile.
      }
      if (host_scope && IsPermissionErrno(errno)) {
        return Status::PermissionDenied(fmt::format(
            "cannot create {}, the directory of the host-wide sqlite store {}: {}; make it once "
            "as root with `install -d -m 1777 {}` (every local user then shares the store), or "
            "give a private store, e.g. --store sqlite://$HOME/.local/state/leasehold/leases.db",
            dir, path, OsReason(errno), dir));
      }
      return FileSystemError(errno, "create the directory", prefix, path);
    }
    // mkdir's mode is filtered by the umask (and takes no sticky bit everywhere): set it.
    if (::chmod(prefix.c_str(), mode) != 0) {
      return FileSystemError(errno, "set the mode of the directory", prefix, path);
    }
  }
  return Status::Ok();
}

// Creates `path` as an empty file of the scope's mode if it does not exist (before SQLite would
// create it 0644 minus the umask), and checks that an existing one is a regular file we may read
// and write. SQLite gives its -wal and -shm files the database file's mode. Returns the file's
// mode.
inline Result<mode_t> CreateOrCheckDatabaseFile(const std::string& path, bool host_scope) {
  const mode_t mode = ModesFor(host_scope).file;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, mode);
  if (fd >= 0) {
    const int rc = ::fchmod(fd, mode);
    const int err = errno;
    ::close(fd);
    if (rc != 0) {
      return FileSystemError(err, "set the mode of", path, path);
    }
    return mode;
  }
  if (errno != EEXIST) {
    return FileSystemError(errno, "create", path, path);
  }
  fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    return FileSystemError(errno, "open for reading and writing", path, path);
  }

  struct stat st {};

  const int rc = ::fstat(fd, &st);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    return FileSystemError(err, "inspect", path, path);
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(
        fmt::format("{} is not a regular file, so it cannot be a leasehold database", path));
  }
  return st.st_mode & 07777;
}

// Reads the kernel's boot id, which changes at every boot: CLOCK_BOOTTIME values from another
// boot are meaningless.
inline Result<std::string> ReadBootId() {
  const int fd = ::open(kBootIdPath, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::Internal(
        fmt::format("cannot read the kernel boot id from {}: {}", kBootIdPath, OsReason(errno)));
  }
  std::array<char, 128> buffer{};
  const ssize_t n = ::read(fd, buffer.data(), buffer.size());
  const int err = errno;
  ::close(fd);
  if (n < 0) {
    return Status::Internal(
        fmt::format("cannot read the kernel boot id from {}: {}", kBootIdPath, OsReason(err)));
  }
  std::string id(buffer.data(), static_cast<std::size_t>(n));
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) {
    id.pop_back();
  }
  if (id.empty()) {
    return Status::Internal(fmt::format("the kernel boot id in {} is empty", kBootIdPath));
  }
  return id;
}

// This process's CLOCK_BOOTTIME offset from the host's (ParseBoottimeOffsetNs). A kernel without
// time namespaces (before 5.6, or built without CONFIG_TIME_NS) has no such file, and every
// process reads the host's clock: 0.
inline Result<std::int64_t> ReadBoottimeOffsetNs() {
  const int fd = ::open(kTimensOffsetsPath, O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    return 0;
  }
  const auto refuse = [](const std::string& why) {
    return Status::Internal(fmt::format(
        "cannot read this process's time namespace offsets from {} ({}): the sqlite store "
        "shares CLOCK_BOOTTIME times between processes and must know this process's offset",
        kTimensOffsetsPath, why));
  };
  if (fd < 0) {
    return refuse(OsReason(errno));
  }
  std::array<char, 512> buffer{};
  const ssize_t n = ::read(fd, buffer.data(), buffer.size());
  const int err = errno;
  ::close(fd);
  if (n < 0) {
    return refuse(OsReason(err));
  }
  return ParseBoottimeOffsetNs(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
}

// The smallest string greater than every string starting with `prefix`, or nullopt if there is
// none (empty prefix, or only 0xFF bytes, which valid UTF-8 never contains).
inline std::optional<std::string> PrefixUpperBound(std::string_view prefix) {
  std::string bound(prefix);
  while (!bound.empty()) {
    const auto last = static_cast<unsigned char>(bound.back());
    if (last != 0xFF) {
      bound.back() = static_cast<char>(last + 1);
      return bound;
    }
    bound.pop_back();
  }
  return std::nullopt;
}

}  // namespace leasehold::internal
