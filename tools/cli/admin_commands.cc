// File: tools/cli/admin_commands.cc

#include "admin_commands.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "leasehold/duration.h"
#include "leasehold/lease_info.h"
#include "leasehold/schedule.h"
#include "leasehold/store.h"

#include "cli_log.h"
#include "exit_codes.h"
#include "store_flag.h"

namespace leasehold::cli {

namespace {

// When a kept grant (LeaseInfo::kept) ends, by this host's wall clock: "2026-12-07T05:01:02.345Z".
std::string KeptUntil(const LeaseInfo& info) {
  return FormatSlotTime(std::chrono::system_clock::now() + info.remaining);
}

// A grant's remaining time for a table column: "<=10s" where it is only an upper bound
// (LeaseInfo::remaining_is_upper_bound).
std::string RemainingColumn(const LeaseInfo& info) {
  return (info.remaining_is_upper_bound ? "<=" : "") +
         FormatDuration(RoundForDisplay(info.remaining));
}

nlohmann::ordered_json ToJson(const LeaseInfo& info) {
  nlohmann::ordered_json j;
  j["key"] = info.key;
  j["holder"] = info.holder;
  j["token_prefix"] = info.token_prefix;
  j["fencing_token"] = info.fencing_token;
  j["remaining_ms"] = info.remaining.count();
  if (info.remaining_is_upper_bound) {
    j["remaining_is_upper_bound"] = true;
  }
  j["ttl_ms"] = info.ttl.count();
  j["kept"] = info.kept;
  if (info.kept) {
    j["kept_until"] = KeptUntil(info);
  }
  j["mode"] = LeaseKindName(info.mode, info.limit);
  j["limit"] = info.limit;
  j["slot"] = info.slot;
  return j;
}

// The holders of one key as JSON, each as ToJson(LeaseInfo) without the key.
nlohmann::ordered_json HoldersJson(const std::vector<LeaseInfo>& holders) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const LeaseInfo& h : holders) {
    nlohmann::ordered_json j = ToJson(h);
    j.erase("key");
    out.push_back(std::move(j));
  }
  return out;
}

nlohmann::ordered_json ToJson(const SlotRun& run) {
  nlohmann::ordered_json j;
  j["slot"] = FormatSlotTime(run.slot_start);
  j["outcome"] = run.succeeded ? "done" : (run.final ? "failed" : "failed_retryable");
  j["exit_code"] = run.exit_code;
  j["holder"] = run.holder;
  j["fencing_token"] = run.fencing_token;
  j["started"] = FormatSlotTime(run.started);
  j["ended"] = FormatSlotTime(run.ended);
  return j;
}

// One line per recorded slot run: "2026-12-01T17:00:00.000Z done by web-1:42 (fencing token
// 7, exit 0, 1.2s)".
std::string DescribeRun(const SlotRun& run) {
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(run.ended - run.started);
  return fmt::format("{} {} by {} (fencing token {}, exit {}, {})", FormatSlotTime(run.slot_start),
                     run.succeeded ? "done" : (run.final ? "failed" : "failed (retry allowed)"),
                     Printable(run.holder), run.fencing_token, run.exit_code, FormatDuration(took));
}

// By when a force-released holder's command is gone, as far as this side can tell. A `leasehold
// run` holder confirms its grant whenever the store notifies a change of the key (GrantWatch),
// so on a store that notifies holders (Store::notifies_holder) it stops its tree at once
// (SIGTERM, then SIGKILL after the kill grace, min(ttl/4, 5s) by default). Otherwise it learns
// at its next renewal (every ttl/3 by default). Until then the old command may still run beside
// a new holder: the operator is told so.
std::string GoneWithin(const LeaseInfo& h, bool notifies) {
  using std::chrono::milliseconds;
  const milliseconds renew = h.ttl / 3;
  const milliseconds grace = std::min<milliseconds>(h.ttl / 4, std::chrono::seconds(5));
  const std::string bound = fmt::format(
      "within {} (ttl/3 + min(ttl/4, 5s) of its {} TTL, with the default --renew-every and "
      "--kill-grace)",
      FormatDuration(RoundForDisplay(renew + grace)), FormatDuration(h.ttl));
  if (notifies) {
    return fmt::format(
        "; the store tells its holder at once, and a `leasehold run` then stops its whole tree; "
        "one that misses it stops at its next renewal, {}; until then a new holder may run "
        "beside it",
        bound);
  }
  return fmt::format(
      "; its holder's command may run on until its next renewal: a `leasehold run` stops its "
      "whole tree {}; until then a new holder may run beside it",
      bound);
}

