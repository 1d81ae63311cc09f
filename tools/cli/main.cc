// File: tools/cli/main.cc
//
// The `leasehold` command: flag parsing (CLI11) and dispatch to the subcommands. This is the one
// place in leasehold with a top-level catch: CLI11 reports parse errors as exceptions, and an
// escaped std::bad_alloc must still become one line and a documented exit code.

#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "leasehold/version.h"

#include "admin_commands.h"
#include "check_command.h"
#include "cli_log.h"
#include "elect_command.h"
#include "exit_codes.h"
#include "help_text.h"
#include "leader_command.h"
#include "run_command.h"
#include "store_flag.h"

namespace leasehold::cli {

namespace {

constexpr const char* kStoreHelp =
    "Store URL, e.g. redis://leases.internal/0 (the fleet's store). Default: $LEASEHOLD_STORE, "
    "else `store = URL` in /etc/leasehold/leasehold.conf ($LEASEHOLD_CONFIG), else the "
    "host-wide embedded store sqlite:///var/lib/leasehold/leases.db?scope=host "
    "($LEASEHOLD_STATE_DIR), which every local user shares. memory:// is refused (it excludes "
    "no other command)";

// A flag whose text is kept only if it was given (RunFlags' std::optional<std::string>).
struct OptionalFlag {
  std::string text;
  CLI::Option* option = nullptr;

  // Adds the flag to `app`.
  void Add(CLI::App& app, const std::string& name, const std::string& help,
           const std::string& type_name) {
    option = app.add_option(name, text, help)->type_name(type_name);
  }

  // Sets `out` to the flag's text if it was given.
  void CopyTo(std::optional<std::string>& out) const {
    if (option != nullptr && option->count() > 0) {
      out = text;
    }
  }
};

// The lease flags `run` and `elect` share (AddLeaseFlags), as given.
struct LeaseFlags {
  std::string ttl = "10s";
  bool long_ttl = false;
  OptionalFlag renew_every;
  OptionalFlag wait;
  OptionalFlag kill_grace;

  // Copies them into `run`, with --store.
  void CopyTo(const std::string& store_url, RunFlags& run) const {
    run.store_url = store_url;
    run.ttl = ttl;
    run.long_ttl = long_ttl;
    renew_every.CopyTo(run.renew_every);
    wait.CopyTo(run.wait);
    kill_grace.CopyTo(run.kill_grace);
  }
};

// How the shared lease flags read in one subcommand.
struct LeaseFlagHelp {
  const char* ttl;
  const char* wait;
  const char* kill_grace;
};

// --once-per and the flags that shape it, --keep-history, and --hold-at-least (run only).
struct SlotFlags {
  OptionalFlag once_per;
  OptionalFlag slot_offset;
  OptionalFlag slot_tolerance;
  OptionalFlag hold_at_least;
  OptionalFlag keep_history;

