// File: backends/registry.h (internal)
//
// The explicit table of stores (registry.cc, one row per store): their URL schemes, whether
// they are compiled in, how to open them, and what the CLI and the core need of them. No static
// registrars, whose order of initialization across files is unspecified.
//
// Thread safety: thread-safe.

#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/status.h"

#include "backends/backend.h"
#include "core/url.h"

namespace leasehold::internal {

// Opens the backend for `url` on `clock`. Returns kInvalidArgument for a malformed URL or an
// unknown scheme (listing the known ones), or for a clock other than Clock::Real() with a store
// whose grants expire on a clock outside the process (every store but memory://);
// kUnimplemented for a known scheme not compiled in; the backend's own errors otherwise.
Result<std::shared_ptr<Backend>> OpenBackend(const Url& url, Clock& clock);

// Returns the schemes compiled into this build, e.g. {"memory", "sqlite"}.
std::vector<std::string> CompiledSchemes();

// Returns the stores compiled into this build, each by its own scheme (the first of its row),
// in the registry's order and without memory:// (always there), e.g. {"sqlite", "redis"}: what
// leasehold::CompiledStores() joins.
std::vector<std::string> CompiledStoreNames();

// Returns the SQL a DBA applies to create the store's schema (`leasehold schema`), without
// connecting. Returns kUnimplemented for stores that need none (or are not compiled in), and
// kInvalidArgument for a bad URL.
Result<std::string> StoreSchemaSql(const Url& url);

// Returns true if a store of `scheme` may run on any Clock (a FakeClock in tests), false if its
// grants expire on a clock outside the process, so that OpenBackend refuses any clock but
// Clock::Real(). Only memory:// is of the first kind.
bool AcceptsAnyClock(std::string_view scheme);

// Returns the default store's URL (the embedded SQLite file), or kInvalidArgument if this build
// has no default store.
Result<std::string> DefaultStoreUrl();

// Reads store text without a scheme that some store accepts (libpq's key=value conninfo names a
// PostgreSQL store), or returns nullopt if no store reads it. ParseUrl calls it first.
std::optional<Result<Url>> ParseSchemelessUrl(std::string_view text);

}  // namespace leasehold::internal
