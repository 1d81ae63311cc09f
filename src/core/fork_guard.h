// File: core/fork_guard.h (internal)
//
// Which process a Store belongs to. After fork() without exec the child has copies of the
// parent's Store and Lease objects, its connections' sockets and its TLS and libpq state, but
// none of its threads: a child that released, renewed or wrote through them would end the
// parent's grant, and one that closed them politely (QUIT, libpq's Terminate, ZooKeeper's
// closeSession, an etcd lease revoke) would end the parent's session and every grant on it. So
// a StoreCore records the process that made it, and in any other process every Store and Lease
// operation refuses before it takes a lock or touches a socket, and the StoreCore is never
// destroyed there (store.cc, MakeStoreCore): its memory goes when the child exits or execs.
//
// Thread safety: thread-safe; IsForkedFrom takes no lock (a lock held by a parent's thread at
// the fork stays held in the child forever).

#pragma once

#include <cstdint>
#include <string_view>

#include <sys/types.h>

#include "leasehold/status.h"

namespace leasehold::internal {

struct ProcessStamp {
  pid_t pid = 0;
  // The count of fork()s this process's line has been through (pthread_atfork in the child):
  // exact even when a pid is reused.
  std::uint64_t forks = 0;
};

// This process's stamp. The first call registers the pthread_atfork handler.
ProcessStamp CurrentProcess();

// True in a process other than the one whose stamp this is: a fork() child (or a grandchild).
bool IsForkedFrom(const ProcessStamp& stamp);

// kLost (cause kSessionLost: the parent's sessions are not the child's): what an operation on
// `what` ("lease job:x", "store redis://...") returns in a child.
Status ForkedChildStatus(std::string_view what, const ProcessStamp& stamp);

}  // namespace leasehold::internal