  void CopyTo(RunFlags& run) const {
    once_per.CopyTo(run.once_per);
    slot_offset.CopyTo(run.slot_offset);
    slot_tolerance.CopyTo(run.slot_tolerance);
    hold_at_least.CopyTo(run.hold_at_least);
    keep_history.CopyTo(run.keep_history);
  }
};

struct Flags {
  std::string store_url;
  bool quiet = false;
  bool verbose = false;
  bool json = false;
  bool force = false;
  std::string key;
  std::string prefix;
  // release --holder.
  std::string release_holder;
  RunFlags run;
  LeaseFlags run_lease;
  SlotFlags run_slot;
  ElectFlags elect;
  LeaseFlags elect_lease;
  bool watch = false;
  CheckFlags check;
};

// The subcommands, to see which one was parsed.
struct Subcommands {
  CLI::App* run = nullptr;
  CLI::App* elect = nullptr;
  CLI::App* leader = nullptr;
  CLI::App* status = nullptr;
  CLI::App* list = nullptr;
  CLI::App* release = nullptr;
  CLI::App* schema = nullptr;
  CLI::App* check = nullptr;
};

// --store, --quiet and --verbose are accepted before and after the subcommand name.
void AddCommonOptions(CLI::App& app, Flags& flags) {
  app.add_option("--store", flags.store_url, kStoreHelp)->type_name("URL");
  app.add_flag("-q,--quiet", flags.quiet,
               "Print only errors and the lines of a lease at risk or lost: not that another "
               "host holds the key or ran the slot, nor warnings")
      ->envname("LEASEHOLD_QUIET");
  app.add_flag("-v,--verbose", flags.verbose,
               "Also print the lifecycle: acquired, store, containment, command started and "
               "exited, released. By default a run that succeeds prints nothing")
      ->envname("LEASEHOLD_VERBOSE");
}

constexpr const char* kContainHelp =
    "How the command's process tree is contained: cgroup (a cgroup v2 leaf per run: nothing "
    "escapes, PIDs unchanged), pidns (a PID namespace: nothing escapes even if leasehold's "
    "keeper is killed, but the command sees namespace PIDs), group (the process group and "
    "every descendant under the keeper; a process that outlives the keeper escapes), or auto "
    "(the first of cgroup, pidns, group this machine allows; as root all three). Default: auto";

// --contain, --wait-children and --exit-code, for run and elect.
void AddTreeOptions(CLI::App& app, RunFlags& run) {
  app.add_option("--exit-code", run.exit_codes,
                 "Move one of leasehold's own exit codes, so that a job's own code is never "
                 "mistaken for it (as flock -E): e.g. --exit-code held=0 --exit-code done=0 "
                 "makes another host's run a success and leaves every exit of the command as "
                 "it is. OUTCOME: usage, unavailable, internal, held, permission, lost, done, "
                 "unsafe, cannot-execute, not-found, interrupted. Repeatable")
      ->type_name("OUTCOME=N");
  app.add_option("--contain", run.contain, kContainHelp)
      ->type_name("auto|cgroup|pidns|group")
      ->envname("LEASEHOLD_CONTAIN");
  app.add_flag("--wait-children", run.wait_children,
               "When the command exits and processes it started remain, keep holding (and "
               "renewing) the lease until they exit. Default: stop them (SIGTERM, kill-grace, "
               "SIGKILL) before the lease is released");
}

// --ttl, --renew-every, --wait and --kill-grace, for run and elect.
void AddLeaseFlags(CLI::App& app, LeaseFlags& flags, const LeaseFlagHelp& help) {
  app.add_option("--ttl", flags.ttl, help.ttl)->type_name("DURATION")->envname("LEASEHOLD_TTL");
  app.add_flag("--long-ttl", flags.long_ttl,
               "Allow a --ttl above 1h (a crashed holder blocks the key for the whole TTL)");
  flags.renew_every.Add(app, "--renew-every",
                        "How often to renew; must be less than --ttl. Default: ttl/3", "DURATION");
  flags.wait.Add(app, "--wait", help.wait, "DURATION|forever");
  flags.kill_grace.Add(app, "--kill-grace", help.kill_grace, "DURATION");
}

// The exit-code table is printed once, under the top-level --help; each subcommand points to it.
std::string Footer() {
  return "\nExit codes: see `leasehold --help` (the table) or EXIT STATUS in leasehold(1).";
}

CLI::App* AddRunCommand(CLI::App& app, Flags& flags) {
  CLI::App* run = app.add_subcommand(
      "run",
      "Run COMMAND while holding KEY. The command sees LEASEHOLD_KEY, "
      "LEASEHOLD_FENCING_TOKEN and LEASEHOLD_STORE_KEY (where the store keeps the grant). If the "
      "lease is lost, or renewal cannot be confirmed in time, "
      "the command gets SIGTERM at safe_until - kill-grace and SIGKILL at safe_until, so it is "
      "gone before anyone else can take the lease. The whole process tree is guarded: every "
      "process the command starts (background jobs, pipelines, setsid daemons) gets the same "
      "schedule, kill -9 of leasehold takes the tree down with it, and when the command exits "
      "its leftovers are stopped before the lease is released (see --contain, "
      "--wait-children). SIGINT/SIGTERM/SIGHUP sent to leasehold go to the command's process "
      "group; a second one sends SIGKILL to its whole tree. Usage: leasehold run [OPTIONS] KEY -- "
      "COMMAND [ARGS...]");
  AddCommonOptions(*run, flags);
  AddLeaseFlags(*run, flags.run_lease,
                {.ttl = "How long the store keeps the lease without renewal: how long a crashed "
                        "holder blocks KEY (on the embedded store only until the holder's last "
                        "process is gone). At least what the kill schedule needs (374ms with the "
                        "default --renew-every and --kill-grace; a shorter one is refused naming "
                        "the smallest), at most 1h without --long-ttl. Default: 10s",
                 .wait = "Wait up to DURATION (or 'forever') for the key to become free. "
                         "Default: none, try once and exit 75 if it is held",
                 .kill_grace = "Time between SIGTERM and SIGKILL when the lease is lost or at "
                               "risk. Default: min(ttl/4, 5s)"});
  run->add_option("--holder", flags.run.holder,
                  "Identity shown to others (status, list). Default: <hostname>:<pid>")
      ->type_name("ID");
  run->add_option("--limit", flags.run.limit,
                  "A counting semaphore: at most N runs of KEY at once, across every host; "
                  "each run gets a slot 0..N-1, given to the command as LEASEHOLD_SLOT (and N "
                  "as LEASEHOLD_LIMIT). Every run of KEY must give the same N. Default: 1")
      ->type_name("N")
      ->check(CLI::Range(1, 1024).description(""));  // the help says the range in words
  run->add_flag("--shared", flags.run.shared,
                "A shared (read) lease: any number of --shared runs of KEY at once, while no "
                "exclusive run (no --shared) holds it; a waiting exclusive run keeps new "
                "shared ones out. Default: exclusive");
  AddTreeOptions(*run, flags.run);
  flags.run_slot.once_per.Add(
      *run, "--once-per",
      "Run at most once successfully per PERIOD-long slot of a time grid (15m, "
      "1h, 1d), across every host that runs this same line: the first host to "
      "claim the slot runs COMMAND, the others exit 80 (slot done) or 75 (it is "
      "running; see --wait). The slot is named by the store's clock where it has "
      "one. Exit 0 records the slot as done; a failure leaves it open for a retry "
      "(see --retry-failed). With --quiet, hosts that find the slot done or "
      "running print nothing",
      "PERIOD");
  flags.run_slot.slot_offset.Add(
      *run, "--slot-offset",
      "Where the --once-per grid starts: slots begin at epoch + offset + k * "
      "PERIOD (e.g. --once-per 1d --slot-offset 2h: daily at 02:00). Default: 0",
      "DURATION");
  run->add_option("--slot-zone", flags.run.slot_zone,
                  "Lay the --once-per grid on local time in this IANA time zone "
                  "(Europe/Berlin), so daily slots start at local midnight across "
                  "daylight-saving changes. Default: UTC")
      ->type_name("ZONE");
  flags.run_slot.slot_tolerance.Add(
      *run, "--slot-tolerance",
      "A host that starts up to this long before a slot boundary counts itself "
      "into the coming slot (its clock or timer runs a little early). Must be "
      "less than half the period. Default: min(PERIOD/4, 5m)",
      "DURATION");
  run->add_option("--retry-failed", flags.run.retry_failed,
                  "yes: a failed run (non-zero exit) leaves its --once-per slot open for "
                  "another host or a retry; no: a failure closes the slot too. Default: yes")
      ->type_name("yes|no");
  flags.run_slot.keep_history.Add(
      *run, "--keep-history",
      "Keep the key's --once-per run history (its last 8 runs, shown by status and list) in "
      "the store for DURATION after each run, up to 366d. Default and minimum: two periods and "
      "the slot tolerance, what the hosts of a slot need",
      "DURATION");
  flags.run_slot.hold_at_least.Add(
      *run, "--hold-at-least",
      "Keep the lease in the store until at least DURATION after it was taken, "
      "even after COMMAND ends and leasehold exits (no heartbeat, no process): "
      "others are refused until then (ShedLock's lockAtLeastFor). Default: "
      "release at once",
      "DURATION");
  AddObservabilityOptions(*run, flags.run.observability);
  run->add_option("KEY,--key", flags.run.key,
                  "The lease's name: 1..512 bytes of UTF-8, no control characters (--key KEY "
                  "for one that starts with '-')")
      ->required();
  // Not required() here: what follows `--` is taken verbatim before CLI11 parses (SplitCommand);
  // RunCommand reports a missing COMMAND.
  run->add_option("COMMAND", flags.run.command, "The command to run, after --, with its arguments");
  run->footer(Footer());
  return run;
}

CLI::App* AddElectCommand(CLI::App& app, Flags& flags) {
  CLI::App* elect = app.add_subcommand(
      "elect",
      "Campaign in election NAME and run COMMAND while leader, supervised as by `run` (same "
      "process-tree containment, kill schedule, signal forwarding and exit codes). Waits for "
      "leadership for as long as it "
      "takes unless --wait says otherwise. The command sees LEASEHOLD_ELECTION, LEASEHOLD_TERM "
      "(the leader's term: strictly increasing, use it as a fencing token), LEASEHOLD_LEADER_ID, "
      "and LEASEHOLD_KEY/LEASEHOLD_FENCING_TOKEN/LEASEHOLD_STORE_KEY as under `run`. With --again, "
      "campaigns again "
      "after the command ends or leadership is lost, until SIGINT/SIGTERM/SIGHUP. The lease key "
      "is election:NAME. Usage: leasehold elect [OPTIONS] NAME -- COMMAND [ARGS...]");
  AddCommonOptions(*elect, flags);
  AddLeaseFlags(*elect, flags.elect_lease,
                {.ttl = "How long the store keeps leadership without renewal (bounds as for run "
                        "--ttl). Default: 10s",
                 .wait = "Campaign for at most DURATION (0: try once, exit 75 if another "
                         "leads). Default: forever",
                 .kill_grace = "Time between SIGTERM and SIGKILL when leadership is lost or at "
                               "risk. Default: min(ttl/4, 5s)"});
  elect
      ->add_option("--id", flags.elect.run.holder,
                   "This candidate's id, shown as the leader's id. Default: <hostname>:<pid>")
      ->type_name("ID");
  elect->add_flag("--again", flags.elect.again,
                  "Campaign again after the command ends or leadership is lost");
  AddTreeOptions(*elect, flags.elect.run);
  AddObservabilityOptions(*elect, flags.elect.run.observability);
  elect->add_option("NAME", flags.elect.name, "The election's name")->required();
  elect->add_option("COMMAND", flags.elect.run.command,
                    "The command to run while leader, after --, with its arguments");
  elect->footer(Footer());
  return elect;
}

// leader, status, list, release and schema: the read-only and operator subcommands.
void AddAdminCommands(CLI::App& app, Flags& flags, Subcommands& sub) {
  CLI::App* leader = app.add_subcommand(
      "leader",
      "Print the leader of election NAME and its term ('NAME: no leader' if none); with "
      "--watch, print it and then every change of leader, one line each, until interrupted. A "
      "term that jumps by more than one means a leader came and went between two reads");
  AddCommonOptions(*leader, flags);
  leader->add_flag("--watch", flags.watch, "Stream every change of leader");
  leader->add_flag("--json", flags.json, "Print one JSON object (per line with --watch)");
  leader->add_option("NAME", flags.elect.name, "The election's name")->required();
  leader->footer(Footer());

  CLI::App* status = app.add_subcommand(
      "status", "Show who holds KEY, its fencing token and remaining TTL ('KEY: free' if none)");
  AddCommonOptions(*status, flags);
  status->add_flag("--json", flags.json, "Print one JSON object");
  status
      ->add_option("KEY,--key", flags.key, "The lease's name (--key KEY: one that starts with '-')")
      ->required();
  status->footer(Footer());

  CLI::App* list = app.add_subcommand(
      "list",
      "List the live leases whose keys start with PREFIX, then the last recorded schedule-slot "
      "run (run --once-per) of every such key that has one, held or free");
  AddCommonOptions(*list, flags);
  list->add_flag("--json", flags.json,
                 "Print one JSON array: one object per key that is held (\"held\": true) or has "
                 "slot runs (\"last_slot_run\")");
  list->add_option("PREFIX", flags.prefix, "Key prefix. Default: all keys");
  list->footer(Footer());

  CLI::App* release = app.add_subcommand(
      "release",
      "Operator break-glass: delete KEY's grant (every holder's, or with --holder one "
      "holder's) whoever holds it (requires --force). The holder's `run` stops its command "
      "(exit 79) at once where the store tells it (all but PostgreSQL advisory mode and "
      "PgBouncer), else at its next renewal.");
  AddCommonOptions(*release, flags);
  release->add_flag("--force", flags.force, "Required: confirms the break-glass release");
  release
      ->add_option("--holder", flags.release_holder,
                   "Release only the grant of this holder of a shared or semaphore KEY: its "
                   "holder identity or its token prefix, as `leasehold status KEY` shows "
                   "them. Default: every grant of KEY")
      ->type_name("ID");
  release
      ->add_option("KEY,--key", flags.key, "The lease's name (--key KEY: one that starts with '-')")
      ->required();
  release->footer(Footer());

  CLI::App* schema = app.add_subcommand(
      "schema",
      "Print the SQL that creates the store's table (postgres:// only; leasehold creates it on "
      "first use when its role may), for a DBA to apply. Does not connect.");
  AddCommonOptions(*schema, flags);
  schema->footer(Footer());
  CLI::App* check = app.add_subcommand(
      "check",
      "The store doctor: times the store's round trip (the probe leasehold-bench calls the "
      "floor) and one acquire -> renew -> release cycle on a throwaway key, compares the "
      "store's clock with this host's, reports durability (do fencing tokens survive a "
      "restart?), eviction (Redis), topology (replicas against min_replicas; with Sentinel, "
      "every replica must confirm), permissions and the CPU quota of its cgroup, and "
      "recommends a --ttl and --renew-every from the measured p99 (at least 10x it, in the "
      "store's own steps). Exit 0 when nothing is unsafe; 69 unreachable, 77 permission denied, "
      "81 unsafe; one line per failure says what to change");
  AddCommonOptions(*check, flags);
  check
      ->add_option("--ttl", flags.check.ttl,
                   "Judge this TTL: what the store grants for it, and whether it is at least 10x "
                   "the measured p99. Default: judge none, recommend one")
      ->type_name("DURATION");
  check
      ->add_option("--probes", flags.check.probes,
                   "How many round trips to time (1..10000). Default: 50")
      ->type_name("N");
  check->add_flag("--json", flags.check.json, "Print one JSON object");
  check->footer(Footer());
  sub.check = check;
  sub.leader = leader;
  sub.status = status;
  sub.list = list;
  sub.release = release;
  sub.schema = schema;
}

// Returns the arguments after the first `--` (the command), or nullopt if there is none, and
// sets `cli_argc` to the number of arguments before it.
std::optional<std::vector<std::string>> SplitCommand(int argc, char** argv, int& cli_argc) {
  // Everything after the first `--` is the command, byte for byte: CLI11 rewrites some
  // arguments it parses (a lone "[x]" becomes "x", which broke `sh -c '[ -n "$X" ]'`).
  std::optional<std::vector<std::string>> command;
  cli_argc = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--") {
      command.emplace(argv + i + 1, argv + argc);
      cli_argc = i;
      break;
    }
  }
  return command;
}

