// File: leasehold/fencing.h
//
// Fencing helpers for the storage side (header-only; MakeEtcdFenceGuard(const Lease&) needs only
// the library that gave you the Lease). A TTL cannot stop a holder that was paused (GC, SIGSTOP,
// a VM freeze) from writing after it wakes; the fencing token can, if the storage layer keeps one
// rule for every write it accepts:
//
//   accept a write only if its token is >= the highest token seen for that record, and record
//   the token in the same atomic step.
//
// ">=" rather than ">" lets one holder make many writes under one grant. This file gives that
// rule for three kinds of storage, without linking any of their client libraries:
//
//   - SQL (PostgreSQL, SQLite): a `lock_version` column. BuildFencedUpdate/BuildFencedUpsert
//     build the guarded statement and its parameters; run them with your driver (libpq's
//     PQexecParams, sqlite3_bind_text...), then CheckFencedRows(rows affected): 0 rows means
//     "fenced out".
//   - Files or blob stores: FencedDirectory, a conditional write into a local directory (lock,
//     compare the recorded token, write a temp file, rename). Object stores with conditional
//     puts follow the same shape: read the recorded token and its ETag, refuse a lower token,
//     put with If-Match on that ETag, retry on a precondition failure.
//   - Data kept in etcd: EtcdFenceGuard (MakeEtcdFenceGuard(lease)), the Txn compare "the
//     lease's etcd key still has the create revision I was granted" that the writer adds to its
//     own transaction. (Lease::Write, leasehold/fenced_write.h, sends that Txn itself.)
//
// Example (PostgreSQL):
//
//   auto stmt = leasehold::BuildFencedUpdate({.table = "invoices", .id = "2026-11",
//                                             .set = {{"status", "sent"}},
//                                             .token = lease->fencing_token()});
//   // PQexecParams(conn, stmt->text.c_str(), n, nullptr, values-of(stmt->params), ...)
//   leasehold::Status s = leasehold::CheckFencedRows(std::atoll(PQcmdTuples(res)), token);
//   if (s.code() == leasehold::StatusCode::kLost) { /* a newer holder wrote: stop */ }
//
// Thread safety: functions are pure; FencedDirectory is thread-safe and safe across processes
// (an flock(2) per record), on a local file system.

#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <sys/file.h>
#include <sys/stat.h>

#include "leasehold/lease.h"
#include "leasehold/lease_info.h"
#include "leasehold/status.h"

