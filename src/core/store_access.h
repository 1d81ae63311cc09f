// File: core/store_access.h (internal)
//
// A Store over a backend the caller made: the tests' decorators (tests/testing/) and the
// benchmark's renewal counter reach the public API through it. Not installed.

#pragma once

#include <memory>

#include "leasehold/store.h"

#include "backends/backend.h"

namespace leasehold::internal {

// A Store over `backend`, named "<scheme>://(testing)" in messages, on options.clock (or the
// real clock).
std::unique_ptr<Store> OpenStoreWithBackend(std::shared_ptr<Backend> backend,
                                            StoreOptions options = {});

}  // namespace leasehold::internal
