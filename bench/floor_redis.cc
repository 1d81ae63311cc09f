// File: bench/floor_redis.cc
//
// Redis floor: PING on a connection of its own, opened the way the store opens its connections
// (backends/redis/redis_connection.h: TCP or a Unix socket, TLS for rediss://, the master learnt
// from the sentinels for redis+sentinel://, the first seed that answers for redis+cluster://,
// usually a master, one hop like each of the store's commands), so that the floor of each topology
// pays what the store's own round trips pay and no more.

#include <memory>
#include <vector>

#include "backends/redis/redis_connection.h"
#include "backends/redis/redis_options.h"
#include "core/url.h"
#include "floor.h"

namespace leasehold::bench {
namespace {

class RedisFloor final : public FloorProbe {
 public:
  RedisFloor(std::shared_ptr<const internal::RedisTlsContext> tls,
             std::unique_ptr<internal::RedisConnectionPool> pool,
             std::unique_ptr<internal::RedisConnection> connection, std::string address)
      : tls_(std::move(tls)),
        pool_(std::move(pool)),
        connection_(std::move(connection)),
        address_(std::move(address)) {}

  Status Call() override {
    static const std::vector<internal::Command> kPing = {{"PING"}};
    LH_ASSIGN_OR_RETURN(std::vector<internal::ReplyPtr> replies,
                        connection_->Pipeline(kPing, address_));
    return Status();
  }

 private:
  std::shared_ptr<const internal::RedisTlsContext> tls_;  // outlives the connection
  std::unique_ptr<internal::RedisConnectionPool> pool_;   // Sentinel, Cluster: found the node
  std::unique_ptr<internal::RedisConnection> connection_;
  std::string address_;
};

}  // namespace

Result<std::unique_ptr<FloorProbe>> OpenRedisFloor(const std::string& url) {
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  LH_ASSIGN_OR_RETURN(internal::RedisOptions options, internal::RedisOptions::FromUrl(parsed));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<const internal::RedisTlsContext> tls,
                      internal::RedisTlsContext::Create(options));
  std::unique_ptr<internal::RedisConnectionPool> pool;
  std::unique_ptr<internal::RedisConnection> connection;
  if (options.sentinel() || options.cluster()) {
    pool = std::make_unique<internal::RedisConnectionPool>(options, Clock::Real(), tls);
    LH_ASSIGN_OR_RETURN(connection, pool->Connect());
  } else {
    LH_ASSIGN_OR_RETURN(connection, internal::RedisConnection::Connect(options, tls.get()));
  }
  return std::unique_ptr<FloorProbe>(
      new RedisFloor(std::move(tls), std::move(pool), std::move(connection), options.Address()));
}

}  // namespace leasehold::bench
