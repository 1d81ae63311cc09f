// File: tools/cli/main.cc
//
// The `leasehold` command: flag parsing (CLI11) and dispatch to the subcommands. This is the one
// place in leasehold with a top-level catch: CLI11 reports parse errors as exceptions, and an
// escaped std::bad_alloc must still become one line and a documented exit code.

#include <cstdio>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "leasehold/version.h"

#include "admin_commands.h"
#include "cli_log.h"
#include "exit_codes.h"
#include "run_command.h"

namespace leasehold::cli {

namespace {

constexpr const char* kStoreHelp =
    "Store URL, e.g. sqlite:///var/lib/app/leases.db. Default: $LEASEHOLD_STORE, else "
    "sqlite://$XDG_STATE_HOME/leasehold/leases.db (~/.local/state/leasehold/leases.db)";

struct Flags {
  std::string store_url;
  bool quiet = false;
  bool json = false;
  bool force = false;
  std::string key;
  std::string prefix;
  RunFlags run;
};

// --store and --quiet are accepted before and after the subcommand name.
void AddCommonOptions(CLI::App& app, Flags& flags) {
  app.add_option("--store", flags.store_url, kStoreHelp)->type_name("URL");
  app.add_flag("-q,--quiet", flags.quiet, "Print errors only");
}

std::string Footer() {
  return std::string("\n") + std::string(kExitCodeHelp);
}

int Main(int argc, char** argv) {
  CLI::App app("leasehold: distributed leases with fencing tokens", "leasehold");
  app.set_version_flag("--version", fmt::format("leasehold {}", Version()));
  app.require_subcommand(1);
  app.footer(Footer());
  Flags flags;
  AddCommonOptions(app, flags);

  CLI::App* run = app.add_subcommand(
      "run",
      "Run COMMAND while holding KEY. The command sees LEASEHOLD_KEY and "
      "LEASEHOLD_FENCING_TOKEN. If the lease is lost, or renewal cannot be confirmed in time, "
      "the command gets SIGTERM at safe_until - kill-grace and SIGKILL at safe_until, so it is "
      "gone before anyone else can take the lease. SIGINT/SIGTERM/SIGHUP sent to leasehold are "
      "forwarded to the command. Only the command's own process is supervised: have a shell "
      "wrapper exec the real work, or stop its children on SIGTERM. "
      "Usage: leasehold run [OPTIONS] KEY -- COMMAND [ARGS...]");
  AddCommonOptions(*run, flags);
  std::string ttl = "10s";
  std::string renew_every;
  std::string wait;
  std::string kill_grace;
  run->add_option("--ttl", ttl, "How long the store keeps the lease without renewal. Default: 10s")
      ->type_name("DURATION");
  CLI::Option* renew_opt =
      run->add_option("--renew-every", renew_every,
                      "How often to renew; must be less than --ttl. Default: ttl/3")
          ->type_name("DURATION");
  CLI::Option* wait_opt =
      run->add_option("--wait", wait,
                      "Wait up to DURATION (or 'forever') for the key to become free. "
                      "Default: none, try once and exit 75 if it is held")
          ->type_name("DURATION|forever");
  CLI::Option* grace_opt =
      run->add_option("--kill-grace", kill_grace,
                      "Time between SIGTERM and SIGKILL when the lease is lost or at risk. "
                      "Default: min(ttl/4, 5s)")
          ->type_name("DURATION");
  run->add_option("--holder", flags.run.holder,
                  "Identity shown to others (status, list). Default: <hostname>:<pid>")
      ->type_name("ID");
  run->add_option("KEY", flags.run.key, "The lease's name, 1..512 bytes of UTF-8")->required();
  run->add_option("COMMAND", flags.run.command, "The command to run, after --, with its arguments")
      ->required();
  run->footer(Footer());

  CLI::App* status = app.add_subcommand(
      "status", "Show who holds KEY, its fencing token and remaining TTL ('KEY: free' if none)");
  AddCommonOptions(*status, flags);
  status->add_flag("--json", flags.json, "Print one JSON object");
  status->add_option("KEY", flags.key, "The lease's name")->required();
  status->footer(Footer());

  CLI::App* list = app.add_subcommand("list", "List the live leases whose keys start with PREFIX");
  AddCommonOptions(*list, flags);
  list->add_flag("--json", flags.json, "Print one JSON array");
  list->add_option("PREFIX", flags.prefix, "Key prefix. Default: all keys");
  list->footer(Footer());

  CLI::App* release = app.add_subcommand(
      "release",
      "Operator break-glass: delete KEY's grant whoever holds it (requires --force). The holder "
      "finds out at its next renewal and stops its command (its `run` exits 79).");
  AddCommonOptions(*release, flags);
  release->add_flag("--force", flags.force, "Required: confirms the break-glass release");
  release->add_option("KEY", flags.key, "The lease's name")->required();
  release->footer(Footer());

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    Error(fmt::format("{} (see 'leasehold --help')", e.what()));
    return kExitUsage;
  }

  SetQuiet(flags.quiet);
  if (run->parsed()) {
    flags.run.store_url = flags.store_url;
    flags.run.ttl = ttl;
    if (renew_opt->count() > 0) {
      flags.run.renew_every = renew_every;
    }
    if (wait_opt->count() > 0) {
      flags.run.wait = wait;
    }
    if (grace_opt->count() > 0) {
      flags.run.kill_grace = kill_grace;
    }
    return RunCommand(flags.run);
  }
  if (status->parsed()) {
    return StatusCommand(flags.store_url, flags.key, flags.json);
  }
  if (list->parsed()) {
    return ListCommand(flags.store_url, flags.prefix, flags.json);
  }
  if (release->parsed()) {
    if (!flags.force) {
      Error(fmt::format(
          "release: refusing without --force: only the holder releases a lease (its `leasehold "
          "run` does on exit); `leasehold release --force {}` is the operator break-glass that "
          "deletes the grant whoever holds it",
          flags.key));
      return kExitUsage;
    }
    return ReleaseCommand(flags.store_url, flags.key);
  }
  Error("no subcommand (see 'leasehold --help')");
  return kExitUsage;
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
