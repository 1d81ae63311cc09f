// File: tests/testing/with_postgres.cc
//
// with_postgres: runs a command against a throwaway PostgreSQL 15 (PostgresServer: its own temp
// directory, a free loopback port), for CTest tests of programs that take a URL.
//
//   with_postgres COMMAND [ARG...]
//
// Every argument containing @PG_URL@ gets the server's URL
// (postgres://postgres@127.0.0.1:PORT/postgres) in its place. The command's output passes
// through; the exit status is the command's (128 + N if killed by signal N), 69 if the server
// could not be started. The server is stopped when the command ends.

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <sys/wait.h>

#include "testing/postgres_server.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: with_postgres COMMAND [ARG...] (@PG_URL@ is replaced)\n");
    return 64;
  }
  auto pg = leasehold::testing::PostgresServer::Start();
  if (!pg.ok()) {
    std::fprintf(stderr, "with_postgres: %s\n", pg.status().ToString().c_str());
    return 69;
  }
  const std::string url = (*pg)->Url();
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    for (std::size_t at = a.find("@PG_URL@"); at != std::string::npos;
         at = a.find("@PG_URL@", at + url.size())) {
      a.replace(at, 8, url);
    }
    args.push_back(std::move(a));
  }
  std::vector<char*> cargs;
  for (std::string& a : args) {
    cargs.push_back(a.data());
  }
  cargs.push_back(nullptr);
  std::printf("with_postgres: %s\n", url.c_str());
  std::fflush(stdout);
  const pid_t child = fork();
  if (child < 0) {
    return 70;
  }
  if (child == 0) {
    execvp(cargs[0], cargs.data());
    std::perror("with_postgres: exec");
    _exit(127);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
