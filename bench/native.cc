// File: bench/native.cc
//
// OpenNativeLock: the native lock of a store kind (bench/native.h), for the kinds compiled in.

#include "native.h"

#include <random>

#include <fmt/format.h>

namespace leasehold::bench {

std::string NativeOwnerToken() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{:016x}{:016x}", rng(), rng());
}

Result<std::unique_ptr<NativeLock>> OpenNativeLock(const std::string& kind, const std::string& url,
                                                   const std::string& key) {
#if LEASEHOLD_WITH_REDIS
  if (kind == "redis") {
    return OpenRedisNative(url, key);
  }
#endif
#if LEASEHOLD_WITH_POSTGRES
  if (kind == "postgres_advisory") {
    return OpenPostgresAdvisoryNative(url, key);
  }
  if (kind == "postgres_table") {
    return OpenPostgresTableNative(url, key);
  }
#endif
#if LEASEHOLD_WITH_ETCD
  if (kind == "etcd") {
    return OpenEtcdNative(url, key);
  }
#endif
#if LEASEHOLD_WITH_ZOOKEEPER
  if (kind == "zk") {
    return OpenZkNative(url, key);
  }
#endif
#if LEASEHOLD_WITH_SQLITE
  if (kind == "sqlite") {
    return OpenSqliteNative(url, key);
  }
#endif
  return Status::InvalidArgument(fmt::format("no native lock for '{}'", kind));
}

}  // namespace leasehold::bench
