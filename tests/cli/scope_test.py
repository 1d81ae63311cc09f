#!/usr/bin/env python3
# File: tests/cli/scope_test.py
#
# Which store a command uses and who shares it (issue 35, point 1): without --store, every local
# user's commands share the host-wide embedded store (LEASEHOLD_STATE_DIR, here under the test's
# temp dir: the file 0666 in a sticky 1777 directory), so root and an unprivileged user never hold
# one key at once; the host's configuration file (LEASEHOLD_CONFIG) names the fleet's store for a
# crontab line without --store; memory:// is refused (two commands never share it); `run`,
# `status` and `check` say which store and which scope they used, and `check` warns about a
# private file.
#
#   python3 tests/cli/scope_test.py --leasehold build/tools/cli/leasehold [-v]
#
# The two-user cases run the unprivileged side with setpriv as nobody; they skip when the test
# is not root or the binary is not reachable by nobody.

import json
import os
import shutil
import stat
import subprocess
import unittest

import cli_harness
from cli_harness import CliHarness

EXIT_USAGE = 64
EXIT_HELD = 75
EXIT_PERMISSION = 77


def nobody_can_run(path):
    """True if the test runs as root, setpriv exists, and nobody can execute `path`."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", path,
                        "--version"], capture_output=True, text=True)
    return r.returncode == 0


class ScopeTest(CliHarness, unittest.TestCase):
    TMP_PREFIX = "leasehold-scope-"

    def state_dir(self):
        return self.env["LEASEHOLD_STATE_DIR"]

    def as_nobody(self, args):
        return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                cli_harness.LEASEHOLD] + list(args)

    def test_default_store_is_host_wide_and_every_command_says_so(self):
        r = self.cli("run", "job", "--", "true", store=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        db = os.path.join(self.state_dir(), "leases.db")
        self.assertIn(f"store sqlite://{db}?scope=host (shared by this host)", r.stderr)
        self.assertEqual(stat.S_IMODE(os.stat(db).st_mode), 0o666)
        self.assertEqual(stat.S_IMODE(os.stat(self.state_dir()).st_mode), 0o1777)

        r = self.cli("status", "job", store=False)
        self.assertEqual(r.returncode, 1, r.stderr)  # free: the run ended
        self.assertIn(f"store:         sqlite://{db}?scope=host (shared by this host)", r.stdout)
        j = self.status_json("job", store=False)
        self.assertEqual((j["store"], j["scope"]), (f"sqlite://{db}?scope=host", "this host"))

        r = self.cli("check", "--probes", "3", store=False)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("(sqlite; shared by this host)", r.stdout.splitlines()[0])
        topology = [line for line in r.stdout.splitlines() if line.startswith("topology")]
        self.assertEqual(len(topology), 1, r.stdout)
        self.assertIn("pass", topology[0])
        self.assertIn("every local user", topology[0])

    def test_a_private_file_is_said_to_be_private(self):
        r = self.cli("check", "--probes", "3")  # the harness's own file: made 0600
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("shared by this user on this host", r.stdout.splitlines()[0])
        topology = [line for line in r.stdout.splitlines() if line.startswith("topology")]
        self.assertIn("warn", topology[0])
        self.assertIn("another user's leasehold run", topology[0])
        self.assertIn("note topology: for one lease per host", r.stdout)

    def test_memory_store_is_refused_by_every_command(self):
        for args in (["run", "job", "--", "touch", "ran"], ["status", "job"], ["list"],
                     ["check"], ["elect", "e", "--", "touch", "ran"]):
            r = self.cli(args[0], "--store", "memory://", *args[1:], store=False)
            self.assert_one_error_line(r, EXIT_USAGE)
            self.assertIn("memory:// keeps leases inside one process", r.stderr)
        self.assertFalse(os.path.exists(self.path("ran")))

    def test_the_configuration_file_names_the_store_and_the_environment_overrides_it(self):
        configured = self.path("configured.db")
        with open(self.env["LEASEHOLD_CONFIG"], "w") as f:
            f.write(f"# the fleet's store\nstore = sqlite://{configured}\n")
        r = self.cli("run", "--quiet", "job", "--", "true", store=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(configured))
        self.assertFalse(os.path.exists(os.path.join(self.state_dir(), "leases.db")))

        from_env = self.path("from-env.db")
        env = dict(self.env, LEASEHOLD_STORE=f"sqlite://{from_env}")
        r = self.cli("run", "--quiet", "job", "--", "true", env=env, store=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(from_env))

        with open(self.env["LEASEHOLD_CONFIG"], "w") as f:
            f.write("store = a\nsqlite:///oops\n")
        r = self.cli("run", "job", "--", "touch", "ran", store=False)
        self.assert_one_error_line(r, EXIT_USAGE)
        self.assertIn(self.env["LEASEHOLD_CONFIG"] + ":2", r.stderr)
        self.assertFalse(os.path.exists(self.path("ran")))

    def test_root_and_an_unprivileged_user_never_hold_one_key_at_once(self):
        if not nobody_can_run(cli_harness.LEASEHOLD):
            self.skipTest("needs root, setpriv and a binary nobody can run")
        os.chmod(self.tmp, 0o755)
        # Root makes the host-wide store first (as the package's postinst makes its directory):
        # nobody may not create a directory under root's.
        r = self.cli("list", store=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        shared = self.path("shared")
        os.mkdir(shared)
        os.chmod(shared, 0o777)
        log = os.path.join(shared, "log")
        with open(log, "w"):
            pass
        os.chmod(log, 0o666)
        job = (f"echo \"start $(id -u)\" >> {log}; sleep 0.15; echo \"end $(id -u)\" >> {log}")
        args = ["run", "--wait", "30s", "job", "--", "sh", "-c", job]
        procs = []
        for _ in range(4):
            procs.append(subprocess.Popen([cli_harness.LEASEHOLD] + args, env=self.env,
                                          cwd=shared, stderr=subprocess.PIPE, text=True))
            procs.append(subprocess.Popen(self.as_nobody(args), env=self.env, cwd=shared,
                                          stderr=subprocess.PIPE, text=True))
        for p in procs:
            _, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 0, err)
        with open(log) as f:
            lines = f.read().split("\n")[:-1]
        self.assertEqual(len(lines), 16, lines)
        users = set()
        for i in range(0, len(lines), 2):
            start, end = lines[i].split(), lines[i + 1].split()
            self.assertEqual((start[0], end[0]), ("start", "end"), f"overlap at {i}: {lines}")
            self.assertEqual(start[1], end[1], f"overlap at {i}: {lines}")
            users.add(start[1])
        self.assertEqual(users, {"0", "65534"}, "both users ran the job")

        # Held by one user: the other is refused.
        holder = self.start("run", "--ttl", "5s", "held", "--", "sleep", "30", store=False)
        self.wait_until("held", lambda: self.status_json("held", store=False)["held"])
        r = subprocess.run(self.as_nobody(["run", "held", "--", "true"]), env=self.env,
                           cwd=shared, capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, EXIT_HELD, r.stderr)
        holder.kill()
        holder.wait()

    def test_an_unprivileged_user_is_told_how_to_make_the_host_wide_directory(self):
        if not nobody_can_run(cli_harness.LEASEHOLD):
            self.skipTest("needs root, setpriv and a binary nobody can run")
        os.chmod(self.tmp, 0o755)
        env = dict(self.env, LEASEHOLD_STATE_DIR=self.path("missing/leasehold"))
        r = subprocess.run(self.as_nobody(["run", "job", "--", "true"]), env=env, cwd="/",
                           capture_output=True, text=True, timeout=30)
        self.assert_one_error_line(r, EXIT_PERMISSION)
        self.assertIn("install -d -m 1777 " + self.path("missing/leasehold"), r.stderr)

    def test_environment_variables_set_the_common_flags_and_a_flag_beats_them(self):
        env = dict(self.env, LEASEHOLD_TTL="3s", LEASEHOLD_LOG_FORMAT="json")
        p = self.start("run", "envttl", "--", "sleep", "30", env=env)
        self.wait_until("held", lambda: self.status_json("envttl")["held"])
        self.assertEqual(self.status_json("envttl")["ttl_ms"], 3000)
        r = self.cli("run", "envttl", "--", "true", env=env, verbose=False)
        self.assertEqual(r.returncode, 75, r.stderr)
        self.assertEqual(json.loads(r.stderr)["event"], "held_by_another")  # LEASEHOLD_LOG_FORMAT
        r = self.cli("run", "envttl", "--", "true", env=dict(env, LEASEHOLD_QUIET="1"),
                     verbose=False)
        self.assertEqual((r.returncode, r.stderr), (75, ""))
        p.kill()
        p.wait()
        q = self.start("run", "--ttl", "4s", "envttl2", "--", "sleep", "30", env=env)
        self.wait_until("held", lambda: self.status_json("envttl2")["held"])
        self.assertEqual(self.status_json("envttl2")["ttl_ms"], 4000, "--ttl beats LEASEHOLD_TTL")
        q.kill()
        q.wait()


if __name__ == "__main__":
    cli_harness.main("scope_test")
