#include "testing/store_fixtures.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>

#include <fmt/format.h>

#include "backends/memory/memory_backend.h"
#include "testing/server_process.h"
#if LEASEHOLD_WITH_SQLITE
#include <sqlite3.h>
#endif
#if LEASEHOLD_WITH_REDIS
#include "testing/redis_cluster.h"
#include "testing/redis_sentinel.h"
#include "testing/redis_server.h"
#endif
#if LEASEHOLD_WITH_POSTGRES
#include "testing/postgres_server.h"
#endif
#if LEASEHOLD_WITH_ETCD
#include "testing/etcd_server.h"
#endif
#if LEASEHOLD_WITH_ZOOKEEPER
#include "testing/zk_server.h"
#endif

namespace leasehold::testing {

namespace {

using namespace std::chrono_literals;

std::mutex options_mu;
StoreFixtureOptions fixture_options;

StoreFixtureOptions Options() {
  std::lock_guard<std::mutex> lock(options_mu);
  return fixture_options;
}

// One server of type T for the whole process: started on first use, deleted at exit (which stops
// it). Holds the start status, so that every fixture of the server reports the same reason.
template <typename T>
class Lazy {
 public:
  using Starter = std::function<Result<std::unique_ptr<T>>()>;

  explicit Lazy(Starter starter) : starter_(std::move(starter)) {}

  // Returns the server, or null if it would not start (status() says why).
  T* Get() {
    std::call_once(once_, [this] {
      auto started = starter_();
      if (!started.ok()) {
        status_ = started.status();
        std::fprintf(stderr, "%s\n", status_.ToString().c_str());
        return;
      }
      server_ = std::move(started).value();
    });
    return server_.get();
  }

  Status status() {
    Get();
    return status_;
  }

 private:
  Starter starter_;
  std::once_flag once_;
  std::unique_ptr<T> server_;
  Status status_;
};

// A process-wide server that is never destroyed before exit: `Lazy`s live in function statics.
template <typename T>
Lazy<T>& Server(typename Lazy<T>::Starter starter) {
  static auto* lazy = new Lazy<T>(std::move(starter));
  static const bool registered = [] {
    std::atexit([] { delete lazy; });
    return true;
  }();
  (void)registered;
  return *lazy;
}

// A suffix no other store of this process (or of another process on the host) has.
std::string Fresh() {
  static std::atomic<int> n{0};
  return fmt::format("{}-{}", getpid(), ++n);
}

#if LEASEHOLD_WITH_SQLITE
// read_data of sqlite://: column v of row k in kFencedDataTable of the URL's file, read with the
// sqlite3 C API on a connection of its own. No table yet (no fenced write made it) reads as none.
Result<std::optional<std::string>> ReadSqliteData(const std::string& url,
                                                  const std::string& data_key) {
  const std::string path = url.substr(std::string_view("sqlite://").size());
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr);
  auto fail = [&](std::string_view what) {
    Status s = Status::Internal(fmt::format("sqlite3 {} on {}: {}", what, path,
                                            db != nullptr ? sqlite3_errmsg(db) : "out of memory"));
    sqlite3_close_v2(db);
    return s;
  };
  if (rc != SQLITE_OK) {
    return fail("open");
  }
  sqlite3_busy_timeout(db, 5000);
  sqlite3_stmt* statement = nullptr;
  const std::string sql = fmt::format("SELECT v FROM {} WHERE k = ?1", kFencedDataTable);
  rc = sqlite3_prepare_v2(db, sql.c_str(), -1, &statement, nullptr);
  if (rc != SQLITE_OK) {
    if (std::string_view(sqlite3_errmsg(db)).starts_with("no such table")) {
      sqlite3_close_v2(db);
      return std::optional<std::string>();
    }
    return fail("prepare");
  }
  sqlite3_bind_text(statement, 1, data_key.data(), static_cast<int>(data_key.size()),
                    SQLITE_STATIC);
  rc = sqlite3_step(statement);
  std::optional<std::string> value;
  if (rc == SQLITE_ROW) {
    const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(statement, 0));
    value.emplace(text != nullptr ? text : "",
                  static_cast<std::size_t>(sqlite3_column_bytes(statement, 0)));
    rc = sqlite3_step(statement);
  }
  sqlite3_finalize(statement);
  if (rc != SQLITE_DONE) {
    return fail("step");
  }
  sqlite3_close_v2(db);
  return value;
}
#endif

