// File: tools/cli/check_command.cc

#include "check_command.h"

#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "leasehold/check.h"
#include "leasehold/store.h"

#include "cli_log.h"
#include "duration_flag.h"
#include "exit_codes.h"
#include "store_flag.h"

namespace leasehold::cli {

namespace {

double Millis(Duration d) {
  return static_cast<double>(d.count()) / 1e6;
}

nlohmann::ordered_json ToJson(const LatencySummary& s) {
  return {{"count", s.count},
          {"p50_ms", Millis(s.p50)},
          {"p99_ms", Millis(s.p99)},
          {"max_ms", Millis(s.max)}};
}

nlohmann::ordered_json ToJson(const CheckReport& r) {
  nlohmann::ordered_json j;
  j["store"] = r.store;
  j["backend"] = r.backend;
  j["scope"] = StoreScopeName(r.scope);
  j["verdict"] = CheckVerdictName(r.verdict);
  nlohmann::ordered_json rt = ToJson(r.round_trip);
  rt["probe"] = r.probe;
  j["round_trip"] = rt;
  j["cycle"] = {{"done", r.cycle_done},
                {"key", r.cycle_key},
                {"acquire_ms", Millis(r.acquire)},
                {"renew", ToJson(r.renew)},
                {"release_ms", Millis(r.release)},
                {"total_ms", Millis(r.cycle_total)},
                {"fencing_token", r.fencing_token},
                {"ttl_requested_ms", Millis(r.ttl_requested)},
                {"ttl_granted_ms", Millis(r.ttl_granted)}};
  if (r.clock_offset) {
    j["clock"] = {{"offset_ms", Millis(*r.clock_offset)},
                  {"uncertainty_ms", Millis(r.clock_uncertainty.value_or(Duration::zero()))}};
  } else {
    j["clock"] = nullptr;
  }
  j["ttl"] = {{"granularity_ms", Millis(r.ttl_granularity)},
              {"min_ms", Millis(r.min_ttl)},
              {"recommended_ms", Millis(r.recommended_ttl)},
              {"renew_every_ms", Millis(r.recommended_renew_every)},
              {"judged", r.ttl_judged},
              {"safe", r.ttl_safe}};
  nlohmann::ordered_json items = nlohmann::ordered_json::array();
  for (const auto& item : r.items) {
    items.push_back({{"area", item.area},
                     {"verdict", CheckVerdictName(item.verdict)},
                     {"found", item.found},
                     {"fix", item.fix}});
  }
  j["items"] = items;
  return j;
}

void Print(const std::string& line) {
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
}

// The block for people: "store", then one line per finding ("  area   verdict  found"), then
// one "FIX area: ..." line per finding that is not a pass.
void PrintText(const CheckReport& r) {
  Print(r.backend.empty() ? fmt::format("store        {}", r.store)
                          : fmt::format("store        {} ({}; shared by {})", r.store, r.backend,
                                        StoreScopeName(r.scope)));
  for (const auto& item : r.items) {
    Print(fmt::format("{:<12} {:<11} {}", item.area, CheckVerdictName(item.verdict), item.found));
  }
  bool any = false;
  for (const auto& item : r.items) {
    if (item.verdict == CheckVerdict::kPass || item.fix.empty())
      continue;
    if (!any)
      Print("");
    any = true;
    Print(fmt::format("{} {}: {}", item.verdict == CheckVerdict::kWarn ? "note" : "FIX ", item.area,
                      item.fix));
  }
  Print(fmt::format("verdict      {}", CheckVerdictName(r.verdict)));
}

int ExitCodeFor(CheckVerdict verdict) {
  switch (verdict) {
    case CheckVerdict::kPass:
    case CheckVerdict::kWarn:
      return 0;
    case CheckVerdict::kUnsafe:
      return kExitCheckUnsafe;
    case CheckVerdict::kPermissionDenied:
      return kExitPermissionDenied;
    case CheckVerdict::kUnreachable:
      return kExitUnavailable;
  }
  return kExitInternal;
}

// A store that Open could not reach (kUnavailable, kDeadlineExceeded) or that refused access
// (kPermissionDenied), as a report of one finding. The URL is shown with its password masked.
CheckReport OpenFailure(const std::string& url, const Status& status) {
  CheckReport r;
  r.store = url.empty() ? "(default store)" : Store::RedactUrl(url);
  CheckItem item{.area = "connect", .found = Describe(status)};
  if (status.code() == StatusCode::kPermissionDenied) {
    item.verdict = CheckVerdict::kPermissionDenied;
    item.fix =
        "check the credentials in the URL and what they may do (sqlite://: that the "
        "file and its directory are writable by this user)";
  } else {
    item.verdict = CheckVerdict::kUnreachable;
    item.fix = "check the address, the network and that the store is running";
  }
  r.verdict = item.verdict;
  r.items.push_back(std::move(item));
  return r;
}

}  // namespace

int CheckCommand(const CheckFlags& flags) {
  CheckOptions options{.probes = flags.probes};
  if (!flags.ttl.empty()) {
    auto ttl = ParsePositiveDurationFlag("--ttl", flags.ttl);
    if (!ttl.ok())
      return ReportFailure(ttl.error());
    options.ttl = *ttl;
  }
  if (flags.probes < 1 || flags.probes > 10000) {
    return ReportFailure(
        Status::InvalidArgument(fmt::format("--probes must be 1..10000, got {}", flags.probes)));
  }
  CheckReport report;
  auto store = OpenStoreFromFlag(flags.store_url);
  bool risk_accepted_to_check = false;
  if (!store.ok() && store.error().code() == StatusCode::kFailedPrecondition &&
      !store.error().detail().empty() && !flags.store_url.empty()) {
    // A store that Open refuses for an unsafe setting (Redis that may evict keys) is diagnosed
    // all the same: opened with the URL parameter that accepts the risk (the status' detail),
    // whose finding the check then reports as unsafe, beside every other.
    const char joint = flags.store_url.find('?') == std::string::npos ? '?' : '&';
    store = OpenStoreFromFlag(flags.store_url + joint + std::string(store.error().detail()));
    risk_accepted_to_check = true;
  }
  if (!store.ok()) {
    // Only "cannot reach" and "refused" are findings; anything else (a malformed URL, a backend
    // not built in, a URL leasehold refuses such as advisory mode through a pooler) is reported
    // as every subcommand reports it, with its exit code.
    const StatusCode code = store.error().code();
    if (code != StatusCode::kUnavailable && code != StatusCode::kDeadlineExceeded &&
        code != StatusCode::kPermissionDenied) {
      return ReportFailure(store.error());
    }
    report = OpenFailure(flags.store_url, store.error());
  } else {
    auto checked = (*store)->Check(options);
    if (!checked.ok())
      return ReportFailure(checked.error());
    report = std::move(*checked);
    if (risk_accepted_to_check) {
      report.store = Store::RedactUrl(flags.store_url);
    }
  }
  if (flags.json) {
    Print(ToJson(report).dump());
  } else {
    PrintText(report);
  }
  return ExitCodeFor(report.verdict);
}

}  // namespace leasehold::cli
