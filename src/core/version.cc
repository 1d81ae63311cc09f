// File: core/version.cc

#include "leasehold/version.h"

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
  static constexpr char kStores[] =
      ""
#if LEASEHOLD_WITH_SQLITE
      " sqlite"
#endif
#if LEASEHOLD_WITH_REDIS
      " redis"
#endif
#if LEASEHOLD_WITH_POSTGRES
      " postgres"
#endif
#if LEASEHOLD_WITH_ETCD
      " etcd"
#endif
#if LEASEHOLD_WITH_ZOOKEEPER
      " zk"
#endif
      ;
  return kStores[0] == ' ' ? kStores + 1 : kStores;  // without the leading space
}

}  // namespace leasehold
