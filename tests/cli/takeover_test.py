#!/usr/bin/env python3
# File: tests/cli/takeover_test.py
#
# Instant takeover on one host (issue 35, point 3): on the embedded store a grant counts as held
# only while its holder's liveness lock is held (sqlite_holder_anchor.h), which `leasehold run`'s
# keeper keeps until the command's whole tree is gone. So after kill -9 of a `leasehold run`, a
# waiting run starts at once (not a TTL later), with a higher fencing token, and never while a
# process of the old tree still writes; `status` shows the gone holder apart.
#
#   python3 tests/cli/takeover_test.py --leasehold build/tools/cli/leasehold [-v]
#
# LEASEHOLD_TAKEOVER_TRIES sets the kill -9 tries of the main case (default 50, the p99
# sample). Each try: a holder whose tree (a foreground and a background process) appends a
# CLOCK_REALTIME tick every 20 ms, a waiter started before the kill, and kill -9 of the holder's
# leasehold; the waiter's command writes its own start time first thing.

import os
import signal
import time
import unittest

import cli_harness
from cli_harness import TICK_S, TICKER, CliHarness, figure, p99, read_ticks

TTL = "10s"
# The waiter: its start time and its fencing token, then it holds the key a little.
WAITER = 'date +%s%N > "$1.started"; echo "$LEASEHOLD_FENCING_TOKEN" > "$1.token"; sleep 0.2'


# What each command calls its key and its holder's id: `elect NAME` holds election:NAME.
NAME = {"run": "job:takeover", "elect": "takeover"}
KEY = {"run": "job:takeover", "elect": "election:takeover"}
ID_FLAG = {"run": "--holder", "elect": "--id"}


class TakeoverTest(CliHarness, unittest.TestCase):
    TMP_PREFIX = "leasehold-takeover-"
    key = KEY["run"]

    def holder(self, command, tag, *extra):
        """Starts the holder: `leasehold COMMAND` of self.key whose tree ticks into TAG.ticks;
        returns it once the tree has ticked (both processes run)."""
        ticks = self.path(f"{tag}.ticks")
        args = [command, "--ttl", TTL, ID_FLAG[command], f"old-{tag}", *extra, NAME[command]]
        p = self.start(*args, "--", "python3", "-c", TICKER, ticks)
        self.wait_until("the old tree ticks", lambda: len(read_ticks(ticks)) >= 4)
        return p, ticks

    def waiter(self, command, tag):
        args = [command, "--ttl", TTL, ID_FLAG[command], f"new-{tag}"]
        if command == "run":
            args += ["--wait", "30s"]
        return self.start(*args, NAME[command], "--", "sh", "-c", WAITER, "sh", self.path(tag))

    def one_takeover(self, tag, command="run", extra=()):
        """kill -9 of a holding `leasehold COMMAND`, a waiter already waiting: returns the ms from
        the kill to the waiter's command's start."""
        old, ticks = self.holder(command, tag, *extra)
        old_token = self.status_json(KEY[command])["fencing_token"]
        new = self.waiter(command, tag)
        time.sleep(0.05)  # the waiter has found the key held and waits
        self.assertIsNone(new.poll(), self.diagnostics())
        killed_ns = time.time_ns()
        os.kill(old.pid, signal.SIGKILL)
        started_ns = int(self.wait_for_file(f"{tag}.started"))
        token = int(self.wait_for_file(f"{tag}.token"))
        old.wait(timeout=10)
        # Never while the old tree runs: no tick at or after the waiter's start, then or later.
        time.sleep(5 * TICK_S)
        last_tick = max(read_ticks(ticks))
        self.assertLess(last_tick, started_ns,
                        f"{tag}: the old tree ticked {(last_tick - started_ns) / 1e6:.1f} ms after "
                        "the new holder's command started")
        self.assertGreater(token, old_token, f"{tag}: the new grant's fencing token")
        self.assertEqual(self.wait_exit(new, 10), 0, self.stderr_of(new))
        return (started_ns - killed_ns) / 1e6

    def test_kill_9_of_run_hands_the_key_to_a_waiter_at_once(self):
        tries = int(os.environ.get("LEASEHOLD_TAKEOVER_TRIES", "50"))
        took = [self.one_takeover(f"t{i}") for i in range(tries)]
        # The target is 100 ms (p99 of 50; 36 ms on an idle machine). The assertion is
        # looser, for a busy CI machine: far below the 10 s TTL, which is what a takeover that
        # waited for the TTL would take.
        figure(f"kill -9 of leasehold run to the waiter's command, p99 of {tries}", p99(took) / 1000,
               1.0)
        self.assertLess(p99(took), 1000, sorted(took))

    def test_every_containment_keeps_the_key_until_its_tree_is_gone(self):
        for contain in ("pidns", "group"):
            took = [self.one_takeover(f"{contain}{i}", extra=("--contain", contain))
                    for i in range(3)]
            figure(f"--contain {contain}: kill -9 of leasehold run to the waiter's command, max of 3",
                   max(took) / 1000, 1.0)
            self.assertLess(max(took), 1000)

    def test_kill_9_of_an_elected_leader_hands_leadership_at_once(self):
        took = self.one_takeover("elect", command="elect")
        figure("kill -9 of leasehold elect to the next leader's command", took / 1000, 1.0)
        self.assertLess(took, 1000)

    def test_status_shows_a_gone_holder_apart_and_the_key_free(self):
        old, _ = self.holder("run", "gone")
        token = self.status_json()["fencing_token"]
        os.kill(old.pid, signal.SIGKILL)
        old.wait(timeout=10)

        def gone():
            j = self.status_json()
            return j if j.get("gone") else None
        j = self.wait_until("status shows the gone holder", gone, timeout=5)
        self.assertFalse(j["held"], j)
        self.assertEqual(j["gone"][0]["holder"], "old-gone")
        self.assertEqual(j["gone"][0]["fencing_token"], token)
        r = self.cli("status", self.key)
        self.assertEqual(r.returncode, 1, r.stderr)  # free
        self.assertIn(f"{self.key}: free", r.stdout)
        self.assertIn(f"gone:          old-gone (fencing token {token}, slot 0)", r.stdout)
        # The next run takes it at once, without --wait.
        r = self.cli("run", self.key, "--", "true")
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    cli_harness.main("takeover_test")
