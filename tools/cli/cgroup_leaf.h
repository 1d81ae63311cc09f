// File: tools/cli/cgroup_leaf.h
//
// The cgroup v2 leaf a run with --contain=cgroup puts its tree in: found, created, probed.

#pragma once

#include <string>
#include <string_view>

#include "supervisor.h"

namespace leasehold::cli {

// strerror(err) as a std::string.
std::string ErrnoText(int err);

// Everything a cgroup run needs, or why there is none.
struct CgroupLeaf {
  std::string dir;
  UniqueFd procs_write;
  UniqueFd procs_read;
  UniqueFd kill;
  std::string why_not;  // non-empty: not available
};

// Creates a leaf beside this process's own cgroup and opens its files, or says why not.
CgroupLeaf PrepareCgroup();

}  // namespace leasehold::cli
