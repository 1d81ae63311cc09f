// File: tests/testing/postgres_server.cc
//
// PostgresServer and PgBouncer: fork + exec of the binaries with every setting on the command
// line or in a file of the temporary directory, as the `postgres` OS user when running as root,
// readiness through psql, stop by PID. Every wait has a bound.

#include "testing/postgres_server.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

namespace leasehold::testing {

namespace {

using namespace std::chrono_literals;

constexpr const char* kPgBin = "/usr/lib/postgresql/15/bin";

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string all = text.str();
  return all.size() > 800 ? all.substr(all.size() - 800) : all;
}

struct RunAs {
  bool drop = false;
  uid_t uid = 0;
  gid_t gid = 0;
};

// Root must run initdb, postgres and pgbouncer as the postgres user; others run as themselves.
Result<RunAs> Identity() {
  RunAs who;
  if (geteuid() != 0) {
    return who;
  }
  passwd* pw = getpwnam("postgres");
  if (pw == nullptr) {
    return Status::Unavailable("running as root but there is no `postgres` OS user (install the "
                               "postgresql package)");
  }
  who.drop = true;
  who.uid = pw->pw_uid;
  who.gid = pw->pw_gid;
  return who;
}

// Forks and execs `args` as `who`, stdout/stderr to `log`; returns the child's pid.
Result<pid_t> Spawn(const std::vector<std::string>& args, const RunAs& who,
                    const std::string& log) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    return Status::Unavailable("fork failed");
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) {
      _exit(127);
    }
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    if (who.drop && (setgroups(0, nullptr) != 0 || setgid(who.gid) != 0 || setuid(who.uid) != 0)) {
      _exit(126);
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // setuid clears it
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

void StopPid(pid_t& pid, int first_signal) {
  if (pid <= 0) {
    return;
  }
  kill(pid, first_signal);
  for (int i = 0; i < 250; ++i) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) {
      pid = -1;
      return;
    }
    std::this_thread::sleep_for(20ms);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  pid = -1;
}

Result<std::string> RunPsql(int port, const std::string& sql) {
  std::string quoted = "'";
  for (char c : sql) {
    quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  }
  quoted += "'";
  std::string command = fmt::format(
      "timeout 20 /usr/bin/psql -X -q -h 127.0.0.1 -p {} -U postgres -d postgres -At -v "
      "ON_ERROR_STOP=1 -c {} 2>&1",
      port, quoted);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return Status::Unavailable("cannot run psql");
  }
  std::string out;
  std::array<char, 4096> buf;
  std::size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) {
    out.append(buf.data(), n);
  }
  int rc = pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) {
    out.pop_back();
  }
  if (rc != 0) {
    return Status::Unavailable(fmt::format("psql failed: {}", out));
  }
  return out;
}

Status AwaitReady(int port, std::chrono::milliseconds timeout, pid_t& pid, const std::string& log,
                  std::string_view what) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < give_up) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      pid = -1;
      return Status::Unavailable(fmt::format("{} exited at start: {}", what, Tail(log)));
    }
    if (RunPsql(port, "SELECT 1").ok()) {
      return Status();
    }
    std::this_thread::sleep_for(50ms);
  }
  return Status::Unavailable(fmt::format("{} not ready in time: {}", what, Tail(log)));
}

Status MakeDir(const std::string& dir, const RunAs& who) {
  if (who.drop && chown(dir.c_str(), who.uid, who.gid) != 0) {
    return Status::Unavailable(fmt::format("cannot chown {} to postgres", dir));
  }
  return Status();
}

}  // namespace

int PickFreePostgresPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    return -1;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return (port == 5432 || port == 6432) ? PickFreePostgresPort() : port;
}

Result<std::string> RunPsqlForTesting(int port, const std::string& sql) {
  return RunPsql(port, sql);
}

PostgresServer::PostgresServer(PostgresServerOptions options, std::string dir, int port)
    : options_(options), dir_(std::move(dir)), port_(port) {}

