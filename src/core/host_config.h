// File: core/host_config.h (internal)
//
// The host's configuration file: settings every leasehold process of this host shares, so that
// one crontab or unit line on every host needs no --store. The file is $LEASEHOLD_CONFIG, else
// /etc/leasehold/leasehold.conf; lines are `key = value` (blanks around both trimmed), and
// blank lines and lines starting with '#' are skipped. Keys read so far: `store` (the store URL,
// Store::DefaultUrl).
//
// Example (/etc/leasehold/leasehold.conf):
//
//   # the fleet's store
//   store = redis://leases.internal:6379/0?prefix=leasehold
//
// Thread safety: plain functions (reads the file at each call).

#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "leasehold/status.h"

namespace leasehold::internal {

// The configuration file when $LEASEHOLD_CONFIG is not set.
inline constexpr std::string_view kHostConfigPath = "/etc/leasehold/leasehold.conf";

// The value of `key` in `text` (the file's contents, named `file` in messages): nullopt if no
// line sets it (the last line that does wins). kInvalidArgument naming file:line for a line that
// is not blank, a comment or `key = value`.
Result<std::optional<std::string>> ConfigValue(std::string_view text, std::string_view file,
                                               std::string_view key);

// ConfigValue of the host's configuration file: nullopt if the default file does not exist.
// kInvalidArgument if $LEASEHOLD_CONFIG names a file that cannot be read (it was asked for),
// kPermissionDenied if the file exists but cannot be read.
Result<std::optional<std::string>> HostConfigValue(std::string_view key);

}  // namespace leasehold::internal
