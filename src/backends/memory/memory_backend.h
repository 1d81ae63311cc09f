// File: backends/memory/memory_backend.h (internal)
//
// memory://[name]: leases kept in this process, with expiry on the injected Clock, so that
// core unit tests run deterministically on a FakeClock. Handles opened with the same name in
// one process share one table, on the first opener's clock (a handle on another clock is
// refused, never mixed); an empty name gives a private table. Fenced writes (Put, Delete) keep
// their data in the table too. Not for production: nothing survives the process.
//
// Thread safety: thread-safe (one mutex per table).

#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "leasehold/clock.h"

#include "backends/backend.h"
#include "core/url.h"

namespace leasehold::internal {

// Opens the table named by url.authority (scheme "memory").
Result<std::shared_ptr<Backend>> OpenMemoryBackend(const Url& url, Clock& clock);

// For tests: the value a fenced write left at `key` in the open table `name`; nullopt if the
// key has none or no handle has the table open.
std::optional<std::string> ReadMemoryDataForTesting(std::string_view name, std::string_view key);

}  // namespace leasehold::internal
