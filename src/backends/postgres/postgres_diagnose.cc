// File: backends/postgres/postgres_diagnose.cc (internal)
//
// The store doctor's findings for both postgres:// modes (PgDiagnose, postgres_common.h):
// durability, topology (standbys, their sync state, the timeline, a pooler) and permissions.

#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "backends/common/sql_statement.h"
#include "backends/postgres/postgres_common.h"
#include "backends/postgres/postgres_sql.h"

namespace leasehold::internal {

namespace sql = postgres_sql;

namespace {

// A quoted SQL identifier for the GRANT lines: "app", "we""ird".
std::string QuoteIdent(std::string_view name) {
  std::string out = "\"";
  for (char c : name) {
    out += c;
    if (c == '"') {
      out += '"';
    }
  }
  return out + "\"";
}

// kDiagnose's row, by column (see postgres_sql.h).
struct PgSettings {
  std::optional<std::string> fsync;
  std::optional<std::string> synchronous_commit;
  std::optional<std::string> full_page_writes;
  std::optional<std::string> standby_names;
  std::string version;
  long long version_num = 0;
  bool in_recovery = false;
  int backend_pid = 0;
  std::string role;
  bool schema_exists = false;
  bool schema_usage = false;
  bool schema_create = false;
  bool database_create = false;

  struct Table {
    bool exists = false;
    bool select = false;
    bool insert = false;
    bool update = false;
  };

