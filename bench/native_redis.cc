// File: bench/native_redis.cc
//
// Redis native lock (bench/native.h): SET NX PX + compare-and-delete, the algorithm of the
// Redis docs' single-instance lock, on hiredis. Waiters SUBSCRIBE (on a second connection) to
// a channel the release script publishes to, inside the same script, and retry on a message;
// they also retry every 50 ms, so a holder that died (its key expiring, no publish) is noticed.

#include <poll.h>

#include <algorithm>
#include <string>

#include <hiredis/hiredis.h>

#include "backends/redis/redis_options.h"
#include "core/url.h"
#include "native.h"

namespace leasehold::bench {
namespace {

constexpr const char* kReleaseScript =
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], '1'); return 1 "
    "else return 0 end";

constexpr auto kRetrySlice = std::chrono::milliseconds(50);

redisContext* Connect(const internal::RedisOptions& options) {
  redisContext* c = options.unix_socket.empty() ? redisConnect(options.host.c_str(), options.port)
                                                : redisConnectUnix(options.unix_socket.c_str());
  if (c != nullptr && c->err != 0) {
    redisFree(c);
    return nullptr;
  }
  return c;
}

class RedisNative final : public NativeLock {
 public:
  RedisNative(redisContext* c, std::string key, std::string sha)
      : c_(c), key_(std::move(key)), channel_(key_ + ":released"), sha_(std::move(sha)) {}

  ~RedisNative() override {
    redisFree(c_);
    if (sub_ != nullptr) {
      redisFree(sub_);
    }
  }

  RedisNative(const RedisNative&) = delete;
  RedisNative& operator=(const RedisNative&) = delete;

  void set_options(internal::RedisOptions options) { options_ = std::move(options); }

  Result<bool> TryAcquire() override {
    token_ = NativeOwnerToken();
    auto* reply = static_cast<redisReply*>(
        redisCommand(c_, "SET %b %b NX PX %lld", key_.data(), key_.size(), token_.data(),
                     token_.size(), static_cast<long long>(kNativeTtl.count())));
    if (reply == nullptr) {
      return Status::Unavailable("redis SET NX failed");
    }
    const bool got = reply->type == REDIS_REPLY_STATUS;
    const bool refused = reply->type == REDIS_REPLY_NIL;
    freeReplyObject(reply);
    if (!got && !refused) {
      return Status::Unavailable("redis SET NX: unexpected reply");
    }
    return got;
  }

  Status Acquire(std::chrono::steady_clock::time_point deadline) override {
    if (sub_ == nullptr) {
      sub_ = Connect(options_);
      if (sub_ == nullptr) {
        return Status::Unavailable("cannot connect the redis subscriber");
      }
      auto* reply = static_cast<redisReply*>(
          redisCommand(sub_, "SUBSCRIBE %b", channel_.data(), channel_.size()));
      if (reply == nullptr) {
        return Status::Unavailable("redis SUBSCRIBE failed");
      }
      freeReplyObject(reply);
    }
    // Subscribed before the first try: a release after a refused try always wakes us.
    for (;;) {
      LH_ASSIGN_OR_RETURN(bool got, TryAcquire());
      if (got) {
        return Status();
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        return Status::DeadlineExceeded("redis native lock: wait timed out");
      }
      LH_RETURN_IF_ERROR(WaitForMessage(std::min(
          kRetrySlice, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                           std::chrono::milliseconds(1))));
    }
  }

  Status Release() override {
    auto* reply = static_cast<redisReply*>(
        redisCommand(c_, "EVALSHA %s 2 %b %b %b", sha_.c_str(), key_.data(), key_.size(),
                     channel_.data(), channel_.size(), token_.data(), token_.size()));
    if (reply == nullptr) {
      return Status::Unavailable("redis EVALSHA failed");
    }
    const bool ok = reply->type == REDIS_REPLY_INTEGER && reply->integer == 1;
    freeReplyObject(reply);
    return ok ? Status() : Status::Lost("redis native lock: not held at release");
  }

 private:
  // One message (or several already buffered), or the timeout.
  Status WaitForMessage(std::chrono::milliseconds timeout) {
    void* reply = nullptr;
    bool any = false;
    for (;;) {
      if (redisGetReplyFromReader(sub_, &reply) != REDIS_OK) {
        return Status::Unavailable("redis subscriber: bad reply");
      }
      if (reply == nullptr) {
        break;
      }
      freeReplyObject(reply);
      any = true;
    }
    if (any) {
      return Status();
    }
    pollfd p{sub_->fd, POLLIN, 0};
    int n = poll(&p, 1, static_cast<int>(timeout.count()));
    if (n > 0) {
      if (redisBufferRead(sub_) != REDIS_OK) {
        return Status::Unavailable("redis subscriber: read failed");
      }
      while (redisGetReplyFromReader(sub_, &reply) == REDIS_OK && reply != nullptr) {
        freeReplyObject(reply);
      }
    }
    return Status();
  }

  redisContext* c_;
  redisContext* sub_ = nullptr;
  internal::RedisOptions options_;
  std::string key_;
  std::string channel_;
  std::string sha_;
  std::string token_;
};

}  // namespace

Result<std::unique_ptr<NativeLock>> OpenRedisNative(const std::string& url,
                                                    const std::string& key) {
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  LH_ASSIGN_OR_RETURN(internal::RedisOptions options, internal::RedisOptions::FromUrl(parsed));
  redisContext* c = Connect(options);
  if (c == nullptr) {
    return Status::Unavailable("cannot connect to redis for the native lock");
  }
  auto* reply = static_cast<redisReply*>(redisCommand(c, "SCRIPT LOAD %s", kReleaseScript));
  if (reply == nullptr || reply->type != REDIS_REPLY_STRING) {
    if (reply != nullptr) {
      freeReplyObject(reply);
    }
    redisFree(c);
    return Status::Unavailable("redis SCRIPT LOAD failed");
  }
  std::string sha(reply->str, reply->len);
  freeReplyObject(reply);
  auto lock = std::make_unique<RedisNative>(c, key, std::move(sha));
  lock->set_options(std::move(options));
  return std::unique_ptr<NativeLock>(std::move(lock));
}

}  // namespace leasehold::bench
