// File: backends/redis/redis_connection.h (internal to backends/redis)
//
// The connections of the redis:// and rediss:// store: RedisConnection, one socket that leasehold
// owns (TCP, a Unix socket, or TLS over TCP through OpenSSL), with hiredis's command formatter
// and reply reader on it; RedisTlsContext, the TLS settings of a store loaded once; and
// RedisConnectionPool, a bounded pool of connections with reconnect backoff, plus the reply
// helpers the store's other files share. Only backends/redis includes this header (and with it
// hiredis); redis_backend.h does not, and no header includes OpenSSL's.
//
// Why not hiredis's own connections: Debian 12's hiredis 0.14.1 has no TLS (hiredis_ssl came
// in 1.0), and the Sentinel and Cluster clients need connections to many nodes driven the same
// way (redis_cluster.h). The RESP parser and formatter stay hiredis's (redisReader,
// redisFormatCommandArgv): only the bytes' transport is ours.
//
// Invariants:
// - A connection that saw an I/O error or timeout is never reused: a stream whose replies may
//   still be in flight cannot be resynchronised. The pool drops it and opens a new one.
// - Every wait for the socket is bounded (poll with the connection's I/O timeout: the connect
//   timeout while connecting, the command timeout after, plus replica_timeout with
//   min_replicas), so no call blocks longer than that per read or write, whatever the server
//   does.
// - rediss:// verifies the server's certificate chain and name unless insecure=true; a
//   certificate that is not accepted is kPermissionDenied (retrying cannot fix it, as with a
//   wrong password), a handshake that breaks off or times out is kUnavailable.
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(std::shared_ptr<const RedisTlsContext> tls,
//                       RedisTlsContext::Create(options));  // nullptr for redis://
//   RedisConnectionPool pool(options, clock, tls);
//   LH_ASSIGN_OR_RETURN(RedisConnectionPool::Borrowed connection, pool.Borrow());
//   std::vector<Command> ping = {{"PING"}};
//   LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies,
//                       connection->Pipeline(ping, options.Address()));
//
// Thread safety: RedisConnection is not thread-safe (one borrower at a time); RedisTlsContext is
// immutable after Create and shared; the pool is thread-safe.

#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <hiredis/hiredis.h>

// OpenSSL's types, without its headers.
struct ssl_ctx_st;
struct ssl_st;
struct x509_st;
struct evp_pkey_st;

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "backends/common/time.h"
#include "backends/redis/redis_failover.h"
#include "backends/redis/redis_options.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace leasehold::internal {

// One Redis command, as its arguments.
using Command = std::vector<std::string>;

// Reconnect backoff after a failed connect: a random wait up to a ceiling that doubles from
// base to cap (the pool's connects and the subscriber's alike).
inline constexpr Duration kRedisReconnectBackoffBase = std::chrono::milliseconds(50);
inline constexpr Duration kRedisReconnectBackoffCap = std::chrono::milliseconds(1000);

struct ReplyDeleter {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};

using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

// Returns the reply's string (status, error or bulk), or "" for null or another type.
std::string_view ReplyText(const redisReply* reply);

// True if `reply` is an error reply.
bool IsError(const redisReply* reply);

// True if `reply` is the NOSCRIPT error (the script cache lost the script; the call did not run).
bool IsNoScript(const redisReply* reply);

// Reads an integer reply, or a string reply that is a whole integer. Returns kInternal for
// anything else.
Result<long long> ParseInteger(const redisReply* reply);

// Maps a Redis error reply to a Status: kPermissionDenied for ACL and credential refusals,
// kUnavailable for a server that is loading, busy, read-only or moving slots, kInternal
// otherwise. The message is "redis at <address> refused <what>: <error>"; the error also goes
// into the detail.
Status ErrorReplyStatus(std::string_view address, std::string_view what, std::string_view error);

// The TLS client settings of a rediss:// store: trust anchors, optional client certificate,
// verification mode. Loaded once, when the store opens, so a missing or unreadable file is an
// error at open, not at the first reconnect.
class RedisTlsContext {
 public:
  // Returns nullptr for a plain store (options.tls false). kInvalidArgument names a CA,
  // certificate or key file that cannot be loaded (and why), or a key that does not match the
  // certificate.
  static Result<std::shared_ptr<const RedisTlsContext>> Create(const RedisOptions& options);

  ~RedisTlsContext();
  RedisTlsContext(const RedisTlsContext&) = delete;
  RedisTlsContext& operator=(const RedisTlsContext&) = delete;

  [[nodiscard]] ssl_ctx_st* get() const { return ctx_; }

 private:
  explicit RedisTlsContext(ssl_ctx_st* ctx) : ctx_(ctx) {}

  ssl_ctx_st* ctx_;
};

// One connection: a non-blocking socket driven with poll, TLS when the store is rediss://.
// Not thread-safe: used by one borrower (or the subscriber thread) at a time.
class RedisConnection {
 public:
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Connects (TCP, Unix socket; then the TLS handshake when `tls` is not null), then AUTH,
  // SELECT and PING in one round trip. Returns kUnavailable if the server cannot be reached
  // (the connect, the handshake and each read of that round trip's replies bounded by
  // connect_timeout), kPermissionDenied if its certificate is not accepted or it refuses ours,
  // and the mapped error reply if it refuses one of those commands (named, never with its
  // arguments).
  static Result<std::unique_ptr<RedisConnection>> Connect(const RedisOptions& options,
                                                          const RedisTlsContext* tls);

  // Writes every command, then reads one reply per command: one round trip. Returns
  // kUnavailable (and marks the connection broken) on an I/O error or timeout.
  Result<std::vector<ReplyPtr>> Pipeline(std::span<const Command> commands,
                                         std::string_view address);

  // Writes `commands` without reading: for the subscriber, which polls the socket itself, and
  // for a cluster's commands, sent to every node before any reply is read.
  Status Send(std::span<const Command> commands, std::string_view address);

  // Reads `count` replies (each read bounded by the I/O timeout): Pipeline's second half.
  Result<std::vector<ReplyPtr>> ReadReplies(std::size_t count, std::string_view address);

  // The socket, to poll for POLLIN.
  [[nodiscard]] int fd() const { return fd_; }

  // True if input was already taken off the socket (decrypted TLS data) that poll cannot see:
  // read it before polling again.
  [[nodiscard]] bool HasBufferedInput() const;

  // Reads what has arrived, without waiting, into the reply reader. kUnavailable (broken) if the
  // server closed the connection or the read failed.
  Status ReadAvailable(std::string_view address);

  // The next complete reply read so far, or nullptr if none is complete yet. kUnavailable
  // (broken) on a protocol error.
  Result<ReplyPtr> NextReply(std::string_view address);

  [[nodiscard]] bool broken() const { return broken_; }

  // Which master address the pool opened this connection to (Sentinel: it changes at each
  // failover, and a connection to an older one is not given back to the pool).
  std::uint64_t generation = 0;
  // Sentinel: the config epoch of that master address (SentinelMaster::epoch); every grant made
  // on this connection raises the fencing counter to at least epoch << 32. 0 elsewhere.
  std::int64_t epoch = 0;

 private:
  RedisConnection(int fd, Duration io_timeout);

  Status Handshake(const RedisOptions& options, const RedisTlsContext& tls);
  // Waits up to `timeout` for `events` on the socket; kUnavailable naming `what` on a timeout.
  Status Wait(short events, Duration timeout, std::string_view address, std::string_view what);
  Status WriteAll(std::string_view bytes, std::string_view address);
  // One read into the reader. With `wait`, waits up to the I/O timeout for something to read;
  // without, returns OK at once when nothing has arrived.
  Status ReadOnce(bool wait, std::string_view address);
  Status Broken(std::string_view address, std::string why);

  int fd_;
  ssl_st* ssl_ = nullptr;
  redisReader* reader_;
  Duration io_timeout_;
  bool broken_ = false;
  // Set by OpenSSL's client-certificate callback (a store without cert=) during the handshake.
  bool asked_for_client_certificate_ = false;

  friend int NoteClientCertificateRequest(ssl_st* ssl, x509_st** cert, evp_pkey_st** key);
};

// A bounded pool of RedisConnections with reconnect backoff on the backend's clock.
// Thread-safe.
class RedisConnectionPool {
 public:
  // `clock` must outlive the pool. `tls`: RedisTlsContext::Create(options) (nullptr for a plain
  // store).
  RedisConnectionPool(RedisOptions options, Clock& clock,
                      std::shared_ptr<const RedisTlsContext> tls);

  // A borrowed connection; goes back to the pool on destruction unless broken.
  class Borrowed {
   public:
    Borrowed(RedisConnectionPool* pool, std::unique_ptr<RedisConnection> connection)
        : pool_(pool), connection_(std::move(connection)) {}

    Borrowed(const Borrowed&) = delete;
    Borrowed& operator=(const Borrowed&) = delete;
    Borrowed(Borrowed&& other) noexcept = default;
    Borrowed& operator=(Borrowed&&) = delete;

    ~Borrowed() {
      if (connection_ != nullptr) {
        pool_->GiveBack(std::move(connection_));
      }
    }

    RedisConnection* operator->() const { return connection_.get(); }

    RedisConnection& get() const { return *connection_; }

   private:
    RedisConnectionPool* pool_;
    std::unique_ptr<RedisConnection> connection_;
  };

  // Returns an idle connection, or opens one (up to pool_size), or waits up to the command
  // timeout for one to come back. Returns kUnavailable while a reconnect backoff runs. With
  // Sentinel, opening one may first ask the sentinels (each bounded by connect_timeout and
  // command_timeout).
  Result<Borrowed> Borrow() LH_EXCLUDES(mu_);

  // Opens a connection outside the pool's count (the subscriber's), with the same backoff
  // bookkeeping: a failure to reach the server delays the pool's next connect too. With
  // Sentinel, to the master as last learnt, asking the sentinels first when it is not known.
  Result<std::unique_ptr<RedisConnection>> Connect() LH_EXCLUDES(mu_);

  // Sentinel: asks the sentinels in turn for the master's address and config epoch, each in
  // one pipelined round trip, until a majority of them has answered (or every one was asked),
  // and takes the answer of the highest epoch: a sentinel cut off from the others may still
  // name the old master. kUnavailable if none answers, kInvalidArgument if every one that
  // answers knows no master of that name.
  Result<SentinelMaster> AskSentinels() const;

  // Sentinel: the replicas of the master as the first sentinel that answers knows them
  // (SENTINEL REPLICAS). kUnavailable if none answers, naming each one's error.
  Result<std::vector<SentinelReplica>> AskSentinelsForReplicas() const;

  // Sentinel: the master moved (a +switch-master message naming the new master `to`, or any
  // sign that the address is stale: a broken connection, a replica's ROLE). Unless `to` is the
  // address already known, the next connect asks the sentinels for the address and its config
  // epoch together (a +switch-master message carries no epoch). Idle connections to the old
  // master are closed, borrowed ones are not given back.
  void MasterMoved(std::optional<std::pair<std::string, int>> to = std::nullopt) LH_EXCLUDES(mu_);

  // Sentinel: the generation of the master address (RedisConnection::generation); a connection
  // of an older one goes to a master that has since moved.
  [[nodiscard]] std::uint64_t generation() const LH_EXCLUDES(mu_);

  // Sentinel: failovers seen (+switch-master messages for this master) since the pool opened.
  std::atomic<std::uint64_t> switches_{0};

  [[nodiscard]] const RedisOptions& options() const { return options_; }

  // What the backend has done (RedisBackend::Stats), counted by everyone who uses the pool.
  std::atomic<std::uint64_t> round_trips_{0};
  std::atomic<std::uint64_t> connects_{0};
  std::atomic<std::uint64_t> script_loads_{0};
  // SHA1 of each script, as SCRIPT LOAD returned it at open. Immutable after Open().
  std::vector<std::string> shas_;

 private:
  void GiveBack(std::unique_ptr<RedisConnection> connection) LH_EXCLUDES(mu_);

  // Immutable after construction.
  const RedisOptions options_;
  Clock& clock_;
  const std::shared_ptr<const RedisTlsContext> tls_;

  // RedisConnection::Connect to the server, or with Sentinel to the master as last learnt
  // (asking the sentinels first when it is not known; forgetting it when it cannot be reached
  // or is no master).
  Result<std::unique_ptr<RedisConnection>> ConnectToMaster() LH_EXCLUDES(mu_);

  // Sentinel: how sentinel host:port is reached (the store's timeouts and TLS, no AUTH).
  [[nodiscard]] RedisOptions SentinelOptions(const std::string& host, int port) const;

  // Sentinel: MasterMoved() without an address, if the address is still that of `generation`.
  void ForgetMaster(std::uint64_t generation) LH_EXCLUDES(mu_);

  // Sentinel: follows +switch-master on one sentinel at a time until the pool goes.
  void WatchSentinels(std::stop_token stop);

  mutable Mutex mu_;
  CondVar cv_;
  std::vector<std::unique_ptr<RedisConnection>> idle_ LH_GUARDED_BY(mu_);
  int open_ LH_GUARDED_BY(mu_) = 0;
  ReconnectBackoff backoff_ LH_GUARDED_BY(mu_);
  // Why the last connect failed, for the refusals during its backoff.
  Status last_error_ LH_GUARDED_BY(mu_);
  // Sentinel: the master as last learnt (port 0: ask the sentinels), its config epoch, and its
  // generation.
  std::string master_host_ LH_GUARDED_BY(mu_);
  int master_port_ LH_GUARDED_BY(mu_) = 0;
  std::int64_t master_epoch_ LH_GUARDED_BY(mu_) = 0;
  std::uint64_t generation_ LH_GUARDED_BY(mu_) = 0;

  // Last: stopped and joined first, while everything above still exists.
  std::jthread watcher_;
};

}  // namespace leasehold::internal
