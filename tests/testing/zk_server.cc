// File: tests/testing/zk_server.cc
//
// ZkEnsemble: ZooKeeper servers (QuorumPeerMain, which also runs a standalone server when the
// config names no peers) started by testing/server_process.h, readiness by "srvr" over TCP,
// stop by PID.

#include "testing/zk_server.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <zookeeper/zookeeper.h>

#include "backends/zookeeper/zk_options.h"
#include "core/url.h"

namespace leasehold::testing {

namespace {

constexpr const char* kJava = "/usr/bin/java";
constexpr const char* kClassPath =
    "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:"
    "/usr/share/java/log4j-1.2.jar";

// The session state the C client reports, for ReadZkNodeData to wait on.
struct ZkConnection {
  std::mutex mu;
  std::condition_variable cv;
  int state = 0;
};

void ZkConnectionWatcher(zhandle_t* /*zh*/, int type, int state, const char* /*path*/, void* ctx) {
  if (type != ZOO_SESSION_EVENT || ctx == nullptr) {
    return;
  }
  auto* conn = static_cast<ZkConnection*>(ctx);
  {
    std::lock_guard<std::mutex> lock(conn->mu);
    conn->state = state;
  }
  conn->cv.notify_all();
}

}  // namespace

Result<std::optional<std::string>> ReadZkNodeData(const std::string& url, const std::string& path) {
  LH_ASSIGN_OR_RETURN(internal::Url parsed, internal::ParseUrl(url));
  LH_ASSIGN_OR_RETURN(internal::ZkOptions options, internal::ZkOptions::FromUrl(parsed));
  if (options.user.has_value()) {
    return Status::Unimplemented("ReadZkNodeData reads without credentials");
  }
  ZkConnection conn;
  zhandle_t* zh =
      zookeeper_init(options.hosts.c_str(), &ZkConnectionWatcher, 10'000, nullptr, &conn, 0);
  if (zh == nullptr) {
    return Status::Unavailable(fmt::format("zookeeper_init refused {}", options.hosts));
  }
  Result<std::optional<std::string>> out = std::optional<std::string>();
  bool connected = false;
  {
    std::unique_lock<std::mutex> lock(conn.mu);
    connected = conn.cv.wait_for(lock, std::chrono::seconds(10),
                                 [&] { return conn.state == ZOO_CONNECTED_STATE; });
  }
  if (!connected) {
    out = Status::Unavailable(fmt::format("no ZooKeeper server at {} answered", options.hosts));
  } else {
    // A fenced write carries at most kMaxFencedWriteBytes, far below this.
    std::vector<char> buffer(2 << 20);
    int len = static_cast<int>(buffer.size());

    struct Stat stat {};

    const std::string full = options.chroot + path;
    const int rc = zoo_get(zh, full.c_str(), 0, buffer.data(), &len, &stat);
    if (rc == ZOK) {
      out = std::optional<std::string>(std::string(buffer.data(), len > 0 ? len : 0));
    } else if (rc != ZNONODE) {
      out = Status::Unavailable(fmt::format("zoo_get {}: {}", full, zerror(rc)));
    }
  }
  zookeeper_close(zh);  // joins the client's threads: the watcher is done with `conn`
  return out;
}

ZkEnsemble::ZkEnsemble(ZkEnsembleOptions options, std::string dir)
    : options_(options), dir_(std::move(dir)) {}

Result<std::unique_ptr<ZkEnsemble>> ZkEnsemble::Start(ZkEnsembleOptions options) {
  if (access(kJava, X_OK) != 0 || access("/usr/share/java/zookeeper.jar", R_OK) != 0) {
    return Status::Unavailable(
        "ZooKeeper tests need java and ZooKeeper: apt-get install zookeeper default-jre-headless");
  }
  char tmpl[] = "/tmp/leasehold-zk-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    return Status::Unavailable("cannot create a temporary directory for ZooKeeper");
  }
  const int n = std::max(1, options.servers);
  std::unique_ptr<ZkEnsemble> zk(new ZkEnsemble(options, tmpl));
  // A port picked free can be taken by another test's server before ZooKeeper binds it (the
  // JVM starts slowly; ctest -j runs ensembles side by side): such a start is retried on new
  // ports, any other failure is returned.
  constexpr int kStartAttempts = 4;
  for (int start = 1;; ++start) {
    Status started = zk->StartOnFreshPorts(n);
    const bool clash = std::any_of(zk->servers_.begin(), zk->servers_.end(), [](const Server& s) {
      return LogShowsPortInUse(s.dir + "/zookeeper.log");
    });
    if (started.ok() || start == kStartAttempts || !clash) {
      LH_RETURN_IF_ERROR(started);
      return zk;
    }
    for (Server& s : zk->servers_) {
      StopPid(s.pid, SIGKILL);
    }
    std::error_code ignored;
    std::filesystem::remove_all(zk->dir_, ignored);
    std::filesystem::create_directories(zk->dir_, ignored);
    zk->servers_.clear();
  }
}

Status ZkEnsemble::StartOnFreshPorts(int n) {
  std::set<int> taken;
  auto pick = [&] {
    for (int attempt = 0; attempt < 50; ++attempt) {
      int port = PickFreeLoopbackPort({2181, 2888, 3888, 8080});
      if (port > 0 && taken.insert(port).second) {
        return port;
      }
    }
    return -1;
  };
  for (int i = 0; i < n; ++i) {
    Server server;
    server.client_port = pick();
    server.peer_port = pick();
    server.election_port = pick();
    if (server.client_port <= 0 || server.peer_port <= 0 || server.election_port <= 0) {
      return Status::Unavailable("no free loopback ports for ZooKeeper");
    }
    server.dir = fmt::format("{}/server{}", dir_, i + 1);
    std::filesystem::create_directories(server.dir + "/data");
    servers_.push_back(server);
  }
  for (int i = 0; i < n; ++i) {
    LH_RETURN_IF_ERROR(WriteConfig(i));
  }
  for (int i = 0; i < n; ++i) {
    LH_RETURN_IF_ERROR(Launch(i));
  }
  for (int i = 0; i < n; ++i) {
    LH_RETURN_IF_ERROR(AwaitServing(i));
  }
  return Status();
}

ZkEnsemble::~ZkEnsemble() {
  for (Server& s : servers_) {
    StopPid(s.pid, SIGKILL);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

int ZkEnsemble::IndexOfPort(int client_port) const {
  for (std::size_t i = 0; i < servers_.size(); ++i) {
    if (servers_[i].client_port == client_port) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

std::string ZkEnsemble::Url(const std::string& chroot) const {
  std::string hosts;
  for (const Server& s : servers_) {
    hosts += fmt::format("{}127.0.0.1:{}", hosts.empty() ? "" : ",", s.client_port);
  }
  return fmt::format("zk://{}{}", hosts, chroot);
}

Status ZkEnsemble::WriteConfig(int i) {
  const Server& s = servers_[i];
  std::ofstream cfg(s.dir + "/zoo.cfg");
  cfg << "tickTime=" << options_.tick_time.count() << "\n"
      << "initLimit=10\nsyncLimit=5\n"
      << "dataDir=" << s.dir << "/data\n"
      << "clientPort=" << s.client_port << "\n"
      << "clientPortAddress=127.0.0.1\n"
      << "admin.enableServer=false\n"
      << "4lw.commands.whitelist=ruok,srvr,stat,cons\n"
      << "maxClientCnxns=0\n"
      << "preAllocSize=1024\n"
      << "forceSync=no\n";
  if (options_.min_session.count() > 0) {
    cfg << "minSessionTimeout=" << options_.min_session.count() << "\n";
  }
  if (options_.max_session.count() > 0) {
    cfg << "maxSessionTimeout=" << options_.max_session.count() << "\n";
  }
  if (servers_.size() > 1) {
    for (std::size_t j = 0; j < servers_.size(); ++j) {
      cfg << "server." << j + 1 << "=127.0.0.1:" << servers_[j].peer_port << ":"
          << servers_[j].election_port << "\n";
    }
    std::ofstream myid(s.dir + "/data/myid");
    myid << i + 1 << "\n";
  }
  std::ofstream log4j(s.dir + "/log4j.properties");
  log4j << "log4j.rootLogger=WARN, CONSOLE\n"
        << "log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n"
        << "log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n"
        << "log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p %c{1} - %m%n\n";
  if (!cfg.good() || !log4j.good()) {
    return Status::Unavailable(fmt::format("cannot write the ZooKeeper config in {}", s.dir));
  }
  return Status();
}

Status ZkEnsemble::Launch(int i) {
  Server& s = servers_[i];
  std::vector<std::string> args = {kJava,
                                   "-Xmx128m",
                                   "-XX:+UseSerialGC",
                                   "-XX:TieredStopAtLevel=1",
                                   "-Dzookeeper.log.dir=" + s.dir,
                                   "-Dlog4j.configuration=file:" + s.dir + "/log4j.properties",
                                   "-cp",
                                   kClassPath,
                                   "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                                   s.dir + "/zoo.cfg"};
  LH_ASSIGN_OR_RETURN(s.pid, SpawnServer(args, s.dir + "/zookeeper.log"));
  return Status();
}

Status ZkEnsemble::AwaitServing(int i) {
  Server& s = servers_[i];
  Status ready = AwaitReady(
      s.pid,
      [this, i] {
        std::string answer = FourLetter(i, "srvr");
        return answer.find("Mode:") != std::string::npos;
      },
      options_.ready_timeout, s.dir + "/zookeeper.log", "ZooKeeper");
  if (!ready.ok()) {
    StopPid(s.pid, SIGKILL);
  }
  return ready;
}

void ZkEnsemble::Kill9(int i) {
  StopPid(servers_[i].pid, SIGKILL);
}

Status ZkEnsemble::Restart(int i) {
  Kill9(i);
  LH_RETURN_IF_ERROR(Launch(i));
  return AwaitServing(i);
}

void ZkEnsemble::Pause(int i) {
  if (servers_[i].pid > 0) {
    kill(servers_[i].pid, SIGSTOP);
  }
}

void ZkEnsemble::Resume(int i) {
  if (servers_[i].pid > 0) {
    kill(servers_[i].pid, SIGCONT);
  }
}

std::string ZkEnsemble::FourLetter(int i, const std::string& word) const {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return "";
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(servers_[i].client_port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{.tv_sec = 2, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      send(fd, word.data(), word.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(word.size())) {
    char buf[1024];
    for (int reads = 0; reads < 64; ++reads) {  // bounded: the server closes after answering
      ssize_t got = recv(fd, buf, sizeof(buf), 0);
      if (got <= 0) {
        break;
      }
      answer.append(buf, static_cast<std::size_t>(got));
    }
  }
  close(fd);
  return answer;
}

}  // namespace leasehold::testing
