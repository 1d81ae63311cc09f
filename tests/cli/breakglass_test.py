#!/usr/bin/env python3
# File: tests/cli/breakglass_test.py
#
# Break-glass with honest bounds (issue 35, point 10): `leasehold release --force KEY` while a
# `leasehold run` holds KEY. Where the store tells a holder that its grant was ended behind it
# (Store::notifies_holder: Redis pub/sub, PostgreSQL NOTIFY in table mode, etcd and ZooKeeper
# watches, the embedded store's wake-ups), the run's GrantWatch confirms the grant at once,
# finds it lost and stops its tree: the old tree is gone long before the holder's next renewal.
# PostgreSQL advisory mode cannot tell the holder (a grant is its holder's session): there the
# run stops at its next renewal, within the bound `release --force` prints.
#
#   python3 tests/cli/breakglass_test.py --store sqlite|redis|postgres|postgres-table|etcd|zk \
#       --leasehold build/tools/cli/leasehold [-v]
#
# LEASEHOLD_BREAKGLASS_TRIES sets the force-releases of the main case (default 20, the issue's
# p99 sample). Each try: a `run --ttl 30s` (its next renewal 10 s away) whose tree (a foreground
# and a background process) appends a tick every 20 ms; once it ticks, `release --force`; the
# time is taken from the start of that command (its own start-up and connection included) to
# the moment the old run has exited, which it does only once its whole tree is gone.

import os
import random
import time
import unittest

import cli_harness
from cli_harness import TICK_S, TICKER, CliHarness, StoreServer, figure, p99, read_ticks

STORE = "sqlite"
SERVER = None  # a StoreServer
EXIT_LOST = 79
# The stores whose holders are not told (PostgreSQL advisory mode).
NOT_TOLD = {"postgres"}


class BreakGlassTest(CliHarness, unittest.TestCase):
    TMP_PREFIX = "leasehold-breakglass-"

    def store_url(self):
        if SERVER.url:
            return SERVER.url
        return "sqlite://" + os.path.join(self.tmp, "leases.db")

    def setUp(self):
        super().setUp()
        # A server is shared by the tests: keys of their own.
        self.key = f"glass-{self._testMethodName[5:]}-{random.randrange(1 << 32):08x}"

    def force_release_of_a_ticking_run(self, tag, ttl):
        """Starts a `run --ttl TTL` whose tree ticks, force-releases its key once it ticks, and
        returns (seconds from the release command's start to the run's exit, the same from the
        release command's exit, the release's message): the grant was deleted between the two.
        Checks the run ends as lost (79) and its tree ticks no more."""
        ticks = self.path(f"{tag}.ticks")
        run = self.start("run", "--ttl", ttl, "--holder", f"old-{tag}", self.key, "--", "python3",
                         "-c", TICKER, ticks)
        self.wait_until("the old tree ticks", lambda: len(read_ticks(ticks)) >= 4)
        started = time.monotonic()
        r = self.cli("release", "--force", self.key, verbose=False)
        released = time.monotonic()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.wait_exit(run, 30), EXIT_LOST, self.stderr_of(run))
        exited = time.monotonic()
        count = len(read_ticks(ticks))
        time.sleep(5 * TICK_S)
        self.assertEqual(len(read_ticks(ticks)), count, f"{tag}: the old tree ticked after its run "
                         "exited")
        return exited - started, exited - released, r.stderr

    def test_the_old_tree_is_gone_at_once_where_the_store_tells_its_holder(self):
        if STORE in NOT_TOLD:
            self.skipTest(f"{STORE} does not tell a holder (test_without_notice_...)")
        tries = int(os.environ.get("LEASEHOLD_BREAKGLASS_TRIES", "20"))
        took, after = [], []
        for i in range(tries):
            seconds, since_exit, message = self.force_release_of_a_ticking_run(f"t{i}", "30s")
            took.append(seconds)
            after.append(since_exit)
            self.assertIn("the store tells its holder at once", message)
            self.assertIn("one that misses it stops at its next renewal, within 15s", message)
        # The target: 200 ms, p99 of 20 (measured on an idle machine: tests/chaos/
        # RESULTS.md, "Break-glass"). The assertion is looser, for a busy CI machine: far below
        # the 10 s (ttl/3) that the renewal path would take.
        figure(f"{STORE}: release --force started to the old run's exit (its whole tree gone), "
               f"p99 of {tries}", p99(took), 0.2)
        figure(f"{STORE}: release --force exited to the old run's exit, p99 of {tries}",
               p99(after), 0.2)
        self.assertLess(p99(took), 1.0, sorted(took))

    def test_without_notice_the_tree_is_gone_within_the_printed_bound(self):
        if STORE not in NOT_TOLD:
            self.skipTest(f"{STORE} tells its holder (test_the_old_tree_is_gone_at_once_...)")
        # ttl 3s: the next renewal within 1 s, then SIGTERM; the ticker needs no kill grace.
        for i in range(3):
            seconds, _, message = self.force_release_of_a_ticking_run(f"n{i}", "3s")
            self.assertIn("its holder's command may run on until its next renewal", message)
            self.assertIn("within 1.75s (ttl/3 + min(ttl/4, 5s) of its 3s TTL", message)
            figure(f"{STORE}: release --force to the old run's exit (renewal every 1 s)", seconds,
                   1.75)
            self.assertLess(seconds, 1.75 + 0.5)


def setUpModule():
    global SERVER
    SERVER = StoreServer(STORE, "breakglass_test")


def tearDownModule():
    if SERVER is not None:
        SERVER.stop()


def use_store(name):
    global STORE
    STORE = name


if __name__ == "__main__":
    cli_harness.store_main("breakglass_test", use_store)
