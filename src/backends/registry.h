// File: backends/registry.h (internal)
//
// The explicit table of URL schemes and the backends compiled in (no static registrars: see
// STYLE.md on Arrow's registry pitfalls).
//
// Thread safety: thread-safe.

#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "core/url.h"
#include "leasehold/clock.h"
#include "leasehold/status.h"

namespace leasehold::internal {

// Opens the backend for `url`. Returns kInvalidArgument for a malformed URL or an unknown
// scheme (listing the known ones), kUnimplemented for a known scheme not compiled in, and the
// backend's own errors otherwise.
Result<std::shared_ptr<Backend>> OpenBackend(const Url& url, Clock& clock);

// Returns the schemes compiled into this build, e.g. {"memory", "sqlite"}.
std::vector<std::string> CompiledSchemes();

// Returns the SQL a DBA applies to create the store's schema (`leasehold schema`), without
// connecting. Returns kUnimplemented for stores that need none (or are not compiled in), and
// kInvalidArgument for a bad URL.
Result<std::string> StoreSchemaSql(const Url& url);

}  // namespace leasehold::internal
