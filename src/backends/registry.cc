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
#include "backends/postgres/postgres_conninfo.h"  // no libpq: compiled in every build
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

// One row per store, built in or not: a store this build lacks keeps its row without `open`, so
// that its URL gets "compiled without" rather than "unknown scheme". Adding a store is adding its
// row here (see docs/impl.md, "How to add a store").
struct StoreRow {
  // For messages: "compiled without <product> support".
  std::string_view product;
  // The URL schemes that name the store; the first is its own, the others aliases or variants.
  std::string_view schemes[7];
  // Opens the backend; null when the store is not compiled in.
  Result<std::shared_ptr<Backend>> (*open)(const Url& url, Clock& clock) = nullptr;
  // True if the store keeps no time of its own that other processes read, so that any Clock
  // (a FakeClock in tests) may drive it: memory:// only. Every other store's grants expire on a
  // clock outside the process (the server's, or CLOCK_BOOTTIME written into a shared file).
  bool any_clock = false;
  // The SQL a DBA applies (`leasehold schema`), for stores that need it.
  Result<std::string> (*schema_sql)(const Url& url) = nullptr;
  // The store's default URL, for the one store that is the default (Store::DefaultUrl()).
  Result<std::string> (*default_url)() = nullptr;
  // Reads text without a scheme that names this store (libpq's key=value conninfo), or returns
  // nullopt if the text is not of its form.
  std::optional<Result<Url>> (*parse_schemeless)(std::string_view text) = nullptr;
};

#if LEASEHOLD_WITH_SQLITE
Result<std::string> DefaultSqliteUrl() {
  LH_ASSIGN_OR_RETURN(std::string path, DefaultSqlitePath());
  return "sqlite://" + path + "?scope=host";
}
#endif

const StoreRow kStores[] = {
    {.product = "memory", .schemes = {"memory"}, .open = OpenMemoryBackend, .any_clock = true},
#if LEASEHOLD_WITH_SQLITE
    {.product = "SQLite",
     .schemes = {"sqlite"},
     .open = OpenSqliteBackend,
     .default_url = DefaultSqliteUrl},
#else
    {.product = "SQLite", .schemes = {"sqlite"}},
#endif
#if LEASEHOLD_WITH_REDIS
    {.product = "Redis",
     .schemes = {"redis", "rediss", "redis+unix", "redis+sentinel", "rediss+sentinel",
                 "redis+cluster", "rediss+cluster"},
     .open = OpenRedisBackend},
#else
    {.product = "Redis",
     .schemes = {"redis", "rediss", "redis+unix", "redis+sentinel", "rediss+sentinel",
                 "redis+cluster", "rediss+cluster"}},
#endif
#if LEASEHOLD_WITH_POSTGRES
    {.product = "PostgreSQL",
     .schemes = {"postgres", "postgresql"},
     .open = OpenPostgresBackend,
     .schema_sql = PostgresSchemaSql,
     .parse_schemeless = ParsePostgresConninfo},
#else
    {.product = "PostgreSQL",
     .schemes = {"postgres", "postgresql"},
     .parse_schemeless = ParsePostgresConninfo},  // so that a conninfo says "compiled without"
#endif
#if LEASEHOLD_WITH_ETCD
    {.product = "etcd", .schemes = {"etcd", "etcds"}, .open = OpenEtcdBackend},
#else
    {.product = "etcd", .schemes = {"etcd", "etcds"}},
#endif
#if LEASEHOLD_WITH_ZOOKEEPER
    {.product = "ZooKeeper", .schemes = {"zk"}, .open = OpenZkBackend},
#else
    {.product = "ZooKeeper", .schemes = {"zk"}},
#endif
};

const StoreRow* FindRow(std::string_view scheme) {
  for (const StoreRow& row : kStores) {
    for (std::string_view s : row.schemes) {
      if (!s.empty() && s == scheme) {
        return &row;
      }
    }
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> CompiledSchemes() {
  std::vector<std::string> schemes;
  for (const StoreRow& row : kStores) {
    for (std::string_view s : row.schemes) {
      if (row.open != nullptr && !s.empty()) {
        schemes.emplace_back(s);
      }
    }
  }
  return schemes;
}

std::vector<std::string> CompiledStoreNames() {
  std::vector<std::string> names;
  for (const StoreRow& row : kStores) {
    if (row.open != nullptr && row.schemes[0] != "memory") {
      names.emplace_back(row.schemes[0]);
    }
  }
  return names;
}

Result<std::string> StoreSchemaSql(const Url& url) {
  if (const StoreRow* row = FindRow(url.scheme); row != nullptr && row->schema_sql != nullptr) {
    return row->schema_sql(url);
  }
  std::vector<std::string_view> with_schema;
  for (const StoreRow& row : kStores) {
    if (row.schema_sql != nullptr) {
      with_schema.push_back(row.schemes[0]);
    }
  }
  return Status::Unimplemented(fmt::format(
      "`leasehold schema` prints SQL for {}:// stores (built in: {}); a {}:// store "
      "creates what it needs by itself",
      with_schema.empty() ? "postgres" : fmt::format("{}", fmt::join(with_schema, ":// and ")),
      fmt::join(CompiledSchemes(), ", "), url.scheme));
}

bool AcceptsAnyClock(std::string_view scheme) {
  const StoreRow* row = FindRow(scheme);
  return row != nullptr && row->any_clock;
}

Result<std::string> DefaultStoreUrl() {
  for (const StoreRow& row : kStores) {
    if (row.default_url != nullptr) {
      return row.default_url();
    }
  }
  return Status::InvalidArgument(
      "no store given: pass --store URL or set LEASEHOLD_STORE (this build has no embedded "
      "SQLite store)");
}

std::optional<Result<Url>> ParseSchemelessUrl(std::string_view text) {
  for (const StoreRow& row : kStores) {
    if (row.parse_schemeless != nullptr) {
      if (std::optional<Result<Url>> url = row.parse_schemeless(text)) {
        return url;
      }
    }
  }
  return std::nullopt;
}

Result<std::shared_ptr<Backend>> OpenBackend(const Url& url, Clock& clock) {
  const StoreRow* row = FindRow(url.scheme);
  if (row == nullptr) {
    return Status::InvalidArgument(fmt::format("unknown store scheme '{}://' (built in: {})",
                                               url.scheme, fmt::join(CompiledSchemes(), ", ")));
  }
  if (row->open == nullptr) {
    return Status::Unimplemented(
        fmt::format("got a {}:// URL but leasehold was compiled without {} support (built in: "
                    "{})",
                    url.scheme, row->product, fmt::join(CompiledSchemes(), ", ")));
  }
  if (!AcceptsAnyClock(url.scheme) && &clock != &Clock::Real()) {
    return Status::InvalidArgument(fmt::format(
        "a {}:// store runs on the real clock: its grants expire on a clock outside this process, "
        "so StoreOptions::clock must be unset or Clock::Real() (a FakeClock drives memory:// "
        "only)",
        url.scheme));
  }
  return row->open(url, clock);
}

}  // namespace leasehold::internal