  Table leases;
  Table records;
  std::optional<long long> replicas;
  // Of those, the synchronous ones (sync_state sync or quorum).
  std::optional<long long> sync_replicas;
  Table shares;
  bool shares_delete = false;
  // The server's timeline (the primary's WAL insert position's; a standby's last checkpoint's).
  long long timeline = 0;
  std::string system_identifier;
  std::string cluster_name;
  // A session of Patroni's is visible in pg_stat_activity (application_name "Patroni...").
  bool patroni_seen = false;
};

PgSettings ReadSettings(const PgResult& r) {
  auto text = [&](int col) -> std::optional<std::string> {
    if (r.IsNull(0, col)) {
      return std::nullopt;
    }
    return std::string(r.Get(0, col));
  };
  auto table = [&](int col) {
    return PgSettings::Table{.exists = r.GetBool(0, col),
                             .select = r.GetBool(0, col + 1),
                             .insert = r.GetBool(0, col + 2),
                             .update = r.GetBool(0, col + 3)};
  };
  PgSettings s;
  s.fsync = text(0);
  s.synchronous_commit = text(1);
  s.full_page_writes = text(2);
  s.standby_names = text(3);
  s.version = std::string(r.Get(0, 4));
  s.version_num = r.GetInt(0, 5);
  s.in_recovery = r.GetBool(0, 6);
  s.backend_pid = static_cast<int>(r.GetInt(0, 7));
  s.role = std::string(r.Get(0, 8));
  s.schema_exists = r.GetBool(0, 9);
  s.schema_usage = r.GetBool(0, 10);
  s.schema_create = r.GetBool(0, 11);
  s.database_create = r.GetBool(0, 12);
  s.leases = table(13);
  s.records = table(17);
  if (!r.IsNull(0, 21)) {
    s.replicas = r.GetInt(0, 21);
  }
  if (!r.IsNull(0, 22)) {
    s.sync_replicas = r.GetInt(0, 22);
  }
  s.shares = table(23);
  s.shares_delete = r.GetBool(0, 27);
  s.timeline = r.GetInt(0, 28);
  s.system_identifier = std::string(r.Get(0, 29));
  s.cluster_name = std::string(r.Get(0, 30));
  s.patroni_seen = r.GetBool(0, 31);
  return s;
}

CheckItem Unreadable(std::string_view area, std::string_view setting) {
  return CheckItem{
      .area = std::string(area),
      .verdict = CheckVerdict::kWarn,
      .found = fmt::format("the server does not report {} (current_setting is NULL): its "
                           "durability cannot be judged",
                           setting),
      .fix =
          fmt::format("check {} on the server by hand (SHOW {} as its owner)", setting, setting)};
}

// The durability of committed grants and fencing counter bumps on this server.
void DurabilityItems(const PgSettings& s, std::vector<CheckItem>& items) {
  const std::size_t first = items.size();
  if (!s.fsync) {
    items.push_back(Unreadable("durability", "fsync"));
  } else if (*s.fsync == "off") {
    items.push_back(
        {.area = "durability",
         .verdict = CheckVerdict::kUnsafe,
         .found = "fsync is off: a crash of the server host can lose or corrupt grants and "
                  "fencing counters",
         .fix = "set fsync = on (ALTER SYSTEM SET fsync = on; SELECT pg_reload_conf())"});
  }
  // synchronous_commit = off acknowledges a COMMIT before its WAL is flushed: a server crash
  // (not only a host crash) can then lose the last commits, among them a grant's fence bump that
  // its holder already received. After the restart the counter is lower than a token in use,
  // and the next grant hands out that same fencing token again: two holders with one token is
  // exactly what fencing must rule out, so this is unsafe, not a warning. `local` flushes
  // locally and only skips waiting for synchronous standbys: the same as `on` without any,
  // a failover risk (as asynchronous standbys are, below) with them.
  if (!s.synchronous_commit) {
    items.push_back(Unreadable("durability", "synchronous_commit"));
  } else if (*s.synchronous_commit == "off") {
    items.push_back(
        {.area = "durability",
         .verdict = CheckVerdict::kUnsafe,
         .found = "synchronous_commit is off for this role's sessions: a server crash can lose "
                  "the last committed grants and fence bumps, and the next grant would reuse a "
                  "fencing token already handed out",
         .fix = "set synchronous_commit = on for leasehold's role and database (ALTER ROLE ... "
                "RESET synchronous_commit, or ALTER SYSTEM SET synchronous_commit = on)"});
  } else if (*s.synchronous_commit == "local" && s.standby_names && !s.standby_names->empty()) {
    items.push_back({.area = "durability",
                     .verdict = CheckVerdict::kWarn,
                     .found =
                         "synchronous_commit is local: commits do not wait for the synchronous "
                         "standbys, so a failover can lose the last grants and fence bumps",
                     .fix = "set synchronous_commit = on (or remote_apply) for leasehold's role"});
  }
  if (!s.full_page_writes) {
    items.push_back(Unreadable("durability", "full_page_writes"));
  } else if (*s.full_page_writes == "off") {
    items.push_back(
        {.area = "durability",
         .verdict = CheckVerdict::kUnsafe,
         .found = "full_page_writes is off: a crash during a page write can leave torn pages "
                  "in the leases table (lost or corrupt fencing counters)",
         .fix = "set full_page_writes = on (unless the storage writes 8 kB pages atomically)"});
  }
  if (items.size() == first) {
    items.push_back({.area = "durability",
                     .found = fmt::format("fsync {}, synchronous_commit {}, full_page_writes {}: "
                                          "committed grants and fencing counters survive a crash "
                                          "of the server",
                                          *s.fsync, *s.synchronous_commit, *s.full_page_writes)});
  }
}

// Primary or standby, the version, a pooler in between, the standbys.
void HaItems(const PgSettings& s, const PostgresOptions& options, std::vector<CheckItem>& items);

void TopologyItems(const PgSettings& s, const PgConnection& conn, const PostgresOptions& options,
                   std::vector<CheckItem>& items) {
  if (s.in_recovery) {
    items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kUnsafe,
         .found = fmt::format("PostgreSQL {} is a standby (pg_is_in_recovery()): it refuses "
                              "every write, so it can grant no lease",
                              s.version),
         .fix = "point the URL at the primary (a host list with target_session_attrs=read-write "
                "follows a failover)"});
  } else if (options.mode == PostgresMode::kAdvisory && s.version_num > 0 &&
             s.version_num < 140000) {
    items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kUnsafe,
         .found = fmt::format("PostgreSQL {} has no idle_session_timeout (14 and later): "
                              "mode=advisory bounds a grant's session with it",
                              s.version),
         .fix = "upgrade to PostgreSQL 14 or later, or use mode=table"});
  } else {
    items.push_back(
        {.area = "topology",
         .found = fmt::format("PostgreSQL {}, a primary (not in recovery)", s.version)});
  }

  // The pooler check the backend makes at open (postgres_connection.h, startup_pid): PgBouncer
  // sends the client a backend pid of its own at startup, never the server's pg_backend_pid().
  const bool pooled = s.backend_pid != conn.startup_pid();
  if (options.mode == PostgresMode::kAdvisory) {
    if (pooled) {
      items.push_back(
          {.area = "topology",
           .verdict = CheckVerdict::kUnsafe,
           .found = fmt::format("a connection pooler sits in between (startup backend pid {}, "
                                "pg_backend_pid() {}): advisory locks belong to the server "
                                "session, which a pooler hands to other clients",
                                conn.startup_pid(), s.backend_pid),
           .fix = "use mode=table through poolers, or connect to PostgreSQL directly"});
    } else {
      items.push_back({.area = "topology",
                       .found = "a server session of its own (the startup backend pid is "
                                "pg_backend_pid(): no pooler seen), as mode=advisory needs"});
    }
  } else {
    items.push_back(
        {.area = "topology",
         .found = pooled ? fmt::format("through a connection pooler (startup backend pid {}, "
                                       "pg_backend_pid() {}): mode=table is pooler-safe; waiters "
                                       "poll instead of LISTEN",
                                       conn.startup_pid(), s.backend_pid)
                         : "a direct connection (no pooler seen); mode=table is pooler-safe, "
                           "waiters LISTEN"});
  }

  HaItems(s, options, items);
}

