// File: backends/sqlite/sqlite_doctor.cc (internal)
//
// The sqlite:// store's doctor facet: the write lock's round trip, and what the file, its file
// system and its sharers say about durability, topology and permissions.

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
#include "backends/sqlite/sqlite_backend.h"
#include "backends/sqlite/sqlite_connection.h"
#include "backends/sqlite/sqlite_holder_anchor.h"
#include "backends/sqlite/sqlite_host_queue.h"
#include "core/duration.h"

namespace leasehold::internal {

namespace {

// The file systems a database must not be on, by statfs f_type (linux/magic.h; spelt out so
// that no kernel header is needed). SQLite's locking (POSIX advisory locks) and WAL's shared
// memory (an mmap of the -shm file) are only as good as the file system's: on network file
// systems locks are often broken or missing, and WAL does not work across hosts at all
// (https://www.sqlite.org/lockingv3.html, "How To Corrupt Your Database Files";
// https://www.sqlite.org/wal.html). Two holders of one key are then possible. FUSE is listed
// because its locking and mmap are the FUSE daemon's own and most FUSE file systems in use for
// databases are network ones (sshfs, s3fs, GlusterFS); the f_type does not say which.
struct FileSystemKind {
  std::int64_t magic;
  std::string_view name;
};

constexpr FileSystemKind kNetworkFileSystems[] = {
    {0x6969, "NFS"},        {0x517B, "SMB"},      {0xFF534D42, "CIFS"}, {0xFE534D42, "SMB2"},
    {0x65735546, "FUSE"},   {0x01021997, "9p"},   {0x00C36400, "Ceph"}, {0x5346414F, "AFS"},
    {0x0BD00BD0, "Lustre"}, {0x73757245, "Coda"}, {0x01161970, "GFS2"}, {0x7461636F, "OCFS2"},
};

// File systems that do not outlive a reboot: the fencing counters would start again at 1.
constexpr FileSystemKind kVolatileFileSystems[] = {
    {0x01021994, "tmpfs"},
    {0x858458F6, "ramfs"},
};

constexpr FileSystemKind kLocalFileSystems[] = {
    {0xEF53, "ext2/3/4"}, {0x58465342, "xfs"},       {0x9123683E, "btrfs"},
    {0x2FC12FC1, "zfs"},  {0x794C7630, "overlayfs"}, {0xF2F52010, "f2fs"},
};

std::optional<std::string_view> FileSystemName(std::span<const FileSystemKind> kinds,
                                               std::int64_t magic) {
  for (const FileSystemKind& kind : kinds) {
    if (kind.magic == magic) {
      return kind.name;
    }
  }
  return std::nullopt;
}

// Diagnose's finding about the file system that holds `path`.
CheckItem FileSystemItem(const std::string& path) {
  CheckItem item{.area = "durability"};

  struct statfs fs {};

  if (::statfs(path.c_str(), &fs) != 0) {
    item.verdict = CheckVerdict::kWarn;
    item.found = fmt::format("the file system of {} could not be read: {}", path, OsReason(errno));
    item.fix = "make sure it is a local disk file system (not NFS, SMB, FUSE or tmpfs)";
    return item;
  }
  const auto magic = static_cast<std::int64_t>(static_cast<std::uint32_t>(fs.f_type));
  constexpr std::string_view kLocalFix =
      "move the database to a local disk file system (ext4, xfs, btrfs): sqlite:///path/on/disk";
  if (auto name = FileSystemName(kNetworkFileSystems, magic)) {
    item.verdict = CheckVerdict::kUnsafe;
    item.found = fmt::format(
        "{} is on {} (a network or FUSE file system): SQLite's locking is "
        "unreliable there, so two holders of one key are possible",
        path, *name);
    item.fix = std::string(kLocalFix);
  } else if (auto name = FileSystemName(kVolatileFileSystems, magic)) {
    item.verdict = CheckVerdict::kUnsafe;
    item.found = fmt::format(
        "{} is on {}: the file, and with it every fencing counter, is gone "
        "after a reboot, so fencing tokens start again at 1",
        path, *name);
    item.fix = std::string(kLocalFix);
  } else {
    auto local = FileSystemName(kLocalFileSystems, magic);
    item.found = local ? fmt::format("{} is on a local file system ({})", path, *local)
                       : fmt::format(
                             "{} is on a file system (f_type {:#x}) that is not a known "
                             "network or volatile one",
                             path, magic);
  }
  return item;
}

// Diagnose's finding about journal_mode and synchronous.
CheckItem JournalItem(const std::string& journal_mode, std::int64_t synchronous) {
  CheckItem item{.area = "durability"};
  constexpr std::string_view kNames[] = {"OFF", "NORMAL", "FULL", "EXTRA"};
  const std::string_view level =
      synchronous >= 0 && synchronous <= 3 ? kNames[synchronous] : std::string_view("unknown");
  if (journal_mode != "wal") {
    // Open switches every file to WAL and refuses one that will not switch: not expected here.
    item.verdict = CheckVerdict::kUnsafe;
    item.found =
        fmt::format("journal_mode {} (synchronous {}): leasehold expects WAL", journal_mode, level);
    item.fix =
        "reopen the store (leasehold switches the file to WAL) and keep other programs "
        "from changing its journal mode";
    return item;
  }
  if (synchronous >= 2) {
    item.found = fmt::format(
        "journal_mode wal, synchronous {}: every grant, renewal and fencing counter bump is on "
        "disk before it returns",
        level);
    return item;
  }
  // NORMAL is unsafe, not a warning: in WAL mode a power loss may roll back the last commits,
  // and with them a fencing counter bump, so after the reboot the same fencing token is handed
  // out again (check.h: "fencing counters that a restart resets"). OFF is worse. Configure sets
  // FULL and no URL parameter lowers it, so this reports a connection changed behind our back.
  item.verdict = CheckVerdict::kUnsafe;
  item.found = fmt::format(
      "journal_mode wal, synchronous {}: a power loss can lose the last grants and fencing "
      "counter bumps, so a fencing token can be handed out twice",
      level);
  item.fix =
      "unexpected, since leasehold sets synchronous = FULL on its own connection: report it "
      "with the output of --json";
  return item;
}

// Diagnose's permission finding: access(2) for the file (read and write), its host queue file
// and its directory (write and search: the -wal, -shm and -lhq files are made there).
CheckItem AccessItem(const std::string& path, const std::string& fix) {
  CheckItem item{.area = "permissions"};
  const std::string dir = DirectoryOf(path);

  struct Need {
    std::string what;
    int mode;
    bool optional;
  };

  const Need needs[] = {
      {path, R_OK | W_OK, false}, {path + "-lhq", R_OK | W_OK, true}, {dir, W_OK | X_OK, false}};
  for (const Need& need : needs) {
    if (::access(need.what.c_str(), need.mode) != 0) {
      const int err = errno;
      if (need.optional && err == ENOENT) {
        continue;
      }
      item.verdict = CheckVerdict::kPermissionDenied;
      item.found = fmt::format("{} is not writable by this user (uid {}): {}", need.what,
                               ::getuid(), OsReason(err));
      item.fix = fix;
      return item;
    }
  }
  item.found =
      fmt::format("{} and its directory are writable by this user (uid {})", path, ::getuid());
  return item;
}

// Diagnose's topology finding: who shares the file. A private file excludes nothing of another
// user's: their leasehold commands use a store of their own unless they name this file.
CheckItem TopologyItem(const std::string& path, StoreScope scope) {
  CheckItem item{.area = "topology"};

  struct stat st {};

  const bool known = ::stat(path.c_str(), &st) == 0;
  const std::string mode =
      known ? fmt::format("mode {:04o}, owner uid {}", st.st_mode & 07777, st.st_uid)
            : std::string("mode unknown");
  if (scope == StoreScope::kHost) {
    item.found = fmt::format(
        "this host: every local user who runs leasehold with this store shares it ({}); other "
        "hosts cannot",
        mode);
    return item;
  }
  item.verdict = CheckVerdict::kWarn;
  item.found = fmt::format(
      "this user on this host: only processes that may write {} share it ({}); another user's "
      "leasehold run with the default store does not see these leases",
      path, mode);
  item.fix =
      "for one lease per host whoever runs the job, use the host-wide store (the default, "
      "sqlite:///var/lib/leasehold/leases.db?scope=host); for one per fleet, a server store";
  return item;
}

}  // namespace

Status SqliteBackend::Ping() {
  MutexLock lock(&mu_);
  // Through the host's write queue, as every lease operation: the probe measures what a
  // renewal's transaction costs, minus its statement. An empty transaction writes nothing.
  WriteTransaction transaction(*connection_);
  LH_RETURN_IF_ERROR(transaction.Begin("ping"));
  return transaction.Commit("ping");
}

Result<Diagnosis> SqliteBackend::Diagnose() {
  const std::string fix =
      fmt::format("the file {} and its directory must be writable by this user", path_);
  Diagnosis diagnosis{.probe = "BEGIN IMMEDIATE/COMMIT", .permissions_fix = fix};
  {
    MutexLock lock(&mu_);
    LH_ASSIGN_OR_RETURN(SqliteConnection::Durability durability, connection_->ReadDurability());
    diagnosis.items.push_back(JournalItem(durability.journal_mode, durability.synchronous));
  }
  diagnosis.items.push_back(FileSystemItem(path_));
  diagnosis.items.push_back(TopologyItem(path_, scope_));
  diagnosis.items.push_back(AccessItem(path_, fix));
  return diagnosis;
}

}  // namespace leasehold::internal
