// File: tests/chaos/fenced_register.h
//
// FencedRegister: the storage layer the chaos harness writes to, in the pattern the fencing
// token exists for. One SQLite file shared by every worker process; per key it keeps the
// highest fencing token seen, and a write is accepted only if its token is >= that maximum
// (the conditional UPSERT below, one BEGIN IMMEDIATE transaction). Every attempt is recorded
// in the `writes` table with the maximum it met, so the checker can count stale writes
// attempted and accepted from the register's own history rather than the workers' word.
//
// Opened with fenced=false (the negative control) it accepts every write, still recording the
// maximum, so that accepted stale writes show up.
//
// Example:
//
//   auto reg = FencedRegister::Open("/tmp/run/register.db", /*fenced=*/true);
//   WriteResult w = (*reg)->Write("hot", lease.fencing_token(), "w3");
//   if (w.outcome == "rejected") { /* a newer holder has written: stop */ }
//
// Thread safety: not thread-safe; one per process, used from one thread.

#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "leasehold/lease_info.h"
#include "leasehold/status.h"

struct sqlite3;

namespace leasehold::chaos {

struct WriteResult {
  // "accepted", "rejected" or "error".
  std::string outcome;
  // The highest token the register had seen for the key before this write (0: none).
  std::uint64_t max_before = 0;
  // CLOCK_BOOTTIME ns read inside the transaction, just before COMMIT.
  std::int64_t t_commit_ns = 0;
};

class FencedRegister {
 public:
  // Opens (creating if needed) the register file. Returns kUnavailable on any SQLite error.
  static Result<std::unique_ptr<FencedRegister>> Open(const std::string& path, bool fenced);

  FencedRegister(const FencedRegister&) = delete;
  FencedRegister& operator=(const FencedRegister&) = delete;
  FencedRegister(FencedRegister&&) = delete;
  FencedRegister& operator=(FencedRegister&&) = delete;
  ~FencedRegister();

  // Writes `writer` as the key's value with fencing token `token`, atomically.
  WriteResult Write(const std::string& key, FencingToken token, const std::string& writer);

 private:
  FencedRegister(sqlite3* db, bool fenced) : db_(db), fenced_(fenced) {}

  sqlite3* const db_;
  const bool fenced_;
};

}  // namespace leasehold::chaos