// The server's history (timeline, system identifier, a failover manager) and its standbys: what
// a failover can lose.
void HaItems(const PgSettings& s, const PostgresOptions& options, std::vector<CheckItem>& items) {
  // The server's history, as fencing tokens carry it (LH_PG_EPOCH, postgres_sql.h).
  std::string manager;
  if (s.patroni_seen) {
    manager = fmt::format(
        "; a Patroni session is connected{}",
        s.cluster_name.empty() ? "" : fmt::format(" (cluster_name '{}')", s.cluster_name));
  } else if (!s.cluster_name.empty()) {
    manager = fmt::format("; cluster_name '{}'", s.cluster_name);
  }
  items.push_back({.area = "topology",
                   .found = fmt::format(
                       "timeline {}, system identifier {}{}: fencing tokens granted here "
                       "start above {} (the timeline in their high bits), so every token "
                       "after a failover or a promoting restore is greater than every one "
                       "before it",
                       s.timeline, s.system_identifier.empty() ? "unknown" : s.system_identifier,
                       manager, s.timeline > 1 ? ((s.timeline - 1) << 40) : 0)});

  if (s.in_recovery) {
    return;  // a standby's own (cascading) standbys say nothing about the primary's copies
  }
  const bool sync_wait =
      s.synchronous_commit && *s.synchronous_commit != "off" && *s.synchronous_commit != "local";
  if (!s.replicas) {
    items.push_back({.area = "topology",
                     .verdict = CheckVerdict::kWarn,
                     .found = "pg_stat_replication is not readable by this role: the standbys "
                              "cannot be counted",
                     .fix = "check the standbys by hand: an asynchronous one loses the last "
                            "commits at a failover"});
  } else if (*s.replicas == 0) {
    items.push_back({.area = "topology",
                     .verdict = CheckVerdict::kWarn,
                     .found = "no standby streams from this server: its storage is the only "
                              "copy of the fencing counters",
                     .fix = "for a store that must outlive this host, add a synchronous standby "
                            "(synchronous_standby_names)"});
  } else if (s.sync_replicas.value_or(0) == 0 || !sync_wait) {
    items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kWarn,
         .found = fmt::format(
             "{} standby(s), none of which confirms leasehold's commits (synchronous standbys: "
             "{}; synchronous_standby_names '{}', synchronous_commit {}): a failover loses the "
             "last grants, renewals and fence bumps. A lost grant's holder runs on until its "
             "next renewal finds the grant gone while a new holder may already run; fencing "
             "tokens still only grow (they carry the timeline), so fenced writes stay safe",
             *s.replicas, s.sync_replicas ? std::to_string(*s.sync_replicas) : "unknown",
             s.standby_names.value_or(""), s.synchronous_commit.value_or("unknown")),
         .fix = "set synchronous_standby_names (and synchronous_commit = on or remote_apply) so "
                "that every grant waits for a standby, or fence every write and accept the "
                "failover window (README: PostgreSQL in production)"});
  } else {
    items.push_back(
        {.area = "topology",
         .found = fmt::format("{} standby(s), {} synchronous (synchronous_standby_names '{}', "
                              "synchronous_commit {}): a failover to a synchronous standby keeps "
                              "every grant leasehold reported; a commit the standby did not "
                              "confirm is never reported as granted",
                              *s.replicas, *s.sync_replicas, s.standby_names.value_or(""),
                              *s.synchronous_commit)});
  }
  if (options.mode == PostgresMode::kAdvisory && s.replicas.value_or(0) > 0) {
    items.push_back(
        {.area = "topology",
         .verdict = CheckVerdict::kWarn,
         .found = "mode=advisory: advisory locks are not replicated, so after a failover the new "
                  "primary grants every key at once, while a holder learns of it only when its "
                  "session to the old primary ends (at once if that server died; after the "
                  "session bounds if it hangs): fencing covers that window",
         .fix = "use mode=table with a synchronous standby for no overlap across a failover"});
  }
}

