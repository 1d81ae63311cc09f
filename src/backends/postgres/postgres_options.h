// File: backends/postgres/postgres_options.h (internal)
//
// PostgresOptions: how a postgres:// store is reached. The URL and this struct are two views of
// one configuration. Both of libpq's connection-string forms work:
//
//   postgres://[user[:password]@]host[:port][,host[:port]...][/dbname][?param=value&...]
//   host=db1 port=5432 dbname=app user=app mode=table     (libpq key=value form)
//
// leasehold's own parameters, stripped before libpq sees the rest: mode (advisory | table),
// schema, create_schema (true | false), command_timeout. Every other parameter goes to libpq
// unchanged (sslmode, connect_timeout, application_name, target_session_attrs...), which
// rejects the ones it does not know. Passwords come from the URL, PGPASSWORD or ~/.pgpass (libpq
// reads the last two itself) and never appear in messages.
//
// Example:
//
//   LH_ASSIGN_OR_RETURN(Url url, ParseUrl("postgres://app:secret@db1/app?mode=table"));
//   LH_ASSIGN_OR_RETURN(PostgresOptions options, PostgresOptions::FromUrl(url));
//   // options.mode == PostgresMode::kTable, options.schema == "leasehold"
//
// Thread safety: a plain value type.

#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "core/url.h"

namespace leasehold::internal {

enum class PostgresMode {
  // pg_try_advisory_lock on a session the handle keeps; the grant lives as long as the session.
  kAdvisory,
  // A row per key with an expiry on the server's clock; works through transaction poolers.
  kTable,
};

struct PostgresOptions {
  // URL: mode=advisory | mode=table. Default: advisory.
  PostgresMode mode = PostgresMode::kAdvisory;

  // The schema that holds leasehold's table (leases). A plain SQL identifier: lower-case
  // letters, digits and '_', at most 63 bytes. URL: schema=jobs. Default: "leasehold".
  std::string schema = "leasehold";

  // Create the schema and table at open when missing (CREATE ... IF NOT EXISTS). With false, or
  // without the CREATE privilege, a missing table is an error that names `leasehold schema`.
  // URL: create_schema=false. Default: true.
  bool create_schema = true;

  // Bound on one statement's round trip; a statement still running then is cancelled.
  // URL: command_timeout=2s. Default: 5 s.
  Duration command_timeout = std::chrono::seconds(5);

  // Keyword/value pairs for PQconnectdbParams: everything libpq should see (host, port, dbname,
  // user, password, sslmode...), in URL order, plus application_name=leasehold unless given and
  // connect_timeout=5 unless given.
  std::vector<std::pair<std::string, std::string>> libpq_params;

  // The URL with its password replaced by "***", for messages.
  std::string display;

  // The password given in the URL, if any: scrubbed from every libpq message.
  std::optional<std::string> password;

  // Returns "mode=advisory" or "mode=table".
  [[nodiscard]] std::string_view ModeName() const;

  // Builds options from a "postgres" or "postgresql" URL (or a key=value conninfo, which
  // ParseUrl reads as one). Returns kInvalidArgument for another scheme, a bad mode, schema or
  // timeout (named in the message), or a password given both before '@' and as ?password=.
  static Result<PostgresOptions> FromUrl(const Url& url);
};

// Returns `message` with every trace of a password removed: "password=..." pairs of an echoed
// conninfo, and the literal `password` (when given and at least 3 bytes long).
std::string ScrubPassword(std::string message, const std::optional<std::string>& password);

}  // namespace leasehold::internal
