// File: leasehold/version.h
//
// The library's version, as a macro for preprocessor checks and a function for the runtime
// copy (which may differ when a program links a newer shared library).

#pragma once

#define LEASEHOLD_VERSION_MAJOR 0
#define LEASEHOLD_VERSION_MINOR 1
#define LEASEHOLD_VERSION_PATCH 0
#define LEASEHOLD_VERSION_STRING "0.1.0"

namespace leasehold {

// Returns the version of the linked library, e.g. "0.1.0".
const char* Version();

}  // namespace leasehold
