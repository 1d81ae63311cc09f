#!/usr/bin/env python3
# File: tests/cli/check_test.py
#
# End-to-end tests of `leasehold check` (the store doctor) on one store:
#
#   python3 tests/cli/check_test.py --store sqlite|redis|postgres|postgres-table|etcd|zk \
#       --leasehold build/tools/cli/leasehold [-v] [CommonCheckTest.test_x]
#
# CommonCheckTest runs on every store: a healthy store passes (exit 0) in text and in JSON, and
# both say the same; the JSON has every field the README documents; bad flags are one line and
# exit 64. The store classes below it add what only their store can show (a Redis without
# persistence, an ACL user without evalsha, a paused server, a ZooKeeper with tickTime 2000,
# ...); each runs only with its --store.
#
# The server stores are started once per run by the store classes of tests/chaos/chaos.py (a
# throwaway server on free loopback ports, in a temporary directory); the tests reach them
# straight, not through the fault proxy, unless a test says otherwise. Every loop is bounded.

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import cli_harness
from cli_harness import CliHarness, figure

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "chaos"))
import chaos  # noqa: E402  (the store starters)

STORE = "sqlite"
SERVER = None  # the chaos store object of a server store, started by setUpModule
SERVER_URL = None  # its URL, straight to the server

EXIT_USAGE = 64
EXIT_UNAVAILABLE = 69
EXIT_PERMISSION = 77
EXIT_UNSAFE = 81


class CheckHarness(CliHarness):
    TMP_PREFIX = "leasehold-check-"

    def store_url(self):
        if SERVER_URL:
            return SERVER_URL
        return "sqlite://" + os.path.join(self.tmp, "leases.db")

    def check(self, *args, store=None, timeout=60):
        """Runs `leasehold check ARGS --json` (on `store`, default the test's); returns (exit
        code, the parsed JSON or None, stderr)."""
        argv = ["check", "--json"] + list(args)
        if store is not None:
            argv[1:1] = ["--store", store]
        r = self.cli(*argv, timeout=timeout, store=store is None)
        try:
            doc = json.loads(r.stdout) if r.stdout.strip() else None
        except json.JSONDecodeError:
            self.fail(f"check --json printed no JSON: {r.stdout!r} {r.stderr!r}")
        return r.returncode, doc, r.stderr

    def items(self, doc, area):
        return [i for i in doc["items"] if i["area"] == area]

    def assert_item(self, doc, area, verdict, contains=""):
        found = [i for i in self.items(doc, area) if contains in i["found"]]
        self.assertTrue(found, f"no {area} item with {contains!r}: {json.dumps(doc, indent=1)}")
        self.assertIn(verdict, [i["verdict"] for i in found], json.dumps(doc, indent=1))
        return found[0]