// Moves out of `holders` what holds nothing: grants whose holder is gone (sqlite://: its
// process and tree have exited) to `gone`, and the writer waiting for the key, which holds
// nothing yet, to `writer`. Each is shown apart, after the live grants.
void SplitOff(std::vector<LeaseInfo>& holders, std::vector<LeaseInfo>& gone,
              std::optional<LeaseInfo>& writer) {
  std::erase_if(holders, [&gone, &writer](const LeaseInfo& h) {
    if (h.waiting_writer) {
      writer = h;
    } else if (h.holder_gone) {
      gone.push_back(h);
    }
    return h.waiting_writer || h.holder_gone;
  });
}

// status --json's "waiting_writer": the writer's identity and how long its claim lasts.
nlohmann::ordered_json WaitingWriterJson(const LeaseInfo& writer) {
  nlohmann::ordered_json w;
  w["holder"] = writer.holder;
  w["remaining_ms"] = writer.remaining.count();
  if (writer.remaining_is_upper_bound) {
    w["remaining_is_upper_bound"] = true;
  }
  w["ttl_ms"] = writer.ttl.count();
  return w;
}

void PrintLine(const std::string& text) {
  std::fputs(text.c_str(), stdout);
  std::fputc('\n', stdout);
}

}  // namespace

int StatusCommand(const std::string& store_url, const std::string& key, bool json) {
  if (Status s = ValidateKey(key); !s.ok()) {
    return ReportFailure(s);
  }
  auto store = OpenStoreFromFlag(store_url);
  if (!store.ok()) {
    return ReportFailure(store.error());
  }
  Result<std::vector<LeaseInfo>> holders = (*store)->Holders(key);
  if (!holders.ok()) {
    return ReportFailure(holders.error());
  }
  std::vector<LeaseInfo> gone;
  std::optional<LeaseInfo> writer;
  SplitOff(*holders, gone, writer);
  // The first holder (the lowest slot) is the one shown at the top level: the whole answer for
  // an exclusive lease; every holder of a shared or semaphore key is under "holders".
  const std::optional<LeaseInfo> first =
      holders->empty() ? std::nullopt : std::optional<LeaseInfo>(holders->front());
  const std::optional<LeaseInfo>* info = &first;
  // The schedule slots the key ran (run --once-per), newest first. A store that cannot show
  // them (a PostgreSQL schema applied before records existed, without CREATE) still shows the
  // lease: the runs are left out with a warning.
  Result<std::vector<SlotRun>> runs = (*store)->SlotRuns(key);
  if (!runs.ok()) {
    Error(fmt::format("slot runs not shown: {}", Describe(runs.error())));
  }
  if (json) {
    nlohmann::ordered_json j;
    if (info->has_value()) {
      j = ToJson(**info);
      j["held"] = true;
      j["holders"] = HoldersJson(*holders);
    } else {
      j["key"] = key;
      j["held"] = false;
    }
    if (!gone.empty()) {
      j["gone"] = HoldersJson(gone);
    }
    if (writer.has_value()) {
      j["waiting_writer"] = WaitingWriterJson(*writer);
    }
    if (runs.ok()) {
      nlohmann::ordered_json slots = nlohmann::ordered_json::array();
      for (const SlotRun& run : *runs) {
        slots.push_back(ToJson(run));
      }
      j["slot_runs"] = std::move(slots);
    }
    j["store"] = (*store)->display_url();
    j["scope"] = StoreScopeName((*store)->scope());
    PrintLine(j.dump());
    return info->has_value() ? 0 : kExitFree;
  }
  if (!info->has_value()) {
    PrintLine(fmt::format("{}: free", key));
  } else if (const LeaseInfo& f = **info; f.mode != LeaseMode::kExclusive || f.limit > 1) {
    // A shared or semaphore key: one line per holder.
    PrintLine(fmt::format("key:           {}", Printable(f.key)));
    PrintLine(fmt::format("state:         held by {} ({})", holders->size(),
                          f.limit > 1
                              ? fmt::format("semaphore, {} of {} slots", holders->size(), f.limit)
                              : std::string("shared")));
    std::size_t holder_width = 6;
    for (const LeaseInfo& h : *holders) {
      holder_width = std::max(holder_width, Printable(h.holder).size());
    }
    PrintLine(fmt::format("{:>4}  {:<9}  {:<{}}  {:>13}  {:>9}  {:>6}  {}", "SLOT", "MODE",
                          "HOLDER", holder_width, "FENCING_TOKEN", "REMAINING", "TTL", "TOKEN"));
    for (const LeaseInfo& h : *holders) {
      PrintLine(fmt::format("{:>4}  {:<9}  {:<{}}  {:>13}  {:>9}  {:>6}  {}{}", h.slot,
                            LeaseKindName(h.mode, h.limit), Printable(h.holder), holder_width,
                            h.fencing_token, RemainingColumn(h), FormatDuration(h.ttl),
                            h.token_prefix,
                            h.kept ? "  kept until " + KeptUntil(h) + ": released" : ""));
    }
  } else {
    const LeaseInfo& l = **info;
    PrintLine(fmt::format("key:           {}", Printable(l.key)));
    PrintLine(l.kept ? fmt::format("state:         kept until {}: its holder released it "
                                   "(hold at least), nothing runs under it",
                                   KeptUntil(l))
                     : std::string("state:         held"));
    PrintLine(fmt::format("holder:        {}", Printable(l.holder)));
    PrintLine(fmt::format("fencing token: {}", l.fencing_token));
    PrintLine(fmt::format("token prefix:  {}", l.token_prefix));
    PrintLine(fmt::format("remaining:     {}{}", l.remaining_is_upper_bound ? "at most " : "",
                          FormatDuration(RoundForDisplay(l.remaining))));
    PrintLine(fmt::format("ttl:           {}", FormatDuration(l.ttl)));
  }
  for (const LeaseInfo& g : gone) {
    PrintLine(fmt::format(
        "gone:          {} (fencing token {}, slot {}): its process and every process it "
        "guarded have exited; the next acquire takes it at once",
        Printable(g.holder), g.fencing_token, g.slot));
  }
  if (writer.has_value()) {
    PrintLine(fmt::format(
        "waiting:       writer {}: new shared holders wait behind it; its claim lasts {}{} "
        "unless it asks again",
        Printable(writer->holder), writer->remaining_is_upper_bound ? "at most " : "",
        FormatDuration(RoundForDisplay(writer->remaining))));
  }
  for (std::size_t i = 0; runs.ok() && i < runs->size(); ++i) {
    PrintLine(fmt::format("{}{}", i == 0 ? "slot runs:     " : "               ",
                          DescribeRun((*runs)[i])));
  }
  PrintLine(fmt::format("store:         {} (shared by {})", (*store)->display_url(),
                        StoreScopeName((*store)->scope())));
  return info->has_value() ? 0 : kExitFree;
}

