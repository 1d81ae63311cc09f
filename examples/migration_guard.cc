// migration_guard: a schema migration that must run once, before any instance serves. Every
// instance of the app calls EnsureSchema() at start-up: it waits for the lease
// "migration:<database>", reads the schema version, applies what is missing (each step a fenced
// write, so an instance that stalled past its TTL cannot apply a step after a successor), and
// releases. The first instance migrates; the others wait for it, find the schema current and
// start at once.
//
//   migration_guard STORE_URL SCHEMA_DIR
//
// SCHEMA_DIR stands in for the database: a fenced record "schema_version" plus one record per
// applied migration. With a real database, keep the version in a table with a lock_version
// column and use leasehold::BuildFencedUpdate (leasehold/fencing.h). Three instances start at
// once; exits 0 if every migration was applied exactly once and all three started.

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "leasehold/leasehold.h"

namespace {

using namespace std::chrono_literals;
using leasehold::Status;

constexpr const char* kMigrations[] = {
    "CREATE TABLE invoices (id, customer, total)",
    "ALTER TABLE invoices ADD COLUMN lock_version",
    "CREATE INDEX invoices_customer ON invoices (customer)",
};
constexpr int kLatest = 3;

std::atomic<int> applied{0};

int ReadVersion(const std::string& dir) {
  std::ifstream in(dir + "/schema_version");
  int v = 0;
  in >> v;
  return v;
}

Status EnsureSchema(leasehold::Store& store, const std::string& instance, const std::string& dir) {
  auto lease = store.Acquire("migration:app-db", {.ttl = 10s, .wait = 60s, .holder = instance});
  if (!lease.ok()) {
    return lease.status();
  }
  leasehold::FencedDirectory db(dir);
  int version = ReadVersion(dir);
  if (version >= kLatest) {
    std::printf("%s: schema is at version %d; nothing to migrate\n", instance.c_str(), version);
    return lease->Release();
  }
  for (int v = version + 1; v <= kLatest; ++v) {
    if (!lease->valid()) {
      return leasehold::Status::Lost("lease lost mid-migration: " +
                                     lease->lost_reason().ToString());
    }
    std::printf("%s: applying migration %d (fencing token %llu): %s\n", instance.c_str(), v,
                static_cast<unsigned long long>(lease->fencing_token()), kMigrations[v - 1]);
    LH_RETURN_IF_ERROR(db.Write("migration-" + std::to_string(v),
                                std::string(kMigrations[v - 1]) + " -- by " + instance + "\n",
                                lease->fencing_token()));
    LH_RETURN_IF_ERROR(
        db.Write("schema_version", std::to_string(v) + "\n", lease->fencing_token()));
    ++applied;
  }
  return lease->Release();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: migration_guard STORE_URL SCHEMA_DIR\n");
    return 64;
  }
  const std::string url = argv[1];
  const std::string dir = argv[2];
  std::atomic<int> started{0};
  std::atomic<bool> failed{false};
  {
    std::vector<std::jthread> instances;
    for (int i = 0; i < 3; ++i) {
      instances.emplace_back([&, i] {
        const std::string instance = "app-" + std::to_string(i);
        auto store = leasehold::Store::Open(url);
        if (!store.ok()) {
          std::fprintf(stderr, "%s: %s\n", instance.c_str(), store.status().ToString().c_str());
          failed = true;
          return;
        }
        if (Status s = EnsureSchema(**store, instance, dir); !s.ok()) {
          std::fprintf(stderr, "%s: not starting: %s\n", instance.c_str(), s.ToString().c_str());
          failed = true;
          return;
        }
        std::printf("%s: serving on schema version %d\n", instance.c_str(), ReadVersion(dir));
        ++started;
      });
    }
  }
  std::printf("%d migration(s) applied, %d instance(s) started\n", applied.load(), started.load());
  return !failed && applied == kLatest && started == 3 && ReadVersion(dir) == kLatest ? 0 : 1;
}