#if LEASEHOLD_WITH_REDIS
// read_data of the Redis rows: GET through redis-cli on the server's plain port (db 0, the
// fixtures' URLs' database); the value is framed as 'v' + value + '.', so that a missing key
// ('n'), an empty value and trailing newlines (which the output loses) read back exactly.
Result<std::optional<std::string>> ReadRedisData(const RedisServer& server,
                                                 const std::string& data_key) {
  Result<std::string> read = server.Cli({"EVAL",
                                         "local v = redis.call('GET', KEYS[1]) "
                                         "if v then return 'v' .. v .. '.' end return 'n'",
                                         "1", data_key});
  if (!read.ok()) {
    return read.status();
  }
  const std::string& out = *read;
  if (out == "n") {
    return std::optional<std::string>();
  }
  if (out.size() < 2 || out.front() != 'v' || out.back() != '.') {
    return Status::Internal(fmt::format("unexpected GET output: {}", out));
  }
  return std::optional<std::string>(out.substr(1, out.size() - 2));
}
#endif

std::vector<StoreFixture> MakeFixtures() {
  std::vector<StoreFixture> fixtures;
  auto no_server = [] { return Status(); };
  fixtures.push_back(
      {.name = "memory",
       .in_bench = false,
       .start = no_server,
       .new_store_url =
           [](const std::string&) { return fmt::format("memory://fixture-{}", Fresh()); },
       .read_data = [](const std::string& url,
                       const std::string& data_key) -> Result<std::optional<std::string>> {
         const std::string_view scheme = "memory://";
         return internal::ReadMemoryDataForTesting(std::string_view(url).substr(scheme.size()),
                                                   data_key);
       }});
#if LEASEHOLD_WITH_SQLITE
  fixtures.push_back(
      {.name = "sqlite",
       .start = no_server,
       .new_store_url =
           [](const std::string& dir) { return fmt::format("sqlite://{}/leases.db", dir); },
       .read_data = ReadSqliteData});
#endif
#if LEASEHOLD_WITH_REDIS
  {
    // redis and redis_fair on one plain server; rediss (TLS, the server's certificate verified
    // against the test CA) on a server of its own, so that its every command goes over TLS.
    auto plain = [] {
      return &Server<RedisServer>([] { return RedisServer::Start({.aof = Options().redis_aof}); });
    };

    struct TlsServer {
      std::unique_ptr<RedisServer> server;
    };

    auto tls = [] {
      return &Server<TlsServer>([]() -> Result<std::unique_ptr<TlsServer>> {
        auto holder = std::make_unique<TlsServer>();
        LH_ASSIGN_OR_RETURN(holder->server,
                            RedisServer::Start({.aof = Options().redis_aof, .tls = true}));
        return holder;
      });
    };

    struct Row {
      const char* name;
      bool fair;
      bool tls;
    };

    for (const Row row :
         {Row{"redis", false, false}, Row{"redis_fair", true, false}, Row{"rediss", false, true}}) {
      const bool use_tls = row.tls;
      auto server_of = [plain, tls, use_tls]() -> RedisServer* {
        if (use_tls) {
          TlsServer* holder = tls()->Get();
          return holder != nullptr ? holder->server.get() : nullptr;
        }
        return plain()->Get();
      };
      auto status_of = [plain, tls, use_tls]() -> Status {
        return use_tls ? tls()->status() : plain()->status();
      };
      auto requests = [server_of]() -> std::optional<double> {
        RedisServer* server = server_of();
        if (server == nullptr) {
          return std::nullopt;
        }
        auto info = server->Cli({"INFO", "stats"});
        auto at = info.ok() ? info->find("total_reads_processed:") : std::string::npos;
        if (at == std::string::npos) {
          return std::nullopt;
        }
        return std::strtod(info->c_str() + at + 22, nullptr);
      };
      const bool fair = row.fair;
      fixtures.push_back(
          {.name = row.name,
           .fair = fair,
           .start = status_of,
           .new_store_url =
               [server_of, fair, use_tls](const std::string&) {
                 RedisServer* server = server_of();
                 const std::string path =
                     fmt::format("/0?prefix=fixture-{}{}", Fresh(), fair ? "&fair=true" : "");
                 if (server == nullptr) {
                   return "redis://127.0.0.1:1" + path;
                 }
                 return use_tls ? server->TlsUrl(path) : server->Url() + path;
               },
           .server_requests = requests,
           .server_requests_what = "Redis total_reads_processed (socket reads holding commands)",
           .read_data = [server_of, status_of](const std::string&, const std::string& data_key)
               -> Result<std::optional<std::string>> {
             RedisServer* server = server_of();
             if (server == nullptr) {
               return status_of();
             }
             return ReadRedisData(*server, data_key);
           }});
    }
  }
  {
    // redis_sentinel: one master, one replica, three sentinels; every connection learns the
    // master from them and checks ROLE.
    struct Sentinel {
      std::unique_ptr<RedisSentinelSetup> setup;
    };

    auto sentinel = [] {
      return &Server<Sentinel>([]() -> Result<std::unique_ptr<Sentinel>> {
        auto holder = std::make_unique<Sentinel>();
        LH_ASSIGN_OR_RETURN(holder->setup, RedisSentinelSetup::Start({.aof = Options().redis_aof}));
        return holder;
      });
    };
    auto master = [sentinel]() -> RedisServer* {
      Sentinel* holder = sentinel()->Get();
      if (holder == nullptr) {
        return nullptr;
      }
      Result<int> port = holder->setup->MasterPort();
      return port.ok() ? holder->setup->ServerOnPort(*port) : nullptr;
    };
    fixtures.push_back(
        {.name = "redis_sentinel",
         // The redis row's code behind a learnt address: measured on request
         // (--stores=redis_sentinel, bench/RESULTS.md), not in every run and smoke test.
         .in_bench = false,
         .start = [sentinel] { return sentinel()->status(); },
         .new_store_url =
             [sentinel](const std::string&) {
               Sentinel* holder = sentinel()->Get();
               const std::string path = fmt::format("/0?prefix=fixture-{}", Fresh());
               return holder != nullptr ? holder->setup->Url(path) : "redis://127.0.0.1:1" + path;
             },
         .server_requests = [master]() -> std::optional<double> {
           RedisServer* server = master();
           auto info = server != nullptr ? server->Cli({"INFO", "stats"})
                                         : Result<std::string>(Status::Unavailable(""));
           auto at = info.ok() ? info->find("total_reads_processed:") : std::string::npos;
           if (at == std::string::npos) {
             return std::nullopt;
           }
           return std::strtod(info->c_str() + at + 22, nullptr);
         },
         .server_requests_what = "the master's total_reads_processed",
         .read_data = [master, sentinel](const std::string&, const std::string& data_key)
             -> Result<std::optional<std::string>> {
           RedisServer* server = master();
           if (server == nullptr) {
             return sentinel()->status().ok() ? Status::Unavailable("no master")
                                              : sentinel()->status();
           }
           return ReadRedisData(*server, data_key);
         }});
  }
  {
    // redis_cluster: three masters (redis-cli --cluster create), every command sent to its key's
    // master by the slot map. Without replicas: this row measures and checks the cluster client
    // (bench/RESULTS.md, issue 20: a replica per master costs 2 shared cores its replication,
    // which a PING floor does not pay); failovers with replicas are redis_cluster_test's.
    struct Cluster {
      std::unique_ptr<RedisClusterSetup> setup;
    };

    auto cluster = [] {
      return &Server<Cluster>([]() -> Result<std::unique_ptr<Cluster>> {
        auto holder = std::make_unique<Cluster>();
        LH_ASSIGN_OR_RETURN(holder->setup, RedisClusterSetup::Start({.replicas_per_master = 0,
                                                                     .aof = Options().redis_aof}));
        return holder;
      });
    };
    fixtures.push_back(
        {.name = "redis_cluster",
         .start = [cluster] { return cluster()->status(); },
         .new_store_url =
             [cluster](const std::string&) {
               Cluster* holder = cluster()->Get();
               const std::string query = fmt::format("?prefix=fixture-{}", Fresh());
               return holder != nullptr ? holder->setup->Url(query)
                                        : "redis+cluster://127.0.0.1:1" + query;
             },
         .server_requests = [cluster]() -> std::optional<double> {
           Cluster* holder = cluster()->Get();
           if (holder == nullptr) {
             return std::nullopt;
           }
           // Every master's: a batch of renewals spans them all.
           double total = 0;
           for (int port : holder->setup->MasterPorts()) {
             auto info = holder->setup->Cli(port, {"INFO", "stats"});
             auto at = info.ok() ? info->find("total_reads_processed:") : std::string::npos;
             if (at == std::string::npos) {
               return std::nullopt;
             }
             total += std::strtod(info->c_str() + at + 22, nullptr);
           }
           return total;
         },
         .server_requests_what = "the masters' total_reads_processed, summed",
         .read_data = [cluster](const std::string&,
                                const std::string& data_key) -> Result<std::optional<std::string>> {
           Cluster* holder = cluster()->Get();
           if (holder == nullptr) {
             return cluster()->status();
           }
           LH_ASSIGN_OR_RETURN(int port, holder->setup->MasterPortForKey(data_key));
           RedisServer* server = holder->setup->ServerOnPort(port);
           if (server == nullptr) {
             return Status::Unavailable(fmt::format("no node on port {}", port));
           }
           return ReadRedisData(*server, data_key);
         }});
  }
#endif
#if LEASEHOLD_WITH_POSTGRES
  {
    // PgBouncer in transaction pooling in front of the server, for the table mode behind a pool.
    struct Postgres {
      std::unique_ptr<PostgresServer> server;
      std::unique_ptr<PgBouncer> bouncer;
    };

    auto pg = [] {
      return &Server<Postgres>([]() -> Result<std::unique_ptr<Postgres>> {
        auto both = std::make_unique<Postgres>();
        LH_ASSIGN_OR_RETURN(
            both->server,
            PostgresServer::Start({.max_connections = Options().postgres_max_connections}));
        // The fenced-write cases' data table, once, in the default schema (public) that every
        // store's connection finds on its search_path: the suite's CREATE TABLE IF NOT EXISTS
        // would race between parallel tests on one server.
        LH_RETURN_IF_ERROR(
            both->server
                ->Psql(fmt::format("CREATE TABLE IF NOT EXISTS public.{} (k TEXT PRIMARY KEY, v "
                                   "TEXT NOT NULL)",
                                   kFencedDataTable))
                .status());
        auto bouncer = PgBouncer::Start(*both->server);
        if (bouncer.ok()) {
          both->bouncer = std::move(bouncer).value();
        } else {  // the direct fixtures still work; the PgBouncer one fails to open
          std::fprintf(stderr, "%s\n", bouncer.status().ToString().c_str());
        }
        return both;
      });
    };
    auto requests = [pg]() -> std::optional<double> {
      Postgres* both = pg()->Get();
      if (both == nullptr) {
        return std::nullopt;
      }
      auto n = both->server->Psql(
          "SELECT pg_stat_force_next_flush(); SELECT xact_commit + xact_rollback FROM "
          "pg_stat_database WHERE datname = 'postgres'");
      if (!n.ok()) {
        return std::nullopt;
      }
      auto nl = n->rfind('\n');
      return std::strtod(n->c_str() + (nl == std::string::npos ? 0 : nl + 1), nullptr);
    };

    struct Mode {
      const char* name;
      const char* mode;
      bool through_bouncer;
    };

    for (Mode m :
         {Mode{"postgres_advisory", "advisory", false}, Mode{"postgres_table", "table", false},
          Mode{"postgres_table_pgbouncer", "table", true}}) {
      fixtures.push_back(
          {.name = m.name,
           .fair = std::string_view(m.mode) == "advisory",  // the server's lock queue
           .in_bench = !m.through_bouncer,
           .start = [pg] { return pg()->status(); },
           .new_store_url =
               [pg, m](const std::string&) {
                 Postgres* both = pg()->Get();
                 std::string base = "postgres://postgres@127.0.0.1:1/postgres";
                 if (both != nullptr && !m.through_bouncer) {
                   base = both->server->Url();
                 } else if (both != nullptr && both->bouncer != nullptr) {
                   base = both->bouncer->Url();
                 }
                 // Each store in its own schema, so that it starts empty.
                 std::string fresh = Fresh();
                 std::replace(fresh.begin(), fresh.end(), '-', '_');
                 return fmt::format("{}?mode={}&schema=fixture_{}&connect_timeout=3", base, m.mode,
                                    fresh);
               },
           .server_requests = requests,
           .server_requests_what =
               "PostgreSQL transactions (pg_stat_database xact_commit+rollback)",
           // psql on a direct connection to the server, whichever way the store connects.
           .read_data = [pg](const std::string& /*url*/,
                             const std::string& data_key) -> Result<std::optional<std::string>> {
             Postgres* both = pg()->Get();
             if (both == nullptr) {
               return pg()->status();
             }
             std::string literal = "'";
             for (char c : data_key) {
               literal += c;
               if (c == '\'') {
                 literal += '\'';
               }
             }
             literal += "'";
             // 'v:' marks a row, so that an empty value and no row read differently.
             Result<std::string> out = both->server->Psql(fmt::format(
                 "SELECT 'v:' || v FROM public.{} WHERE k = {}", kFencedDataTable, literal));
             if (!out.ok()) {
               return out.status();
             }
             if (std::string_view(*out).substr(0, 2) != "v:") {
               return std::optional<std::string>();
             }
             return std::optional<std::string>(out->substr(2));
           }});
    }
  }
#endif
#if LEASEHOLD_WITH_ETCD
  {
    auto etcd = [] {
      return &Server<EtcdCluster>([] { return EtcdCluster::Start({.members = 1}); });
    };
    // etcd's own Prometheus counters, on its client port.
    auto requests = [etcd]() -> std::optional<double> {
      EtcdCluster* cluster = etcd()->Get();
      if (cluster == nullptr) {
        return std::nullopt;
      }
      std::string metrics_url = cluster->Url();
      metrics_url.replace(0, std::string("etcd://").size(), "http://");
      auto text = RunCommand("timeout 5 curl -s " + ShellQuote(metrics_url + "/metrics"));
      if (!text.ok()) {
        return std::nullopt;
      }
      double total = 0;
      std::istringstream lines(*text);
      std::string line;
      while (std::getline(lines, line)) {
        if (line.rfind("grpc_server_msg_received_total{", 0) == 0) {
          total += std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
        }
      }
      return total;
    };
    for (bool fair : {false, true}) {
      fixtures.push_back(
          {.name = fair ? "etcd_fair" : "etcd",
           .fair = fair,
           .start = [etcd] { return etcd()->status(); },
           .new_store_url =
               [etcd, fair](const std::string&) {
                 EtcdCluster* cluster = etcd()->Get();
                 return fmt::format("{}?prefix=fixture-{}{}",
                                    cluster ? cluster->Url() : "etcd://127.0.0.1:1", Fresh(),
                                    fair ? "&fair=true" : "");
               },
           .server_requests = requests,
           .server_requests_what = "etcd gRPC messages received (grpc_server_msg_received_total)",
           // etcdctl on the fixture's cluster (the data keys of one test are unique on it).
           .read_data = [etcd](const std::string& /*url*/,
                               const std::string& data_key) -> Result<std::optional<std::string>> {
             EtcdCluster* cluster = etcd()->Get();
             if (cluster == nullptr) {
               return etcd()->status();
             }
             LH_ASSIGN_OR_RETURN(std::vector<EtcdKeyValue> kvs, cluster->Get(data_key));
             if (kvs.empty()) {
               return std::optional<std::string>();
             }
             return std::optional<std::string>(kvs.front().value);
           }});
    }
  }
#endif
#if LEASEHOLD_WITH_ZOOKEEPER
  {
    // tickTime 100 ms, so the shortest session (two ticks) is 200 ms and short TTLs stay short;
    // no upper clamp below 2 minutes (the clamping itself is tested in tests/backends/zookeeper/).
    auto zk = [] {
      return &Server<ZkEnsemble>(
          [] { return ZkEnsemble::Start({.tick_time = 100ms, .max_session = 120s}); });
    };
    fixtures.push_back({.name = "zk",
                        .fair = true,  // sequential nodes: waiters are granted in order
                        .start = [zk] { return zk()->status(); },
                        .new_store_url =
                            [zk](const std::string&) {
                              ZkEnsemble* ensemble = zk()->Get();
                              std::string chroot = fmt::format("/fixture-{}", Fresh());
                              return ensemble ? ensemble->Url(chroot) : "zk://127.0.0.1:1" + chroot;
                            },
                        .server_requests = [zk]() -> std::optional<double> {
                          ZkEnsemble* ensemble = zk()->Get();
                          // The server's own count of packets received ("srvr": "Received: N").
                          std::string srvr = ensemble ? ensemble->FourLetter(0, "srvr") : "";
                          auto at = srvr.find("Received: ");
                          if (at == std::string::npos) {
                            return std::nullopt;
                          }
                          return std::strtod(srvr.c_str() + at + 10, nullptr);
                        },
                        .server_requests_what = "ZooKeeper packets received (srvr Received)",
                        .read_data = ReadZkNodeData});
  }
#endif
  return fixtures;
}

}  // namespace

void SetStoreFixtureOptions(const StoreFixtureOptions& options) {
  std::lock_guard<std::mutex> lock(options_mu);
  fixture_options = options;
}

const std::vector<StoreFixture>& AllStoreFixtures() {
  static const std::vector<StoreFixture>* fixtures = new std::vector<StoreFixture>(MakeFixtures());
  return *fixtures;
}

}  // namespace leasehold::testing