int ListCommand(const std::string& store_url, const std::string& prefix, bool json) {
  auto store = OpenStoreFromFlag(store_url);
  if (!store.ok()) {
    return ReportFailure(store.error());
  }
  Result<std::vector<LeaseInfo>> leases = (*store)->List(prefix);
  if (!leases.ok()) {
    return ReportFailure(leases.error());
  }
  // As in status: the leases are shown even if the slot runs cannot be.
  Result<std::vector<KeySlotRuns>> listed_slots = (*store)->ListSlotRuns(prefix);
  if (!listed_slots.ok()) {
    Error(fmt::format("slot runs not shown: {}", Describe(listed_slots.error())));
  }
  const std::vector<KeySlotRuns> slots =
      listed_slots.ok() ? std::move(listed_slots).value() : std::vector<KeySlotRuns>();
  if (json) {
    // One entry per key that is held or has recorded slot runs, ordered by key.
    std::map<std::string, nlohmann::ordered_json> entries;
    // The first grant of a key (its lowest slot) is the entry; every grant is in "holders".
    std::map<std::string, std::vector<LeaseInfo>> by_key;
    for (const LeaseInfo& l : *leases) {
      by_key[l.key].push_back(l);
    }
    for (const auto& [key, grants] : by_key) {
      nlohmann::ordered_json j = ToJson(grants.front());
      j["held"] = true;
      j["holders"] = HoldersJson(grants);
      entries[key] = std::move(j);
    }
    for (const KeySlotRuns& k : slots) {
      if (k.runs.empty()) {
        continue;
      }
      auto [it, added] = entries.try_emplace(k.key);
      if (added) {
        it->second["key"] = k.key;
        it->second["held"] = false;
      }
      it->second["last_slot_run"] = ToJson(k.runs.front());
    }
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (auto& [key, entry] : entries) {
      j.push_back(std::move(entry));
    }
    PrintLine(j.dump());
    return 0;
  }
  std::size_t key_width = 3;
  std::size_t holder_width = 6;
  for (const LeaseInfo& l : *leases) {
    key_width = std::max(key_width, Printable(l.key).size());
    holder_width = std::max(holder_width, Printable(l.holder).size());
  }
  // MODE and SLOT: every holder of a shared or semaphore key has a line of its own.
  PrintLine(fmt::format("{:<{}}  {:<{}}  {:>13}  {:>9}  {:>6}  {:<8}  {:<9}  {}", "KEY", key_width,
                        "HOLDER", holder_width, "FENCING_TOKEN", "REMAINING", "TTL", "TOKEN",
                        "MODE", "SLOT"));
  for (const LeaseInfo& l : *leases) {
    PrintLine(fmt::format(
        "{:<{}}  {:<{}}  {:>13}  {:>9}  {:>6}  {:<8}  {:<9}  {}", Printable(l.key), key_width,
        Printable(l.holder), holder_width, l.fencing_token, RemainingColumn(l),
        FormatDuration(l.ttl), l.token_prefix, LeaseKindName(l.mode, l.limit),
        (l.limit > 1 ? fmt::format("{}/{}", l.slot, l.limit) : std::to_string(l.slot)) +
            (l.kept ? "  kept" : "")));
  }
  // Then the last recorded schedule-slot run of every key that has one (run --once-per).
  std::size_t slot_key_width = 3;
  bool any = false;
  for (const KeySlotRuns& k : slots) {
    if (!k.runs.empty()) {
      any = true;
      slot_key_width = std::max(slot_key_width, Printable(k.key).size());
    }
  }
  if (!any) {
    return 0;
  }
  PrintLine("");
  PrintLine(fmt::format("{:<{}}  {}", "KEY", slot_key_width, "LAST SLOT RUN"));
  for (const KeySlotRuns& k : slots) {
    if (!k.runs.empty()) {
      PrintLine(
          fmt::format("{:<{}}  {}", Printable(k.key), slot_key_width, DescribeRun(k.runs.front())));
    }
  }
  return 0;
}