Result<std::unique_ptr<PostgresServer>> PostgresServer::Start(PostgresServerOptions options) {
  LH_ASSIGN_OR_RETURN(RunAs who, Identity());
  char tmpl[] = "/tmp/leasehold-pg-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    return Status::Unavailable("cannot create a temporary directory for postgres");
  }
  LH_RETURN_IF_ERROR(MakeDir(tmpl, who));
  int port = PickFreePostgresPort();
  std::unique_ptr<PostgresServer> server(new PostgresServer(options, tmpl, port));
  const std::string log = server->dir_ + "/pg.log";
  LH_ASSIGN_OR_RETURN(pid_t initdb,
                      Spawn({std::string(kPgBin) + "/initdb", "-D", server->dir_ + "/data", "-U",
                             "postgres", "-A", "trust", "--no-sync", "--no-instructions"},
                            who, server->dir_ + "/initdb.log"));
  int status = 0;
  waitpid(initdb, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::Unavailable(
        fmt::format("initdb failed: {}", Tail(server->dir_ + "/initdb.log")));
  }
  LH_ASSIGN_OR_RETURN(
      server->pid_,
      Spawn({std::string(kPgBin) + "/postgres", "-D", server->dir_ + "/data", "-c",
             "listen_addresses=127.0.0.1", "-p", std::to_string(port), "-c",
             "unix_socket_directories=" + server->dir_, "-c", "fsync=off", "-c",
             "synchronous_commit=off", "-c", "full_page_writes=off", "-c",
             fmt::format("max_connections={}", options.max_connections), "-c",
             "shared_buffers=32MB", "-c", "max_locks_per_transaction=256", "-c",
             // LEASEHOLD_PG_LOG_STATEMENTS=1: every statement in pg.log, for debugging.
             std::getenv("LEASEHOLD_PG_LOG_STATEMENTS") != nullptr ? "log_statement=all"
                                                                    : "log_statement=none"},
            who, log));
  LH_RETURN_IF_ERROR(AwaitReady(port, options.ready_timeout, server->pid_, log, "postgres"));
  return server;
}

PostgresServer::~PostgresServer() {
  StopPid(pid_, SIGQUIT);
  if (std::getenv("LEASEHOLD_PG_LOG_STATEMENTS") != nullptr) {
    std::fprintf(stderr, "postgres log: %s/pg.log (kept)\n", dir_.c_str());
    return;
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string PostgresServer::Url() const {
  return fmt::format("postgres://postgres@127.0.0.1:{}/postgres", port_);
}

Result<std::string> PostgresServer::Psql(const std::string& sql) const {
  return RunPsql(port_, sql);
}

Result<std::unique_ptr<PgBouncer>> PgBouncer::Start(const PostgresServer& server, PoolMode mode) {
  LH_ASSIGN_OR_RETURN(RunAs who, Identity());
  char tmpl[] = "/tmp/leasehold-pgbouncer-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    return Status::Unavailable("cannot create a temporary directory for pgbouncer");
  }
  LH_RETURN_IF_ERROR(MakeDir(tmpl, who));
  int port = PickFreePostgresPort();
  std::unique_ptr<PgBouncer> bouncer(new PgBouncer(tmpl, port));
  {
    std::ofstream users(bouncer->dir_ + "/users.txt");
    users << "\"postgres\" \"\"\n";
    std::ofstream ini(bouncer->dir_ + "/pgbouncer.ini");
    ini << "[databases]\n"
        << fmt::format("* = host=127.0.0.1 port={}\n", server.port()) << "[pgbouncer]\n"
        << "listen_addr = 127.0.0.1\n"
        << fmt::format("listen_port = {}\n", port) << "unix_socket_dir =\n"
        << "auth_type = trust\n"
        << fmt::format("auth_file = {}/users.txt\n", bouncer->dir_)
        << fmt::format("pool_mode = {}\n", mode == PoolMode::kTransaction ? "transaction"
                                                                          : "session")
        << "max_client_conn = 500\n"
        << "default_pool_size = 40\n"
        << "ignore_startup_parameters = extra_float_digits\n"
        << fmt::format("logfile = {}/pgbouncer.log\n", bouncer->dir_);
  }
  if (who.drop) {
    for (const char* f : {"/users.txt", "/pgbouncer.ini"}) {
      (void)!chown((bouncer->dir_ + f).c_str(), who.uid, who.gid);
    }
  }
  const std::string log = bouncer->dir_ + "/pgbouncer.out";
  LH_ASSIGN_OR_RETURN(bouncer->pid_,
                      Spawn({"/usr/sbin/pgbouncer", bouncer->dir_ + "/pgbouncer.ini"}, who, log));
  Status ready = AwaitReady(port, std::chrono::seconds(15), bouncer->pid_, log, "pgbouncer");
  if (!ready.ok()) {
    return Status::Unavailable(
        fmt::format("{} {}", ready.message(), Tail(bouncer->dir_ + "/pgbouncer.log")));
  }
  return bouncer;
}

PgBouncer::~PgBouncer() {
  StopPid(pid_, SIGINT);
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string PgBouncer::Url() const {
  return fmt::format("postgres://postgres@127.0.0.1:{}/postgres", port_);
}

}  // namespace leasehold::testing