namespace leasehold {

// Returns true if a write carrying `token` may be accepted by a record whose highest accepted
// token is `highest_seen` (the rule above).
inline bool FenceAdmits(FencingToken highest_seen, FencingToken token) {
  return token >= highest_seen;
}

// ---------------------------------------------------------------------------------------------
// SQL: the lock_version column.
//
// Schema (PostgreSQL; SQLite the same with INTEGER):
//
//   ALTER TABLE invoices ADD COLUMN lock_version bigint NOT NULL DEFAULT 0;
//
// Every write guarded by a lease then goes through one statement:
//
//   UPDATE "invoices" SET "status" = $1, "lock_version" = $2
//    WHERE "id" = $3 AND "lock_version" <= $2
//
// A write from a stale holder matches no row, because a newer holder already stored a higher
// lock_version: the database rejects it atomically, whatever the clocks did.

enum class SqlDialect {
  // $1, $2... (libpq PQexecParams, pgx, psycopg's server-side binding).
  kPostgres,
  // ?1, ?2... (sqlite3_bind_*; the number is the bind index).
  kSqlite,
};

// A statement and its parameters, all passed as text: PostgreSQL infers each parameter's type
// from its column, SQLite applies the column's affinity. params[i] binds placeholder i+1.
struct SqlStatement {
  std::string text;
  std::vector<std::string> params;
};

struct FencedUpdate {
  // The table, and its key and version columns. Identifiers are quoted ("..."), so they are
  // taken verbatim: no schema qualification through dots (use `schema` for that).
  std::string schema;  // Default: none (the search path)
  std::string table;
  std::string id_column = "id";
  std::string version_column = "lock_version";
  // The row to write.
  std::string id;
  // Columns to set, with their new values (as text).
  std::vector<std::pair<std::string, std::string>> set;
  // The writer's fencing token (Lease::fencing_token(), Leadership::term()).
  FencingToken token = 0;
  SqlDialect dialect = SqlDialect::kPostgres;
};

namespace internal_fencing {

inline Status QuoteIdentifier(std::string_view name, std::string& out) {
  if (name.empty()) {
    return Status::InvalidArgument("SQL identifier must not be empty");
  }
  if (name.find('\0') != std::string_view::npos) {
    return Status::InvalidArgument("SQL identifier must not contain a NUL byte");
  }
  out += '"';
  for (char c : name) {
    if (c == '"') {
      out += '"';  // "" is a literal " inside a quoted identifier
    }
    out += c;
  }
  out += '"';
  return Status();
}

inline std::string Placeholder(SqlDialect dialect, std::size_t n) {
  return (dialect == SqlDialect::kPostgres ? "$" : "?") + std::to_string(n);
}

inline Status CheckUpdate(const FencedUpdate& u) {
  if (u.set.empty()) {
    return Status::InvalidArgument("a fenced update must set at least one column");
  }
  // bigint is signed; fencing tokens never get near 2^63 in practice, but say so if they do.
  if (u.token > static_cast<FencingToken>(std::numeric_limits<std::int64_t>::max())) {
    return Status::InvalidArgument("fencing token does not fit a signed 64-bit column");
  }
  for (const auto& [column, value] : u.set) {
    if (column == u.version_column || column == u.id_column) {
      return Status::InvalidArgument("a fenced update sets the key and version columns itself");
    }
  }
  return Status();
}

inline Status QualifiedTable(const FencedUpdate& u, std::string& out) {
  if (!u.schema.empty()) {
    if (Status s = QuoteIdentifier(u.schema, out); !s.ok()) {
      return s;
    }
    out += '.';
  }
  return QuoteIdentifier(u.table, out);
}

}  // namespace internal_fencing

// Builds
//   UPDATE t SET c1 = $1, ..., lock_version = $k WHERE id = $k+1 AND lock_version <= $k
// Returns kInvalidArgument for an empty or NUL-bearing identifier, no column to set, a column
// that is the key or version column, or a token above INT64_MAX.
inline Result<SqlStatement> BuildFencedUpdate(const FencedUpdate& u) {
  using internal_fencing::Placeholder;
  using internal_fencing::QuoteIdentifier;
  if (Status s = internal_fencing::CheckUpdate(u); !s.ok()) {
    return s;
  }
  SqlStatement out;
  out.text = "UPDATE ";
  if (Status s = internal_fencing::QualifiedTable(u, out.text); !s.ok()) {
    return s;
  }
  out.text += " SET ";
  for (const auto& [column, value] : u.set) {
    if (Status s = QuoteIdentifier(column, out.text); !s.ok()) {
      return s;
    }
    out.params.push_back(value);
    out.text += " = " + Placeholder(u.dialect, out.params.size()) + ", ";
  }
  out.params.push_back(std::to_string(u.token));
  const std::string token_ph = Placeholder(u.dialect, out.params.size());
  std::string version;
  if (Status s = QuoteIdentifier(u.version_column, version); !s.ok()) {
    return s;
  }
  out.text += version + " = " + token_ph + " WHERE ";
  if (Status s = QuoteIdentifier(u.id_column, out.text); !s.ok()) {
    return s;
  }
  out.params.push_back(u.id);
  out.text +=
      " = " + Placeholder(u.dialect, out.params.size()) + " AND " + version + " <= " + token_ph;
  return out;
}

// Builds the insert-or-update form, for records that may not exist yet (REQUIRES a unique
// index on the key column):
//   INSERT INTO t (id, c1, ..., lock_version) VALUES ($1, $2, ..., $k)
//   ON CONFLICT (id) DO UPDATE SET c1 = excluded.c1, ..., lock_version = excluded.lock_version
//   WHERE t.lock_version <= excluded.lock_version
// Works on PostgreSQL >= 9.5 and SQLite >= 3.24. Errors as BuildFencedUpdate.
inline Result<SqlStatement> BuildFencedUpsert(const FencedUpdate& u) {
  using internal_fencing::Placeholder;
  using internal_fencing::QuoteIdentifier;
  if (Status s = internal_fencing::CheckUpdate(u); !s.ok()) {
    return s;
  }
  std::string table;
  if (Status s = internal_fencing::QualifiedTable(u, table); !s.ok()) {
    return s;
  }
  std::vector<std::string> columns;  // quoted
  std::vector<std::string> params;
  auto add = [&](std::string_view column, std::string value) {
    std::string quoted;
    Status s = QuoteIdentifier(column, quoted);
    columns.push_back(std::move(quoted));
    params.push_back(std::move(value));
    return s;
  };
  if (Status s = add(u.id_column, u.id); !s.ok()) {
    return s;
  }
  for (const auto& [column, value] : u.set) {
    if (Status s = add(column, value); !s.ok()) {
      return s;
    }
  }
  if (Status s = add(u.version_column, std::to_string(u.token)); !s.ok()) {
    return s;
  }
  SqlStatement out;
  out.text = "INSERT INTO " + table + " (";
  std::string values;
  for (std::size_t i = 0; i < columns.size(); ++i) {
    out.text += (i > 0 ? ", " : "") + columns[i];
    values += (i > 0 ? ", " : "") + Placeholder(u.dialect, i + 1);
  }
  out.text += ") VALUES (" + values + ") ON CONFLICT (" + columns.front() + ") DO UPDATE SET ";
  for (std::size_t i = 1; i < columns.size(); ++i) {
    out.text += (i > 1 ? ", " : "") + columns[i] + " = excluded." + columns[i];
  }
  out.text += " WHERE " + table + "." + columns.back() + " <= excluded." + columns.back();
  out.params = std::move(params);
  return out;
}

// Interprets the row count of a fenced statement. Returns OK if it touched a row; kLost
// ("fenced out") if it touched none: a write with a higher token was accepted first (for
// BuildFencedUpdate, also when the row does not exist). A fenced-out writer has lost its lease
// whatever its own clock says: it must stop, not retry.
inline Status CheckFencedRows(long long rows_affected, FencingToken token) {
  if (rows_affected > 0) {
    return Status();
  }
  return Status::Lost(
      "fenced out: the store already accepted a write with a fencing token "
      "higher than " +
      std::to_string(token) + " (or the row does not exist)");
}

// ---------------------------------------------------------------------------------------------
// Files: a conditional write into a local directory.

// FencedDirectory writes whole files ("records") into one local directory, each guarded by the
// fencing rule. For record NAME it keeps:
//   NAME                the data, replaced atomically (temp file + rename)
//   .NAME.fence         the highest token accepted, replaced atomically
//   .NAME.lock          an flock(2) held for the compare-and-write, so writers in several
//                       processes on this host are serialized
// Write() records the token *before* it renames the data into place: a crash in between
// leaves a token without its data, which refuses stale writers (safe) and only asks the
// current holder to write again.
//
// Not for network file systems whose flock is advisory across hosts or absent.
class FencedDirectory {
 public:
  // REQUIRES: `dir` exists and is writable.
  explicit FencedDirectory(std::string dir) : dir_(std::move(dir)) {}