int ReleaseCommand(const std::string& store_url, const std::string& key,
                   const std::string& holder) {
  if (Status s = ValidateKey(key); !s.ok()) {
    return ReportFailure(s);
  }
  auto store = OpenStoreFromFlag(store_url);
  if (!store.ok()) {
    return ReportFailure(store.error());
  }
  if (!holder.empty()) {
    // One holder's grant: find it by identity or token prefix, then delete it by its token
    // prefix, in one atomic store operation that leaves the other holders alone.
    Result<std::vector<LeaseInfo>> holders = (*store)->Holders(key);
    if (!holders.ok()) {
      return ReportFailure(holders.error());
    }
    std::vector<const LeaseInfo*> matches;
    std::erase_if(*holders, [](const LeaseInfo& h) { return h.waiting_writer; });
    for (const LeaseInfo& h : *holders) {
      if (h.holder == holder || (!h.token_prefix.empty() && h.token_prefix == holder)) {
        matches.push_back(&h);
      }
    }
    if (matches.empty()) {
      Notice("force_release",
             fmt::format("force-release of {} --holder {}: no such holder of {} ({} holder{})", key,
                         holder, key, holders->size(), holders->size() == 1 ? "" : "s"));
      return 0;
    }
    if (matches.size() > 1) {
      return ReportFailure(Status::InvalidArgument(fmt::format(
          "--holder {} names {} grants of {}: name one by its token prefix (leasehold status {})",
          holder, matches.size(), key, key)));
    }
    Result<bool> deleted = (*store)->ForceReleaseGrant(key, matches.front()->token_prefix);
    if (!deleted.ok()) {
      return ReportFailure(deleted.error());
    }
    if (*deleted) {
      Notice("force_release",
             fmt::format("force-released {} of {} (was held by {}){}",
                         matches.front()->slot == 0 && matches.front()->limit <= 1
                             ? std::string("the grant")
                             : fmt::format("slot {}", matches.front()->slot),
                         key, DescribeHolder(*matches.front()),
                         GoneWithin(*matches.front(), (*store)->notifies_holder())));
    } else {
      Notice("force_release",
             fmt::format("force-release of {} --holder {}: it ended meanwhile", key, holder));
    }
    return 0;
  }
  // Read the holder first, for the operator's record only: the deletion itself is one atomic
  // store operation that does not depend on this answer.
  Result<std::optional<LeaseInfo>> before = (*store)->Inspect(key);
  Result<bool> deleted = (*store)->ForceRelease(key);
  if (!deleted.ok()) {
    return ReportFailure(deleted.error());
  }
  if (!*deleted) {
    Notice("force_release", fmt::format("force-release of {}: it was not held", key));
  } else if (before.ok() && before->has_value()) {
    Notice("force_release",
           fmt::format("force-released {} (was held by {}){}", key, DescribeHolder(**before),
                       GoneWithin(**before, (*store)->notifies_holder())));
  } else {
    Notice("force_release", fmt::format("force-released {}", key));
  }
  return 0;
}

int SchemaCommand(const std::string& store_url) {
  Result<std::string> url =
      store_url.empty() ? Store::DefaultUrl() : Result<std::string>(store_url);
  if (!url.ok()) {
    return ReportFailure(url.error());
  }
  Result<std::string> sql = Store::SchemaSql(*url);
  if (!sql.ok()) {
    return ReportFailure(sql.error());
  }
  std::fputs(sql->c_str(), stdout);
  return 0;
}

}  // namespace leasehold::cli
