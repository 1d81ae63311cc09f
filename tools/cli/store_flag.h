// File: tools/cli/store_flag.h
//
// The --store flag shared by every subcommand, and the one-line description of a failed call.
//
// Example:
//
//   auto store = OpenStoreFromFlag(flags.store_url);  // "" means $LEASEHOLD_STORE or the default
//   if (!store.ok()) return ReportFailure(store.error());
//
// Thread safety: thread-safe.

#pragma once

#include <memory>
#include <string>

#include "leasehold/status.h"
#include "leasehold/store.h"

namespace leasehold::cli {

// Opens the store named by `url`, or by Store::DefaultUrl() ($LEASEHOLD_STORE, then the embedded
// SQLite file) when `url` is empty.
Result<std::unique_ptr<Store>> OpenStoreFromFlag(const std::string& url);

// Returns the status's message with its store detail, on one line: "message (detail)".
std::string Describe(const Status& status);

// Prints Describe(status) as one error line and returns the matching exit code.
int ReportFailure(const Status& status);

// Returns the text of a holder for people: "host:42 (fencing token 7, expires in 1.5s)".
std::string DescribeHolder(const LeaseInfo& info);

}  // namespace leasehold::cli
