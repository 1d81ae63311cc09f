// File: tests/fuzz/sqlite_row_fuzz.cc
//
// The sqlite:// store's grant rows as leasehold reads them back (Store::Inspect and List on a
// real file): any process that can write the file may have put any value of any type in a
// column (SQLite does not enforce INTEGER or TEXT). The input is cut into the row's columns
// (token, holder, fencing_token, ttl_ns, expires_ns, then slot, mode, lease_limit of schema
// version 2, each the version 1 default when the input ends before it), each stored as text, a
// blob or an integer as the input says. Invariants:
// - Reading never crashes, and is ok or an error Status.
// - A grant it reports is for the key asked, shows at most the first 8 bytes of the owner token
//   (a prefix of the stored token, never the whole token of a longer one), a remaining
//   time >= 0 and a limit of 1..kMaxLeaseLimit.

#include <sqlite3.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "leasehold/store.h"

#include "fuzz_check.h"

namespace {

struct Fixture {
  std::filesystem::path dir;
  std::unique_ptr<leasehold::Store> store;
  sqlite3* db = nullptr;
  std::string boot_id;
};

Fixture& Get() {
  static Fixture* fixture = [] {
    auto* f = new Fixture();  // lives until the process ends
    // Under $TMPDIR: a finding aborts without atexit handlers, and scripts/fuzz.sh points
    // TMPDIR into its scratch directory, which it removes.
    const char* tmp = std::getenv("TMPDIR");
    std::string templ =
        std::string(tmp != nullptr ? tmp : "/tmp") + "/leasehold-fuzz-sqlite.XXXXXX";
    FUZZ_CHECK(::mkdtemp(templ.data()) != nullptr, "mkdtemp");
    f->dir = templ;
    const std::string file = (f->dir / "leases.db").string();
    leasehold::Result<std::unique_ptr<leasehold::Store>> store =
        leasehold::Store::Open("sqlite://" + file);
    FUZZ_CHECK(store.ok(), store.status().message());
    f->store = *std::move(store);
    FUZZ_CHECK(sqlite3_open(file.c_str(), &f->db) == SQLITE_OK, "sqlite3_open");
    sqlite3_busy_timeout(f->db, 5000);
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::getline(in, f->boot_id);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(Get().dir, ignored);
    });
    return f;
  }();
  return *fixture;
}

std::int64_t BootNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Splits the next column off `input` at '\x1f'; its first byte says how to store it:
// 'i' an integer (the rest's bytes, little-endian, up to 8), 'b' a blob, else text.
void Bind(sqlite3_stmt* statement, int index, std::string_view& input, bool* live_offset) {
  std::size_t sep = input.find('\x1f');
  std::string_view column = input.substr(0, sep);
  input = sep == std::string_view::npos ? std::string_view() : input.substr(sep + 1);
  const char kind = column.empty() ? 't' : column[0];
  column = column.empty() ? column : column.substr(1);
  if (kind == 'i' || kind == 'l') {
    std::int64_t value = 0;
    std::memcpy(&value, column.data(), std::min(column.size(), sizeof(value)));
    if (kind == 'l' && live_offset != nullptr) {
      // An expiry after now by `value` (mod 1 h), so that the row is live and gets read.
      value = BootNs() + 1'000'000'000 +
              static_cast<std::int64_t>(static_cast<std::uint64_t>(value) % 3'600'000'000'000);
      *live_offset = true;
    }
    sqlite3_bind_int64(statement, index, value);
  } else if (kind == 'b') {
    sqlite3_bind_blob(statement, index, column.data(), static_cast<int>(column.size()),
                      SQLITE_TRANSIENT);
  } else {
    sqlite3_bind_text(statement, index, column.data(), static_cast<int>(column.size()),
                      SQLITE_TRANSIENT);
  }
}