  // Writes `data` as record `name` if `token` >= the highest token accepted for it, and
  // records `token`. Returns OK; kLost ("fenced out") if a higher token was accepted before,
  // and nothing is written; kInvalidArgument for a bad name (empty, over 200 bytes, a '/' or
  // NUL, or a leading '.'); kPermissionDenied or kUnavailable for I/O errors.
  Status Write(std::string_view name, std::string_view data, FencingToken token) const {
    if (Status s = CheckName(name); !s.ok()) {
      return s;
    }
    const std::string record = dir_ + "/" + std::string(name);
    const std::string meta = dir_ + "/." + std::string(name);
    const int lock = ::open((meta + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock < 0) {
      return IoError("open lock file", meta + ".lock");
    }

    struct Unlock {
      int fd;

      ~Unlock() { ::close(fd); }  // closing drops the flock
    } unlock{lock};

    while (::flock(lock, LOCK_EX) != 0) {
      if (errno != EINTR) {
        return IoError("flock", meta + ".lock");
      }
    }
    FencingToken highest = 0;
    if (Status s = ReadToken(meta + ".fence", highest); !s.ok()) {
      return s;
    }
    if (!FenceAdmits(highest, token)) {
      return Status::Lost("fenced out: " + std::string(name) + " already accepted fencing token " +
                          std::to_string(highest) + ", refusing a write with token " +
                          std::to_string(token));
    }
    if (token != highest) {
      if (Status s = ReplaceFile(meta + ".fence", std::to_string(token) + "\n"); !s.ok()) {
        return s;
      }
    }
    return ReplaceFile(record, data);
  }

  // Returns the highest token accepted for `name`, 0 if none.
  Result<FencingToken> HighestToken(std::string_view name) const {
    if (Status s = CheckName(name); !s.ok()) {
      return s;
    }
    FencingToken highest = 0;
    if (Status s = ReadToken(dir_ + "/." + std::string(name) + ".fence", highest); !s.ok()) {
      return s;
    }
    return highest;
  }

  [[nodiscard]] const std::string& dir() const { return dir_; }

 private:
  static Status CheckName(std::string_view name) {
    if (name.empty() || name.size() > 200 || name.front() == '.' ||
        name.find_first_of(std::string_view("/\0", 2)) != std::string_view::npos) {
      return Status::InvalidArgument(
          "record name must be 1..200 bytes, without '/', NUL or a leading '.'");
    }
    return Status();
  }

  static Status IoError(std::string_view what, const std::string& path) {
    const int err = errno;
    std::string message = std::string(what) + " " + path + ": " + std::strerror(err);
    if (err == EACCES || err == EPERM || err == EROFS) {
      return Status::PermissionDenied(std::move(message));
    }
    return Status::Unavailable(std::move(message));
  }

  static Status ReadToken(const std::string& path, FencingToken& out) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) {
        out = 0;
        return Status();
      }
      return IoError("open", path);
    }
    char buf[32] = {};
    const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
    if (n < 0) {
      return IoError("read", path);
    }
    const char* end = buf + n;
    auto [ptr, ec] = std::from_chars(buf, end, out);
    if (ec != std::errc() || ptr == buf) {
      return Status::Internal("corrupt fence file " + path);
    }
    return Status();
  }

  // Writes `data` to a temp file, fsyncs it, renames it over `path` and fsyncs the directory.
  Status ReplaceFile(const std::string& path, std::string_view data) const {
    const std::string tmp = path + ".tmp";  // the flock makes us the only writer
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
      return IoError("create", tmp);
    }
    std::size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n < 0) {
        Status s = IoError("write", tmp);
        ::close(fd);
        return s;
      }
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0) {
      Status s = IoError("fsync", tmp);
      ::close(fd);
      return s;
    }
    ::close(fd);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      return IoError("rename", tmp);
    }
    const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);  // makes the rename durable; best effort on odd file systems
      ::close(dfd);
    }
    return Status();
  }

  const std::string dir_;
};

