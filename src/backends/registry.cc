#include "backends/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/memory/memory_backend.h"
#if LEASEHOLD_WITH_SQLITE
#include "backends/sqlite/sqlite_backend.h"
#endif
#if LEASEHOLD_WITH_REDIS
#include "backends/redis/redis_backend.h"
#endif
#if LEASEHOLD_WITH_POSTGRES
#include "backends/postgres/postgres_backend.h"
#endif
#if LEASEHOLD_WITH_ETCD
#include "backends/etcd/etcd_backend.h"
#endif
#if LEASEHOLD_WITH_ZOOKEEPER
#include "backends/zookeeper/zk_backend.h"
#endif

namespace leasehold::internal {

namespace {

struct SchemeInfo {
  std::string_view scheme;
  std::string_view product;
};

// Every scheme DESIGN.md names, built in or not, so that a URL for a store this build lacks
// gets "compiled without" rather than "unknown scheme".
constexpr SchemeInfo kKnownSchemes[] = {
    {"memory", "memory"},     {"sqlite", "SQLite"},    {"redis", "Redis"},
    {"redis+unix", "Redis"},  {"postgres", "PostgreSQL"}, {"postgresql", "PostgreSQL"},
    {"etcd", "etcd"},         {"etcds", "etcd"},       {"zk", "ZooKeeper"},
};

}  // namespace

std::vector<std::string> CompiledSchemes() {
  std::vector<std::string> schemes = {"memory"};
#if LEASEHOLD_WITH_SQLITE
  schemes.emplace_back("sqlite");
#endif
#if LEASEHOLD_WITH_REDIS
  schemes.emplace_back("redis");
  schemes.emplace_back("redis+unix");
#endif
#if LEASEHOLD_WITH_POSTGRES
  schemes.emplace_back("postgres");
  schemes.emplace_back("postgresql");
#endif
#if LEASEHOLD_WITH_ETCD
  schemes.emplace_back("etcd");
  schemes.emplace_back("etcds");
#endif
#if LEASEHOLD_WITH_ZOOKEEPER
  schemes.emplace_back("zk");
#endif
  return schemes;
}

Result<std::string> StoreSchemaSql(const Url& url) {
#if LEASEHOLD_WITH_POSTGRES
  if (url.scheme == "postgres" || url.scheme == "postgresql") {
    return PostgresSchemaSql(url);
  }
#endif
  return Status::Unimplemented(fmt::format(
      "`leasehold schema` prints SQL for postgres:// stores (built in: {}); a {}:// store "
      "creates what it needs by itself",
      fmt::join(CompiledSchemes(), ", "), url.scheme));
}

Result<std::shared_ptr<Backend>> OpenBackend(const Url& url, Clock& clock) {
  if (url.scheme == "memory") {
    return OpenMemoryBackend(url, clock);
  }
#if LEASEHOLD_WITH_SQLITE
  if (url.scheme == "sqlite") {
    return OpenSqliteBackend(url);
  }
#endif
#if LEASEHOLD_WITH_REDIS
  if (url.scheme == "redis" || url.scheme == "redis+unix") {
    return OpenRedisBackend(url);
  }
#endif
#if LEASEHOLD_WITH_POSTGRES
  if (url.scheme == "postgres" || url.scheme == "postgresql") {
    return OpenPostgresBackend(url);
  }
#endif
#if LEASEHOLD_WITH_ETCD
  if (url.scheme == "etcd" || url.scheme == "etcds") {
    return OpenEtcdBackend(url);
  }
#endif
#if LEASEHOLD_WITH_ZOOKEEPER
  if (url.scheme == "zk") {
    return OpenZkBackend(url);
  }
#endif
  for (const SchemeInfo& known : kKnownSchemes) {
    if (known.scheme == url.scheme) {
      return Status::Unimplemented(
          fmt::format("got a {}:// URL but leasehold was compiled without {} support (built in: "
                      "{})",
                      url.scheme, known.product, fmt::join(CompiledSchemes(), ", ")));
    }
  }
  return Status::InvalidArgument(fmt::format("unknown store scheme '{}://' (built in: {})",
                                             url.scheme, fmt::join(CompiledSchemes(), ", ")));
}

}  // namespace leasehold::internal