// As Bind, or binds `fallback` (an integer, or text if `text`) when the input has run out: the
// columns version 1 rows did not have, so that its corpus still means what it meant.
void BindOrDefault(sqlite3_stmt* statement, int index, std::string_view& input,
                   std::int64_t fallback, const char* text = nullptr) {
  if (!input.empty()) {
    Bind(statement, index, input, nullptr);
  } else if (text != nullptr) {
    sqlite3_bind_text(statement, index, text, -1, SQLITE_STATIC);
  } else {
    sqlite3_bind_int64(statement, index, fallback);
  }
}

void CheckInfo(const leasehold::LeaseInfo& info, std::optional<std::string_view> stored_token) {
  FUZZ_CHECK(info.key == "k", info.key);
  FUZZ_CHECK(info.limit >= 1 && info.limit <= leasehold::kMaxLeaseLimit,
             std::to_string(info.limit));
  FUZZ_CHECK(info.token_prefix.size() <= 8, info.token_prefix);
  FUZZ_CHECK(!stored_token || stored_token->starts_with(info.token_prefix), info.token_prefix);
  FUZZ_CHECK(info.remaining.count() >= 0, std::to_string(info.remaining.count()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Fixture& f = Get();
  std::string_view input = leasehold::fuzz::AsText(data, size);
  // The stored token's bytes, for the prefix check, when it is stored as text or a blob (the
  // first column up to the separator, without its kind byte); an integer reads as its digits.
  std::string_view token = input.substr(0, input.find('\x1f'));
  const bool token_is_number = !token.empty() && (token[0] == 'i' || token[0] == 'l');
  token = token.empty() ? token : token.substr(1);
  // One row of the key at a time: the slot is part of the primary key, so a row of another
  // slot would stay from an earlier input.
  FUZZ_CHECK(sqlite3_exec(f.db, "DELETE FROM grants WHERE key = 'k'", nullptr, nullptr, nullptr) ==
                 SQLITE_OK,
             sqlite3_errmsg(f.db));
  sqlite3_stmt* statement = nullptr;
  FUZZ_CHECK(sqlite3_prepare_v2(f.db,
                                "INSERT OR REPLACE INTO grants (key, token, holder, fencing_token, "
                                "boot_id, ttl_ns, expires_ns, slot, mode, lease_limit) VALUES "
                                "('k', ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                                -1, &statement, nullptr) == SQLITE_OK,
             sqlite3_errmsg(f.db));
  bool live = false;
  Bind(statement, 1, input, nullptr);
  Bind(statement, 2, input, nullptr);
  Bind(statement, 3, input, nullptr);
  sqlite3_bind_text(statement, 4, f.boot_id.data(), static_cast<int>(f.boot_id.size()),
                    SQLITE_TRANSIENT);
  Bind(statement, 5, input, nullptr);
  Bind(statement, 6, input, &live);
  BindOrDefault(statement, 7, input, 0);
  BindOrDefault(statement, 8, input, 0, "exclusive");
  BindOrDefault(statement, 9, input, 1);
  const int rc = sqlite3_step(statement);
  sqlite3_finalize(statement);
  if (rc != SQLITE_DONE) {
    return 0;  // refused by a NOT NULL constraint: not a row leasehold can meet
  }
  leasehold::Result<std::optional<leasehold::LeaseInfo>> info = f.store->Inspect("k");
  if (info.ok() && info->has_value()) {
    CheckInfo(**info, token_is_number ? std::nullopt : std::optional(token));
  }
  FUZZ_CHECK(!live || !info.ok() || info->has_value(), "a live row was not found");
  leasehold::Result<std::vector<leasehold::LeaseInfo>> list = f.store->List("");
  if (list.ok()) {
    for (const leasehold::LeaseInfo& one : *list) {
      CheckInfo(one, token_is_number ? std::nullopt : std::optional(token));
    }
  }
  leasehold::Result<std::vector<leasehold::LeaseInfo>> holders = f.store->Holders("k");
  if (holders.ok()) {
    for (const leasehold::LeaseInfo& one : *holders) {
      CheckInfo(one, token_is_number ? std::nullopt : std::optional(token));
    }
  }
  return 0;
}
