// File: backends/redis/redis_connection.h (internal to backends/redis)
//
// The command connections of the redis:// store: RedisConnection, one blocking hiredis context
// that sends a pipelined batch and reads every reply back, and RedisConnectionPool, a bounded
// pool of them with reconnect backoff, plus the reply helpers the store's other files share.
// Only backends/redis includes this header (and with it hiredis); redis_backend.h does not.
//
// Invariants:
// - A connection that saw an I/O error or timeout is never reused: hiredis cannot resync a
//   stream whose replies may still be in flight. The pool drops it and opens a new one.
// - Every socket read and write is bounded (SO_RCVTIMEO/SO_SNDTIMEO via redisSetTimeout), so no
//   call blocks longer than the command timeout per read, whatever the server does.
//
// Example:
//
//   RedisConnectionPool pool(options, clock);
//   LH_ASSIGN_OR_RETURN(RedisConnectionPool::Borrowed connection, pool.Borrow());
//   std::vector<Command> ping = {{"PING"}};
//   LH_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies,
//                       connection->Pipeline(ping, options.Address()));
//
// Thread safety: RedisConnection is not thread-safe (one borrower at a time); the pool is
// thread-safe.

#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <hiredis/hiredis.h>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "backends/common/time.h"
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

struct ContextDeleter {
  void operator()(redisContext* context) const { redisFree(context); }
};

using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;

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

// One hiredis context: blocking, with connect and per-read/write timeouts.
// Not thread-safe: used by one borrower (or the subscriber thread) at a time.
class RedisConnection {
 public:
  explicit RedisConnection(ContextPtr context) : context_(std::move(context)) {}

  // Connects, then AUTH, SELECT and PING in one round trip. Returns kUnavailable if the server
  // cannot be reached (the connect, and each read of that round trip's replies, bounded by
  // connect_timeout), and the mapped error reply if it refuses one of
  // those commands (named, never with its arguments).
  static Result<std::unique_ptr<RedisConnection>> Connect(const RedisOptions& options);

  // Writes every command, then reads one reply per command: one round trip. Returns
  // kUnavailable (and marks the connection broken) on an I/O error or timeout.
  Result<std::vector<ReplyPtr>> Pipeline(std::span<const Command> commands,
                                         std::string_view address);

  [[nodiscard]] bool broken() const { return broken_; }

  // For the subscriber, which drives the socket itself (poll + redisBufferRead).
  [[nodiscard]] redisContext* context() const { return context_.get(); }

 private:
  Status Broken(std::string_view address);

  ContextPtr context_;
  bool broken_ = false;
};

// A bounded pool of RedisConnections with reconnect backoff on the backend's clock.
// Thread-safe.
class RedisConnectionPool {
 public:
  // `clock` must outlive the pool.
  RedisConnectionPool(RedisOptions options, Clock& clock);

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
  // timeout for one to come back. Returns kUnavailable while a reconnect backoff runs.
  Result<Borrowed> Borrow() LH_EXCLUDES(mu_);

  // Opens a connection outside the pool's count (the subscriber's), with the same backoff
  // bookkeeping: a failure to reach the server delays the pool's next connect too.
  Result<std::unique_ptr<RedisConnection>> Connect() LH_EXCLUDES(mu_);

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

  Mutex mu_;
  CondVar cv_;
  std::vector<std::unique_ptr<RedisConnection>> idle_ LH_GUARDED_BY(mu_);
  int open_ LH_GUARDED_BY(mu_) = 0;
  ReconnectBackoff backoff_ LH_GUARDED_BY(mu_);
  // Why the last connect failed, for the refusals during its backoff.
  Status last_error_ LH_GUARDED_BY(mu_);
};

}  // namespace leasehold::internal
