// File: backends/sqlite/sqlite_records.cc (internal)
//
// The sqlite:// store's records facet: a key's record, judged on the wall clock (CLOCK_REALTIME),
// which a record must outlive a reboot on; the store's clock is this host's.

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include "backends/common/sql_statement.h"
#include "backends/sqlite/sqlite_backend.h"
#include "backends/sqlite/sqlite_connection.h"
#include "backends/sqlite/sqlite_holder_anchor.h"
#include "backends/sqlite/sqlite_host_queue.h"
#include "core/duration.h"

namespace leasehold::internal {

Result<std::optional<std::string>> SqliteBackend::ReadRecord(std::string_view key) {
  MutexLock lock(&mu_);
  StatementRun select(*connection_, kSelectRecord, "read the record");
  select.Bind(1, key);
  select.Bind(2, WallNowNs());
  LH_ASSIGN_OR_RETURN(bool found, select.Next());
  if (!found) {
    return std::optional<std::string>();
  }
  return std::optional<std::string>(select.Blob(0));
}

Result<std::vector<std::pair<std::string, std::string>>> SqliteBackend::ListRecords(
    std::string_view prefix) {
  MutexLock lock(&mu_);
  const std::optional<std::string> upper = PrefixUpperBound(prefix);
  StatementRun list(*connection_, kListRecords, "list records");
  list.Bind(1, WallNowNs());
  list.Bind(2, prefix);
  if (upper.has_value()) {
    list.Bind(3, *upper);
  } else {
    list.BindNull(3);
  }
  std::vector<std::pair<std::string, std::string>> records;
  while (true) {
    LH_ASSIGN_OR_RETURN(bool row, list.Next());
    if (!row) {
      return records;
    }
    records.emplace_back(list.Text(0), list.Blob(1));
  }
}

Result<StoreTime> SqliteBackend::WallClock() {
  // The database is on this host: its clock is this host's. Wall time (system_clock), a
  // different time base from the Clock's: StoreTime dates records and names slots, it never
  // drives safety.
  return StoreTime{.time = std::chrono::system_clock::now(), .from_store = true};
}

}  // namespace leasehold::internal