// ---------------------------------------------------------------------------------------------
// etcd: fencing by the lease key's create revision.
//
// With the etcd store (etcd://), a lease is the etcd key "<prefix>/<lease key>" (Lease::store_key,
// e.g. "leasehold/job:invoices"), put with `create_revision(key) == 0`, and the fencing token
// *is* that key's create revision (cluster-wide monotonic). A writer whose data also lives in
// etcd fences itself by adding one compare to its own Txn:
//
//   Txn(If:   Compare(CreateRevision(store_key), "=", fencing_token),
//       Then: Put(data_key, value) ...,
//       Else: Get(store_key))              // Succeeded == false: fenced out
//
// The compare fails as soon as the grant is gone (revision 0) or re-created by a newer holder
// (a higher revision): no stale write can commit. It is stricter than the ">=" rule above: only
// the current grant's token passes, as many times as it likes. This is etcd's own
// Mutex.IsOwner() compare, and the one Lease::Write sends itself (leasehold/fenced_write.h): for
// data in the lease's own etcd cluster, Lease::Write is the simpler way. EtcdFenceGuard is for
// Txns your own etcd client sends (another language, etcd's JSON gateway, a Txn that also reads).
//
// Example (the holder's own process):
//
//   auto lease = store->Acquire("job:invoices", {.ttl = 30s});   // an etcd:// store
//   if (!lease.ok()) return lease.status();
//   auto guard = leasehold::MakeEtcdFenceGuard(*lease);
//   if (!guard.ok()) return guard.status();
//   // POST /v3/kv/txn {"compare":[<guard->ToJson()>],"success":[{"request_put":{...}}]}
//   // "succeeded" absent or false: fenced out, stop.
//
// For a lease held by another process, build the guard from the key and token it was given:
// `leasehold run` passes the child LEASEHOLD_STORE_KEY (the etcd key) and
// LEASEHOLD_FENCING_TOKEN, for MakeEtcdFenceGuard(getenv("LEASEHOLD_STORE_KEY"), token).
struct EtcdFenceGuard {
  // The lease's etcd key, "<prefix>/<lease key>" (Lease::store_key()).
  std::string lease_key;
  // Compare target CREATE with result EQUAL against this revision: the fencing token.
  std::int64_t create_revision = 0;

