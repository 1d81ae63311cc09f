// File: bench/floor_redis.cc
//
// Redis floor: PING on a hiredis connection of its own (the backend's client library).

#include <hiredis/hiredis.h>

#include "backends/redis/redis_options.h"
#include "core/url.h"
#include "floor.h"

namespace leasehold::bench {
namespace {

class RedisFloor final : public FloorProbe {
 public:
  explicit RedisFloor(redisContext* context) : context_(context) {}

  ~RedisFloor() override { redisFree(context_); }

  RedisFloor(const RedisFloor&) = delete;
  RedisFloor& operator=(const RedisFloor&) = delete;

  Status Call() override {
    auto* reply = static_cast<redisReply*>(redisCommand(context_, "PING"));
    if (reply == nullptr) {
      return Status::Unavailable("redis PING failed");
    }
    freeReplyObject(reply);
    return Status();
  }

 private:
  redisContext* context_;
};

}  // namespace

Result<std::unique_ptr<FloorProbe>> OpenRedisFloor(const std::string& url) {
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  LH_ASSIGN_OR_RETURN(internal::RedisOptions options, internal::RedisOptions::FromUrl(parsed));
  redisContext* context = options.unix_socket.empty()
                              ? redisConnect(options.host.c_str(), options.port)
                              : redisConnectUnix(options.unix_socket.c_str());
  if (context == nullptr || context->err != 0) {
    if (context != nullptr) {
      redisFree(context);
    }
    return Status::Unavailable("cannot connect to redis for the floor probe");
  }
  return std::unique_ptr<FloorProbe>(new RedisFloor(context));
}

}  // namespace leasehold::bench