// USAGE and CREATE on the schema, SELECT, INSERT, UPDATE on both tables.
void PermissionItems(const PgSettings& s, const PostgresOptions& options,
                     std::vector<CheckItem>& items) {
  const std::string role = QuoteIdent(s.role);
  const std::string schema = QuoteIdent(options.schema);
  const std::size_t first = items.size();
  auto denied = [&](std::string found, std::string fix) {
    items.push_back({.area = "permissions",
                     .verdict = CheckVerdict::kPermissionDenied,
                     .found = std::move(found),
                     .fix = std::move(fix)});
  };
  if (!s.schema_exists) {
    if (!s.database_create) {
      denied(fmt::format("schema {} does not exist and role {} lacks CREATE on the database to "
                         "make it",
                         schema, role),
             fmt::format("have a DBA run the SQL of `leasehold schema --store URL`, then GRANT "
                         "USAGE ON SCHEMA {} TO {}",
                         schema, role));
    }
  } else if (!s.schema_usage) {
    denied(fmt::format("role {} lacks USAGE on schema {}", role, schema),
           fmt::format("GRANT USAGE ON SCHEMA {} TO {}", schema, role));
  } else {
    for (const auto& [name, t] :
         {std::pair<std::string_view, const PgSettings::Table&>{"leases", s.leases},
          {"records", s.records}}) {
      const std::string table = fmt::format("{}.{}", schema, name);
      if (!t.exists) {
        if (!s.schema_create) {
          denied(fmt::format("table {} does not exist and role {} lacks CREATE on schema {} to "
                             "make it{}",
                             table, role, schema,
                             name == "records" ? " (schedule slots, --once-per, fail)" : ""),
                 fmt::format("have a DBA run the SQL of `leasehold schema --store URL` (it "
                             "creates what is missing), then GRANT SELECT, INSERT, UPDATE ON {} "
                             "TO {}",
                             table, role));
        }
        continue;
      }
      std::vector<std::string_view> missing;
      for (const auto& [privilege, held] : {std::pair<std::string_view, bool>{"SELECT", t.select},
                                            {"INSERT", t.insert},
                                            {"UPDATE", t.update}}) {
        if (!held) {
          missing.push_back(privilege);
        }
      }
      if (!missing.empty()) {
        denied(fmt::format("role {} lacks {} on {}", role, fmt::join(missing, ", "), table),
               fmt::format("GRANT SELECT, INSERT, UPDATE ON {} TO {}", table, role));
      }
    }
  }
  if (items.size() == first) {
    items.push_back(
        {.area = "permissions",
         .found = fmt::format("role {} has USAGE on schema {} and SELECT, INSERT, UPDATE on its "
                              "tables (or may create them); LISTEN and the advisory lock "
                              "functions need no grant",
                              role, schema)});
  }
  // Shared and semaphore leases (mode=table only): without the shares table, exclusive leases
  // work as before, so this is a warning, not a refusal.
  if (options.mode == PostgresMode::kTable && s.schema_exists && s.schema_usage) {
    const std::string table = fmt::format("{}.shares", schema);
    const std::string grant =
        fmt::format("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}", table, role);
    if (!s.shares.exists && !s.schema_create) {
      items.push_back(
          {.area = "permissions",
           .verdict = CheckVerdict::kWarn,
           .found = fmt::format("table {} does not exist and role {} lacks CREATE on schema {} to "
                                "make it: shared and semaphore leases fail (exclusive ones work)",
                                table, role, schema),
           .fix = fmt::format("have a DBA run the SQL of `leasehold schema --store URL`, then {}",
                              grant)});
    } else if (s.shares.exists &&
               !(s.shares.select && s.shares.insert && s.shares.update && s.shares_delete)) {
      items.push_back({.area = "permissions",
                       .verdict = CheckVerdict::kWarn,
                       .found = fmt::format("role {} lacks some of SELECT, INSERT, UPDATE, DELETE "
                                            "on {}: shared and semaphore leases fail (exclusive "
                                            "ones work)",
                                            role, table),
                       .fix = grant});
    }
  }
}

