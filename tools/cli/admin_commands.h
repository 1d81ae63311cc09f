// File: tools/cli/admin_commands.h
//
// The operator subcommands: `status KEY`, `list [PREFIX]` (both with --json),
// `release --force KEY` and `schema`. Each returns the process exit code (exit_codes.h).
//
// Text output (stdout) is for people; --json output is one JSON document for scripts:
//   status: {"key": "job", "held": true, "holder": "web-3:42", "token_prefix": "1f2e3d4c",
//            "fencing_token": 7, "remaining_ms": 8123, "ttl_ms": 10000}
//           or {"key": "job", "held": false}
//   list:   [ {same fields as status, without "held"}, ... ] ordered by key
//
// Thread safety: call from the main thread.

#pragma once

#include <string>

namespace leasehold::cli {

int StatusCommand(const std::string& store_url, const std::string& key, bool json);

int ListCommand(const std::string& store_url, const std::string& prefix, bool json);

// REQUIRES: force; without it the caller reports a usage error instead (only the holder
// releases a lease; --force is the operator break-glass).
int ReleaseCommand(const std::string& store_url, const std::string& key, const std::string& holder);

// `schema`: prints the SQL that creates the store's table (postgres:// only), for a DBA to
// apply when leasehold's role may not create tables. Does not connect.
int SchemaCommand(const std::string& store_url);

}  // namespace leasehold::cli