  // Returns the compare as etcd's JSON gateway (/v3/kv/txn) expects it:
  // {"key":"<base64>","target":"CREATE","result":"EQUAL","create_revision":"<n>"}
  [[nodiscard]] std::string ToJson() const {
    static constexpr char kAlphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string b64;
    std::size_t i = 0;
    const auto byte = [&](std::size_t k) {
      return static_cast<std::uint32_t>(static_cast<unsigned char>(lease_key[k]));
    };
    for (; i + 3 <= lease_key.size(); i += 3) {
      const std::uint32_t v = (byte(i) << 16) | (byte(i + 1) << 8) | byte(i + 2);
      for (int shift = 18; shift >= 0; shift -= 6) {
        b64 += kAlphabet[(v >> shift) & 63];
      }
    }
    if (const std::size_t rest = lease_key.size() - i; rest > 0) {
      const std::uint32_t v = (byte(i) << 16) | (rest == 2 ? byte(i + 1) << 8 : 0);
      b64 += kAlphabet[(v >> 18) & 63];
      b64 += kAlphabet[(v >> 12) & 63];
      b64 += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
      b64 += '=';
    }
    return "{\"key\":\"" + b64 + "\",\"target\":\"CREATE\",\"result\":\"EQUAL\"," +
           "\"create_revision\":\"" + std::to_string(create_revision) + "\"}";
  }
};

// Returns the guard for a holder of the etcd key `lease_key` (Lease::store_key(), e.g. from
// LEASEHOLD_STORE_KEY in a child of `leasehold run`) whose fencing token is `token`. This is the
// form for a lease held by another process: the key is taken as given, so it must be the store
// key, never the bare lease name (the store never writes that key: its compare would fail, or
// worse, match a key of your own). Returns kInvalidArgument for an empty key or a token outside
// 1..INT64_MAX (etcd revisions are int64; 0 would mean "the key is absent").
inline Result<EtcdFenceGuard> MakeEtcdFenceGuard(std::string lease_key, FencingToken token) {
  if (lease_key.empty()) {
    return Status::InvalidArgument("etcd lease key must not be empty");
  }
  if (token == 0 || token > static_cast<FencingToken>(std::numeric_limits<std::int64_t>::max())) {
    return Status::InvalidArgument("an etcd create revision is in 1..INT64_MAX");
  }
  return EtcdFenceGuard{std::move(lease_key), static_cast<std::int64_t>(token)};
}

// Returns the guard of `lease`, a lease of an etcd:// store: its store key and fencing token.
// Returns kInvalidArgument for an empty Lease, and for a lease whose store key is not of the
// etcd form "<prefix>/<lease key>" with a non-empty prefix. That check is all this header can
// see (a Lease does not tell its store's URL): it refuses every sqlite://, postgres:// and
// memory:// lease (their store key is the lease key itself) and every redis:// lease (a hash
// "<prefix>:{<hex>}"), but it cannot refuse a zk:// lease whose grant node path happens to end
// in "/<lease key>" (a lease key equal to that node's name): pass only leases of etcd:// stores.
inline Result<EtcdFenceGuard> MakeEtcdFenceGuard(const Lease& lease) {
  const std::string& store_key = lease.store_key();
  const std::string& key = lease.key();
  if (store_key.empty()) {
    return Status::InvalidArgument("an empty Lease has no etcd fence");
  }
  const std::size_t prefix_size = store_key.size() > key.size() ? store_key.size() - key.size() : 0;
  if (prefix_size < 2 || store_key[prefix_size - 1] != '/' ||
      store_key.compare(prefix_size, key.size(), key) != 0) {
    return Status::InvalidArgument("lease " + key +
                                   " is not a lease of an etcd:// store: its store key '" +
                                   store_key + "' is not '<prefix>/" + key + "'");
  }
  return MakeEtcdFenceGuard(store_key, lease.fencing_token());
}

}  // namespace leasehold