// The one line naming what the role needs (Diagnosis::permissions_fix).
std::string PermissionsFix(std::string_view role_name, const PostgresOptions& options) {
  const std::string role = QuoteIdent(role_name);
  const std::string schema = QuoteIdent(options.schema);
  std::string fix = fmt::format(
      "GRANT USAGE ON SCHEMA {0} TO {1}; GRANT SELECT, INSERT, UPDATE ON {0}.leases, "
      "{0}.records TO {1} (a DBA first runs the SQL of `leasehold schema --store URL` if the "
      "role may not create them)",
      schema, role);
  if (options.mode == PostgresMode::kAdvisory) {
    fix += fmt::format("; release --force also needs GRANT pg_signal_backend TO {}", role);
  } else {
    fix += fmt::format(
        "; shared and semaphore leases also need GRANT SELECT, INSERT, UPDATE, "
        "DELETE ON {}.shares TO {}",
        schema, role);
  }
  return fix;
}

}  // namespace

Result<Diagnosis> PgDiagnose(PgConnection& conn, const PostgresOptions& options, Clock& clock) {
  const std::string statement = PgStatement(sql::kDiagnose, options);
  auto run = [&](std::string_view replicas) {
    // kDiagnose holds {replicas} once.
    std::string filled = statement;
    filled.replace(filled.find("{replicas}"), std::string_view("{replicas}").size(), replicas);
    // ExecOnce: never prepared, so one round trip even on a connection that prepares.
    return conn.ExecOnce("diagnose", filled, {options.schema}, PgDeadline(options, clock));
  };
  Result<PgResult> r = run(sql::kDiagnoseReplicas);
  if (!r.ok() && r.status().detail() == kSqlStateInsufficientPrivilege && !conn.broken()) {
    // Only pg_stat_replication can be refused here (every other part is open to any role):
    // ask again without it, and say so.
    r = run(sql::kDiagnoseNoReplicas);
  }
  LH_RETURN_IF_ERROR(r.status());
  const PgSettings s = ReadSettings(*r);
  // PostgreSQL counts TTLs in milliseconds (intervals, idle_session_timeout): finer than the
  // advice's own rounding, so no granularity.
  Diagnosis d{.probe = std::string(sql::kPing)};
  DurabilityItems(s, d.items);
  TopologyItems(s, conn, options, d.items);
  PermissionItems(s, options, d.items);
  d.permissions_fix = PermissionsFix(s.role, options);
  return d;
}

}  // namespace leasehold::internal
