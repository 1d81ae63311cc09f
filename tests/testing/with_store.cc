// File: tests/testing/with_store.cc
//
// with_store: runs a command against a fresh store of one fixture (store_fixtures.h: a real
// server on free loopback ports in a temporary directory, or the embedded file), for CTest tests
// of programs that take a store URL.
//
//   with_store FIXTURE COMMAND [ARG...]
//
// FIXTURE is a fixture name ("sqlite", "redis", "postgres_advisory", "etcd", "zk"...). In every
// argument, @URL@ becomes the URL of a fresh store of that fixture and @DIR@ a fresh scratch
// directory (removed afterwards; a sqlite:// store's file lives in it). The command's output
// passes through; the exit status is the command's (128 + N if killed by signal N), 64 for an
// unknown fixture, 69 if its server could not be started. The server stops when with_store exits.

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <sys/wait.h>

#include "testing/store_fixtures.h"

namespace {

void ReplaceAll(std::string& s, std::string_view what, const std::string& with) {
  for (std::size_t at = s.find(what); at != std::string::npos;
       at = s.find(what, at + with.size())) {
    s.replace(at, what.size(), with);
  }
}

int Run(std::vector<std::string> args) {
  std::vector<char*> cargs;
  for (std::string& a : args) {
    cargs.push_back(a.data());
  }
  cargs.push_back(nullptr);
  std::fflush(stdout);
  const pid_t child = fork();
  if (child < 0) {
    return 70;
  }
  if (child == 0) {
    execvp(cargs[0], cargs.data());
    std::perror("with_store: exec");
    _exit(127);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: with_store FIXTURE COMMAND [ARG...] (@URL@, @DIR@ replaced)\n");
    return 64;
  }
  const std::string name = argv[1];
  const leasehold::testing::StoreFixture* fixture = nullptr;
  std::string names;
  for (const auto& f : leasehold::testing::AllStoreFixtures()) {
    names += " " + f.name;
    if (f.name == name) {
      fixture = &f;
    }
  }
  if (fixture == nullptr) {
    std::fprintf(stderr, "with_store: no fixture %s in this build (have:%s)\n", name.c_str(),
                 names.c_str());
    return 64;
  }
  if (leasehold::Status s = fixture->start(); !s.ok()) {
    std::fprintf(stderr, "with_store: %s: %s\n", name.c_str(), s.ToString().c_str());
    return 69;
  }
  char tmpl[] = "/tmp/leasehold-with-store-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("with_store: mkdtemp");
    return 70;
  }
  const std::string dir = tmpl;
  const std::string url = fixture->new_store_url(dir);
  std::vector<std::string> args;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    ReplaceAll(a, "@URL@", url);
    ReplaceAll(a, "@DIR@", dir);
    args.push_back(std::move(a));
  }
  std::printf("with_store: %s %s\n", name.c_str(), url.c_str());
  const int rc = Run(std::move(args));
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return rc;
}