class CommonCheckTest(CheckHarness, unittest.TestCase):
    """What every store shows."""

    def test_healthy_store_passes_in_text_and_json(self):
        t = time.monotonic()
        rc, doc, err = self.check()
        figure(f"{STORE} check", time.monotonic() - t, 30.0)
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        self.assertIn(doc["verdict"], ("pass", "warn"))
        self.assertEqual(doc["backend"], self.store.split(":")[0].split("+")[0])
        self.assertEqual(doc["round_trip"]["count"], 50, doc)
        self.assertGreater(doc["round_trip"]["p99_ms"], 0)
        self.assertLessEqual(doc["round_trip"]["p50_ms"], doc["round_trip"]["p99_ms"])
        self.assertLessEqual(doc["round_trip"]["p99_ms"], doc["round_trip"]["max_ms"])
        cycle = doc["cycle"]
        self.assertTrue(cycle["done"], doc)
        self.assertTrue(cycle["key"].startswith("leasehold-check/"), cycle)
        self.assertGreater(cycle["fencing_token"], 0)
        self.assertEqual(cycle["renew"]["count"], 10)
        self.assertGreaterEqual(cycle["ttl_granted_ms"], 10000 if STORE != "zk" else 1)
        ttl = doc["ttl"]
        self.assertFalse(ttl["judged"])
        self.assertGreaterEqual(ttl["recommended_ms"], 1000)
        self.assertGreaterEqual(ttl["recommended_ms"], 10 * doc["round_trip"]["p99_ms"])
        self.assertAlmostEqual(ttl["renew_every_ms"], int(ttl["recommended_ms"] / 3), delta=1)
        self.assert_item(doc, "ttl", "pass", "recommended --ttl")
        for item in doc["items"]:
            self.assertIn(item["verdict"], ("pass", "warn"), item)
            self.assertNotIn("\n", item["found"] + item["fix"])
        # The throwaway key is gone.
        r = self.cli("status", "--json", cycle["key"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(json.loads(r.stdout)["held"], r.stdout)

        text = self.cli("check")
        self.assertEqual(text.returncode, 0, text.stdout + text.stderr)
        lines = text.stdout.splitlines()
        self.assertTrue(lines[0].startswith("store "), text.stdout)
        self.assertRegex(lines[-1], r"^verdict +(pass|warn)$")
        for area in ("round-trip", "cycle", "ttl"):
            self.assertTrue(any(line.startswith(area + " ") for line in lines), text.stdout)

    def test_judged_ttl_is_reported_with_what_the_store_grants(self):
        rc, doc, err = self.check("--ttl", "30s")
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        self.assertTrue(doc["ttl"]["judged"])
        self.assertTrue(doc["ttl"]["safe"])
        self.assertEqual(doc["cycle"]["ttl_requested_ms"], 30000)
        self.assert_item(doc, "ttl", "pass", "--ttl 30s is safe")

    def test_bad_flags_are_one_line_and_exit_64(self):
        for args in (["--ttl", "0s"], ["--ttl", "soon"], ["--probes", "0"],
                     ["--probes", "10001"]):
            r = self.cli("check", *args)
            self.assertEqual(r.returncode, EXIT_USAGE, (args, r.stdout, r.stderr))
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, (args, r.stderr))
            self.assertEqual(r.stdout, "", args)
        r = self.cli("check", "--store", "nosuch://x", store=False)
        self.assertEqual(r.returncode, EXIT_USAGE, r.stderr)


# --- store-specific tests: each class runs only with its --store ------------------------------


def only(store):
    """Class decorator: the class's tests run only with --store `store` (judged when a test
    starts: STORE is set by main() after the classes are made)."""
    def decorate(cls):
        set_up = cls.setUp

        def setUp(self):
            if STORE != store:
                self.skipTest(f"--store {store} only")
            set_up(self)
        cls.setUp = setUp
        return cls
    return decorate


@only("sqlite")
class SqliteCheckTest(CheckHarness, unittest.TestCase):
    pass


@only("redis")
class RedisCheckTest(CheckHarness, unittest.TestCase):
    pass


@only("postgres")
class PostgresCheckTest(CheckHarness, unittest.TestCase):
    pass


@only("postgres-table")
class PostgresTableCheckTest(CheckHarness, unittest.TestCase):
    pass


@only("etcd")
class EtcdCheckTest(CheckHarness, unittest.TestCase):
    pass


@only("zk")
class ZkCheckTest(CheckHarness, unittest.TestCase):
    pass


@only("redis")
class HeadroomWarningTest(CheckHarness, unittest.TestCase):
    """The run-time half of the rule: `leasehold run` warns (once, rate-limited) when the
    heartbeat's p99 round trip exceeds a tenth of the TTL, and counts it in /metrics; silent
    otherwise. The store is reached through the chaos fault proxy, which, once the command has
    started, holds every reply for 600 ms in the slow case: 3x the threshold of a 2 s TTL
    (200 ms). Not 5x: renewals are serial, so a round trip of ttl/2 (1 s here) loses the lease
    (each round confirms a send one round trip old: safe_until = t_send + 1.98 s, the next reply
    comes at t_send + 2 s), and 4x (800 ms) is past the default kill-grace schedule (SIGTERM at
    safe_until - 500 ms). At 600 ms the lease stays held: a round confirms every ~667 ms."""

    TTL = "2s"
    DELAY_S = 0.6

    def store_url(self):
        return SERVER.url()  # through the proxy

    def tearDown(self):
        SERVER.proxy.mode = "pass"
        super().tearDown()

    def run_job(self, delay):
        port = cli_harness.free_port()
        run = self.start("run", "--ttl", self.TTL, "--metrics-addr", f"127.0.0.1:{port}",
                         f"headroom-{delay}", "--", "sleep", "9")
        self.wait_until("the command starts", lambda: "started the command" in
                        self.stderr_of(run), timeout=20)
        if delay:
            SERVER.proxy.delay_s = self.DELAY_S
            SERVER.proxy.mode = "delay"
        metrics = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and run.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    metrics = r.read().decode()
            except OSError:
                pass
            if "ttl_headroom_low" in self.stderr_of(run) and "ttl_headroom_ratio{" in metrics:
                break
            time.sleep(0.2)
        rc = self.wait_exit(run, 60)
        SERVER.proxy.mode = "pass"
        return rc, self.stderr_of(run), metrics

    def test_slow_renewals_warn_once_and_count_it(self):
        rc, err, metrics = self.run_job(delay=True)
        self.assertEqual(rc, 0, err)
        warnings = [line for line in err.splitlines() if "ttl_headroom_low" in line]
        self.assertEqual(len(warnings), 1, err)
        self.assertIn("ttl_seconds=2.000000", warnings[0])
        self.assertIn("recommended_ttl=", warnings[0])
        self.assertRegex(metrics, r'leasehold_ttl_headroom_warnings_total\{backend="redis"\} 1')
        ratio = re.search(r'leasehold_ttl_headroom_ratio\{backend="redis"\} ([0-9.e+-]+)',
                          metrics)
        self.assertIsNotNone(ratio, metrics)
        self.assertLess(float(ratio.group(1)), 10.0)

    def test_fast_renewals_stay_silent(self):
        rc, err, metrics = self.run_job(delay=False)
        self.assertEqual(rc, 0, err)
        self.assertNotIn("ttl_headroom_low", err)
        self.assertRegex(metrics, r'leasehold_ttl_headroom_warnings_total\{backend="redis"\} 0')


def setUpModule():
    global SERVER, SERVER_URL
    if STORE == "sqlite":
        return
    run_dir = tempfile.mkdtemp(prefix="leasehold-check-server-")
    store = chaos.STORES[STORE]()
    t = time.monotonic()
    try:
        store.start(run_dir)
    except SystemExit as e:  # chaos's starters exit with a message
        raise AssertionError(f"{STORE} server did not start: {e}") from None
    SERVER_URL = store.url().replace(f":{store.proxy.port}", f":{store.port}")
    store.run_dir_ = run_dir
    SERVER = store
    figure(f"{STORE} server start", time.monotonic() - t, 60.0)
    print(f"  check_test: store {SERVER_URL}", file=sys.stderr, flush=True)


def tearDownModule():
    if SERVER is not None:
        SERVER.stop()
        shutil.rmtree(SERVER.run_dir_, ignore_errors=True)


def main():
    global STORE
    parser = cli_harness.arg_parser()
    parser.add_argument("--store", default="sqlite", choices=sorted(chaos.STORES),
                        help="the store to test on (servers are started here, throwaway)")
    args, rest = parser.parse_known_args()
    cli_harness.use_leasehold(args.leasehold, "check_test")
    STORE = args.store
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
