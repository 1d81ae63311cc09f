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
#include <string_view>

#include "leasehold/status.h"
#include "leasehold/store.h"

namespace leasehold::cli {

// Opens the store named by `url`, or by Store::DefaultUrl() ($LEASEHOLD_STORE, then the host's
// configuration file, then the host-wide embedded store) when `url` is empty. A store confined
// to one process (memory://) is kInvalidArgument: it would exclude no other command.
Result<std::unique_ptr<Store>> OpenStoreFromFlag(const std::string& url);

// "store URL (shared by SCOPE)": which store a command used and who shares its leases.
std::string DescribeStore(const Store& store);

// Returns the status's message with its store detail, on one line: "message (detail)".
std::string Describe(const Status& status);

// Prints Describe(status) as one error line and returns the matching exit code.
int ReportFailure(const Status& status);

// `text` safe to print on a terminal or in a log line: every control character (C0, DEL, C1)
// and backslash written as \xNN, so that a key or holder id read from a store (which anyone with
// access to the store may have written) cannot forge a line of output.
std::string Printable(std::string_view text);

// Returns the text of a holder for people: "host:42 (fencing token 7, expires in 1.5s)"; a kept
// grant (LeaseInfo::kept): "host:42 (fencing token 7, released, kept for 3.2s)"; a waiting
// writer (LeaseInfo::waiting_writer): "host:42, a writer waiting for it (...)".
std::string DescribeHolder(const LeaseInfo& info);

}  // namespace leasehold::cli