// Parses the flags; returns the exit code if parsing ended the command (help, version, a
// usage error), else nullopt.
std::optional<int> Parse(CLI::App& app, int cli_argc, char** argv) {
  try {
    app.parse(cli_argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    Error(ParseErrorText(e, app, cli_argc, argv));
    return kExitUsage;
  }
  return std::nullopt;
}

// Runs the parsed subcommand; returns the exit code.
int Dispatch(const Subcommands& sub, Flags& flags) {
  if (sub.run->parsed() || sub.elect->parsed()) {
    RunFlags& run = sub.run->parsed() ? flags.run : flags.elect.run;
    Result<std::map<int, int>> moved = ParseExitCodeMap(run.exit_codes);
    if (!moved.ok()) {
      return ReportFailure(moved.error());
    }
    if (sub.run->parsed()) {
      flags.run_lease.CopyTo(flags.store_url, flags.run);
      flags.run_slot.CopyTo(flags.run);
      return ExitCodeOf(RunCommand(flags.run), *moved);
    }
    flags.elect_lease.CopyTo(flags.store_url, flags.elect.run);
    return ExitCodeOf(ElectCommand(flags.elect), *moved);
  }
  if (sub.leader->parsed()) {
    return LeaderCommand(flags.store_url, flags.elect.name, flags.watch, flags.json);
  }
  if (sub.status->parsed()) {
    return StatusCommand(flags.store_url, flags.key, flags.json);
  }
  if (sub.list->parsed()) {
    return ListCommand(flags.store_url, flags.prefix, flags.json);
  }
  if (sub.release->parsed()) {
    if (!flags.force) {
      Error(fmt::format(
          "release: refusing without --force: only the holder releases a lease (its `leasehold "
          "run` does on exit); `leasehold release --force {}` is the operator break-glass that "
          "deletes the grant whoever holds it",
          flags.key));
      return kExitUsage;
    }
    return ReleaseCommand(flags.store_url, flags.key, flags.release_holder);
  }
  if (sub.check->parsed()) {
    flags.check.store_url = flags.store_url;
    return CheckCommand(flags.check);
  }
  if (sub.schema->parsed()) {
    return SchemaCommand(flags.store_url);
  }
  Error("no subcommand (see 'leasehold --help')");
  return kExitUsage;
}

int Main(int argc, char** argv) {
  CLI::App app("leasehold: distributed leases with fencing tokens", "leasehold");
  app.set_version_flag("--version", fmt::format("leasehold {} (commit {}; stores: {})", Version(),
                                                Commit(), CompiledStores()));
  app.require_subcommand(1);
  app.formatter(std::make_shared<WrappingFormatter>());
  app.footer(std::string("\n") + std::string(kExitCodeHelp));
  Flags flags;
  AddCommonOptions(app, flags);
  Subcommands sub;
  sub.run = AddRunCommand(app, flags);
  sub.elect = AddElectCommand(app, flags);
  AddAdminCommands(app, flags, sub);

  int cli_argc = argc;
  std::optional<std::vector<std::string>> command = SplitCommand(argc, argv, cli_argc);
  if (std::optional<int> ended = Parse(app, cli_argc, argv); ended.has_value()) {
    return *ended;
  }
  SetVerbosity(flags.quiet     ? Verbosity::kQuiet
               : flags.verbose ? Verbosity::kVerbose
                               : Verbosity::kNormal);
  if (command.has_value()) {
    flags.run.command.insert(flags.run.command.end(), command->begin(), command->end());
    flags.elect.run.command.insert(flags.elect.run.command.end(), command->begin(), command->end());
  }
  return Dispatch(sub, flags);
}

}  // namespace

}  // namespace leasehold::cli

int main(int argc, char** argv) {
  try {
    return leasehold::cli::Main(argc, argv);
  } catch (const std::bad_alloc&) {
    leasehold::cli::Error("out of memory");
    return leasehold::cli::kExitInternal;
  } catch (const std::exception& e) {
    leasehold::cli::Error(fmt::format("internal error: {}", e.what()));
    return leasehold::cli::kExitInternal;
  } catch (...) {
    leasehold::cli::Error("internal error: unknown exception");
    return leasehold::cli::kExitInternal;
  }
}
