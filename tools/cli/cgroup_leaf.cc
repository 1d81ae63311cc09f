// File: tools/cli/cgroup_leaf.cc

#include "cgroup_leaf.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/wait.h>

#include "child_env.h"
#include "exit_codes.h"
#include "keeper_protocol.h"

namespace leasehold::cli {

std::string ReadFirstLine(const std::string& path, std::string_view prefix) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) {
      return line;
    }
  }
  return {};
}

// Returns the mount point of the cgroup v2 hierarchy, or "".
std::string FindCgroup2Mount() {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    // "36 25 0:30 / /sys/fs/cgroup/unified rw,... shared:9 - cgroup2 cgroup2 rw"
    const std::size_t dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) {
      continue;
    }
    std::size_t pos = 0;
    for (int field = 0; field < 4 && pos != std::string::npos; ++field) {
      pos = line.find(' ', pos + 1);
    }
    if (pos == std::string::npos) {
      continue;
    }
    const std::size_t end = line.find(' ', pos + 1);
    return line.substr(pos + 1, end - pos - 1);
  }
  return {};
}

std::string ErrnoText(int err) {
  return std::strerror(err);
}

CgroupLeaf PrepareCgroup() {
  static int sequence = 0;
  CgroupLeaf leaf;
  const std::string mount = FindCgroup2Mount();
  if (mount.empty()) {
    leaf.why_not = "no cgroup v2 hierarchy is mounted";
    return leaf;
  }
  std::string own = ReadFirstLine("/proc/self/cgroup", "0::");
  if (own.size() < 3) {
    leaf.why_not = "this process is in no cgroup v2 group";
    return leaf;
  }
  own = own.substr(3);
  if (own == "/") {
    own.clear();
  }
  // The pid alone does not make the name unique: leasehold as PID 1 of a container's namespace
  // shares it with every other such container under the same parent.
  int made = -1;
  for (int attempt = 0; attempt < 100 && made != 0; ++attempt) {
    leaf.dir = fmt::format("{}{}/leasehold-{}-{}", mount, own, ::getpid(), ++sequence);
    made = ::mkdir(leaf.dir.c_str(), 0755);
    if (made != 0 && errno != EEXIST) {
      break;
    }
  }
  if (made != 0) {
    leaf.why_not = fmt::format("cannot create {}: {}", leaf.dir, ErrnoText(errno));
    leaf.dir.clear();
    return leaf;
  }
  leaf.procs_write = UniqueFd(::open((leaf.dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
  leaf.procs_read = UniqueFd(::open((leaf.dir + "/cgroup.procs").c_str(), O_RDONLY | O_CLOEXEC));
  leaf.kill = UniqueFd(::open((leaf.dir + "/cgroup.kill").c_str(), O_WRONLY | O_CLOEXEC));
  if (!leaf.procs_write.valid() || !leaf.procs_read.valid()) {
    leaf.why_not = fmt::format("cannot open {}/cgroup.procs: {}", leaf.dir, ErrnoText(errno));
  } else {
    // A process may not be allowed to move into it (delegation, the no-internal-process rule):
    // find out with a throwaway child rather than with the command.
    const int fd = leaf.procs_write.get();
    pid_t probe = RawFork(0);
    if (probe == 0) {
      ::_exit(WriteAll(fd, "0", 1) ? 0 : (errno & 0x7f));
    }
    int status = 0;
    while (probe > 0 && ::waitpid(probe, &status, 0) < 0 && errno == EINTR) {
    }
    if (probe < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      leaf.why_not =
          fmt::format("cannot move a process into {}: {}", leaf.dir,
                      probe < 0 ? ErrnoText(errno)
                                : ErrnoText(WIFEXITED(status) ? WEXITSTATUS(status) : EINVAL));
    }
  }
  if (!leaf.why_not.empty()) {
    leaf.procs_write.Reset();
    leaf.procs_read.Reset();
    leaf.kill.Reset();
    ::rmdir(leaf.dir.c_str());
    leaf.dir.clear();
  }
  return leaf;
}

}  // namespace leasehold::cli
