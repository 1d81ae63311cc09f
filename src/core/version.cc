// File: core/version.cc

#include "leasehold/version.h"

#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/registry.h"

// Generated at every build by cmake/BuildInfo.cmake (rewritten only when the commit changes).
#include "leasehold_build_info.h"

namespace leasehold {

const char* Version() {
  return LEASEHOLD_VERSION_STRING;
}

const char* Commit() {
  return LEASEHOLD_GIT_COMMIT;
}

const char* CompiledStores() {
  // The registry's rows, joined once (backends/registry.cc: one row per store).
  static const std::string* const kStores =
      new std::string(fmt::format("{}", fmt::join(internal::CompiledStoreNames(), " ")));
  return kStores->c_str();
}

}  // namespace leasehold
