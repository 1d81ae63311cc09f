// The storage-side fencing helpers of leasehold/fencing.h: SQL statement builders, the fenced
// local directory and the etcd Txn compare. POSIX calls only; no database client is linked.

#include "leasehold/fencing.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>

#include <sys/file.h>
#include <sys/stat.h>

namespace leasehold {
namespace {

// SQL identifiers and statements.

Status QuoteIdentifier(std::string_view name, std::string& out) {
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

std::string Placeholder(SqlDialect dialect, std::size_t n) {
  return (dialect == SqlDialect::kPostgres ? "$" : "?") + std::to_string(n);
}

Status CheckUpdate(const FencedUpdate& u) {
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

Status QualifiedTable(const FencedUpdate& u, std::string& out) {
  if (!u.schema.empty()) {
    if (Status s = QuoteIdentifier(u.schema, out); !s.ok()) {
      return s;
    }
    out += '.';
  }
  return QuoteIdentifier(u.table, out);
}

// FencedDirectory's steps.

Status CheckName(std::string_view name) {
  if (name.empty() || name.size() > 200 || name.front() == '.' ||
      name.find_first_of(std::string_view("/\0", 2)) != std::string_view::npos) {
    return Status::InvalidArgument(
        "record name must be 1..200 bytes, without '/', NUL or a leading '.'");
  }
  return Status();
}

Status IoError(std::string_view what, const std::string& path) {
  const int err = errno;
  std::string message = std::string(what) + " " + path + ": " + std::strerror(err);
  if (err == EACCES || err == EPERM || err == EROFS) {
    return Status::PermissionDenied(std::move(message));
  }
  return Status::Unavailable(std::move(message));
}

Status ReadToken(const std::string& path, FencingToken& out) {
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

// Writes `data` to a temp file, fsyncs it, renames it over `path` and fsyncs `dir`, the directory.
Status ReplaceFile(const std::string& dir, const std::string& path, std::string_view data) {
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
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);  // makes the rename durable; best effort on odd file systems
    ::close(dfd);
  }
  return Status();
}

}  // namespace

Result<SqlStatement> BuildFencedUpdate(const FencedUpdate& u) {
  if (Status s = CheckUpdate(u); !s.ok()) {
    return s;
  }
  SqlStatement out;
  out.text = "UPDATE ";
  if (Status s = QualifiedTable(u, out.text); !s.ok()) {
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

Result<SqlStatement> BuildFencedUpsert(const FencedUpdate& u) {
  if (Status s = CheckUpdate(u); !s.ok()) {
    return s;
  }
  std::string table;
  if (Status s = QualifiedTable(u, table); !s.ok()) {
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

Status CheckFencedRows(long long rows_affected, FencingToken token) {
  if (rows_affected > 0) {
    return Status();
  }
  return Status::Lost(
      "fenced out: the store already accepted a write with a fencing token "
      "higher than " +
      std::to_string(token) + " (or the row does not exist)");
}

Status FencedDirectory::Write(std::string_view name, std::string_view data,
                              FencingToken token) const {
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
    if (Status s = ReplaceFile(dir_, meta + ".fence", std::to_string(token) + "\n"); !s.ok()) {
      return s;
    }
  }
  return ReplaceFile(dir_, record, data);
}

Result<FencingToken> FencedDirectory::HighestToken(std::string_view name) const {
  if (Status s = CheckName(name); !s.ok()) {
    return s;
  }
  FencingToken highest = 0;
  if (Status s = ReadToken(dir_ + "/." + std::string(name) + ".fence", highest); !s.ok()) {
    return s;
  }
  return highest;
}

std::string EtcdFenceGuard::ToJson() const {
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

Result<EtcdFenceGuard> MakeEtcdFenceGuard(std::string lease_key, FencingToken token) {
  if (lease_key.empty()) {
    return Status::InvalidArgument("etcd lease key must not be empty");
  }
  if (token == 0 || token > static_cast<FencingToken>(std::numeric_limits<std::int64_t>::max())) {
    return Status::InvalidArgument("an etcd create revision is in 1..INT64_MAX");
  }
  return EtcdFenceGuard{std::move(lease_key), static_cast<std::int64_t>(token)};
}

Result<EtcdFenceGuard> MakeEtcdFenceGuard(const Lease& lease) {
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
