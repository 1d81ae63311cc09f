// File: tests/testing/postgres_server.cc
//
// PostgresServer and PgBouncer: fork + exec of the binaries with every setting on the command
// line or in a file of the temporary directory, as the `postgres` OS user when running as root,
// readiness through psql, stop by PID. Every wait has a bound.

#include "testing/postgres_server.h"

#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "testing/server_process.h"

namespace leasehold::testing {

namespace {

using namespace std::chrono_literals;

constexpr const char* kPgBin = "/usr/lib/postgresql/15/bin";

// Root must run initdb, postgres and pgbouncer as the postgres user; others run as themselves.
Result<RunAs> Identity() {
  RunAs who;
  if (geteuid() != 0) {
    return who;
  }
  passwd* pw = getpwnam("postgres");
  if (pw == nullptr) {
    return Status::Unavailable(
        "running as root but there is no `postgres` OS user (install the "
        "postgresql package)");
  }
  who.drop = true;
  who.uid = pw->pw_uid;
  who.gid = pw->pw_gid;
  return who;
}

Result<std::string> RunPsql(int port, const std::string& sql) {
  return RunCommand(fmt::format(
      "timeout 20 /usr/bin/psql -X -q -h 127.0.0.1 -p {} -U postgres -d postgres -At -v "
      "ON_ERROR_STOP=1 -c {}",
      port, ShellQuote(sql)));
}

Status AwaitPsql(int port, std::chrono::milliseconds timeout, pid_t& pid, const std::string& log,
                 std::string_view what) {
  return AwaitReady(
      pid, [port] { return RunPsql(port, "SELECT 1").ok(); }, timeout, log, what);
}

Status MakeDir(const std::string& dir, const RunAs& who) {
  if (who.drop && chown(dir.c_str(), who.uid, who.gid) != 0) {
    return Status::Unavailable(fmt::format("cannot chown {} to postgres", dir));
  }
  return Status();
}

// Runs args as `who`, waits for it, and says what failed with the tail of `log`.
Status RunAsAndWait(const std::vector<std::string>& args, const std::string& log, const RunAs& who,
                    std::string_view what) {
  LH_ASSIGN_OR_RETURN(pid_t pid, SpawnServer(args, log, who));
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::Unavailable(fmt::format("{} failed: {}", what, TailFile(log)));
  }
  return Status();
}

// initdb costs about 0.9 s of CPU and every server starts from the same cluster, so one is made
// per machine and user (a directory in /tmp named by the user and initdb's arguments; the
// binaries are kPgBin's, PostgreSQL 15, so the name does not carry them: its `ready` file
// records them for whoever looks) and each server copies it (about 0.15 s). The first process makes
// it under an exclusive flock, in a directory of its own that is renamed into place when complete;
// the others wait on the lock, then find it. A template left half-made by a crash has no `ready`
// file and is made again.
Result<std::string> DataTemplate(const RunAs& who) {
  const uid_t owner = who.drop ? who.uid : geteuid();
  const std::string base = fmt::format("/tmp/leasehold-pg-template-{}-trust-U-postgres", owner);
  const std::string data = base + "/data";
  const std::string ready = base + "/ready";
  const int lock = open((base + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (lock < 0) {
    return Status::Unavailable(fmt::format("cannot open {}.lock", base));
  }

  struct Unlock {
    int fd;

    ~Unlock() { close(fd); }  // closing the descriptor releases the flock
  } unlock{lock};

  if (flock(lock, LOCK_EX) != 0) {
    return Status::Unavailable(fmt::format("cannot lock {}.lock", base));
  }
  std::error_code ignored;
  if (std::filesystem::exists(ready, ignored) &&
      std::filesystem::exists(data + "/PG_VERSION", ignored)) {
    return data;
  }
  std::filesystem::remove_all(base, ignored);
  const std::string making = fmt::format("{}.making-{}", base, getpid());
  std::filesystem::remove_all(making, ignored);
  if (mkdir(making.c_str(), 0700) != 0) {
    return Status::Unavailable(fmt::format("cannot create {}", making));
  }
  LH_RETURN_IF_ERROR(MakeDir(making, who));
  LH_RETURN_IF_ERROR(RunAsAndWait({std::string(kPgBin) + "/initdb", "-D", making + "/data", "-U",
                                   "postgres", "-A", "trust", "--no-sync", "--no-instructions"},
                                  making + "/initdb.log", who, "initdb"));
  std::ofstream(making + "/ready") << kPgBin << "\n";
  std::filesystem::rename(making, base, ignored);
  if (ignored || !std::filesystem::exists(ready, ignored)) {
    return Status::Unavailable(fmt::format("cannot move {} to {}", making, base));
  }
  return data;
}

}  // namespace

int PickFreePostgresPort() {
  return PickFreeLoopbackPort({5432, 6432});
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
  LH_ASSIGN_OR_RETURN(std::string data_template, DataTemplate(who));
  // A copy of the template, as its owner: the same files initdb would have written.
  LH_RETURN_IF_ERROR(RunAsAndWait({"/bin/cp", "-a", data_template, server->dir_ + "/data"},
                                  server->dir_ + "/copy.log", who, "copying the initdb template"));
  std::vector<std::string> args;
  if (!options.env.empty()) {
    // env execs postgres in its place: the pid stays the postmaster's.
    args.push_back("/usr/bin/env");
    args.insert(args.end(), options.env.begin(), options.env.end());
  }
  const std::vector<std::string> server_args = {
      std::string(kPgBin) + "/postgres", "-D", server->dir_ + "/data", "-c",
      "listen_addresses=127.0.0.1", "-p", std::to_string(port), "-c",
      "unix_socket_directories=" + server->dir_, "-c", "fsync=off", "-c", "synchronous_commit=off",
      "-c", "full_page_writes=off", "-c",
      fmt::format("max_connections={}", options.max_connections), "-c", "shared_buffers=32MB", "-c",
      "max_locks_per_transaction=256", "-c",
      // LEASEHOLD_PG_LOG_STATEMENTS=1: every statement in pg.log, for debugging.
      std::getenv("LEASEHOLD_PG_LOG_STATEMENTS") != nullptr ? "log_statement=all"
                                                            : "log_statement=none"};
  args.insert(args.end(), server_args.begin(), server_args.end());
  LH_ASSIGN_OR_RETURN(server->pid_, SpawnServer(args, log, who));
  LH_RETURN_IF_ERROR(AwaitPsql(port, options.ready_timeout, server->pid_, log, "postgres"));
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
        << fmt::format("pool_mode = {}\n",
                       mode == PoolMode::kTransaction ? "transaction" : "session")
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
  LH_ASSIGN_OR_RETURN(
      bouncer->pid_,
      SpawnServer({"/usr/sbin/pgbouncer", bouncer->dir_ + "/pgbouncer.ini"}, log, who));
  Status ready = AwaitPsql(port, std::chrono::seconds(15), bouncer->pid_, log, "pgbouncer");
  if (!ready.ok()) {
    return Status::Unavailable(
        fmt::format("{} {}", ready.message(), TailFile(bouncer->dir_ + "/pgbouncer.log")));
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
