// File: leasehold/version.h
//
// The library's version, as a macro for preprocessor checks and a function for the runtime
// copy (which may differ when a program links a newer shared library), and what the linked
// library was built from: its git commit and the stores compiled in (`leasehold --version`,
// the leasehold_build_info metric).

#pragma once

#define LEASEHOLD_VERSION_MAJOR 0
#define LEASEHOLD_VERSION_MINOR 1
#define LEASEHOLD_VERSION_PATCH 0
#define LEASEHOLD_VERSION_STRING "0.1.0"

namespace leasehold {

// Returns the version of the linked library, e.g. "0.1.0".
const char* Version();

// Returns the git commit the linked library was built from, e.g. "1c3ff467f0c1" ("-dirty" added
// for a tree with uncommitted changes; "unknown" outside a git checkout).
const char* Commit();

// Returns the stores compiled into the linked library, space-separated, each by its own scheme
// (Store::CompiledSchemes() lists every scheme, aliases included), e.g. "sqlite redis postgres
// etcd zk" (memory:// is always there and not listed).
const char* CompiledStores();

}  // namespace leasehold
