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
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

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
    """Runs the class only with --store `store`. Judged when the class starts, not at import:
    main() sets STORE after the module (and its decorators) ran."""

    def wrap(cls):
        inner = cls.setUpClass.__func__

        def setUpClass(klass):
            if STORE != store:
                raise unittest.SkipTest(f"--store {store} only")
            inner(klass)

        cls.setUpClass = classmethod(setUpClass)
        return cls

    return wrap


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
    """The chaos EtcdStore is one member: a warning, not a failure. etcd leases are whole
    seconds (at least 2 s)."""

    def test_single_member_warns_and_ttls_are_whole_seconds(self):
        rc, doc, err = self.check("--ttl", "2500ms")
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        self.assertEqual(doc["verdict"], "warn", doc)
        self.assertEqual(doc["round_trip"]["probe"], "Range (missing key)")
        self.assertEqual(doc["ttl"]["granularity_ms"], 1000)
        self.assert_item(doc, "topology", "warn", "1 member: no fault tolerance")
        self.assert_item(doc, "topology", "pass", "raft term")
        self.assert_item(doc, "topology", "pass", "the URL names 1 of the 1 members")
        self.assert_item(doc, "session", "pass", "at least 2 s")
        self.assert_item(doc, "durability", "pass", "revisions")
        self.assert_item(doc, "permissions", "pass", "auth: no user")
        self.assertEqual(doc["cycle"]["ttl_requested_ms"], 2500)
        self.assertEqual(doc["cycle"]["ttl_granted_ms"], 3000)
        item = self.assert_item(doc, "session", "warn", "a TTL of 2.5s is granted as 3s")
        self.assertIn("ask for 3s", item["fix"])
        self.assertTrue(doc["ttl"]["safe"], doc)
        # No advice below what etcd grants.
        self.assertGreaterEqual(doc["ttl"]["min_ms"], 2000, doc["ttl"])
        self.assertGreaterEqual(doc["ttl"]["recommended_ms"], 2000, doc["ttl"])

    def test_endpoint_that_is_not_a_member_warns(self):
        # The fault proxy reaches the member, but it is not a member's client URL.
        url = SERVER.url()
        rc, doc, err = self.check(store=url)
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        item = self.assert_item(doc, "topology", "warn",
                                f"127.0.0.1:{SERVER.proxy.port} is not among the members")
        self.assertIn("fail-over needs them", item["fix"])

    def test_paused_etcd_is_unreachable_within_the_command_timeout(self):
        url = SERVER_URL.replace("command_timeout=500ms", "command_timeout=1s")
        self.assertIn("command_timeout=1s", url)
        SERVER._signal(signal.SIGSTOP)
        try:
            t = time.monotonic()
            rc, doc, err = self.check(store=url, timeout=30)
            elapsed = time.monotonic() - t
        finally:
            SERVER._signal(signal.SIGCONT)
        figure("paused etcd check", elapsed, 1.0 + 3.0)
        self.assertEqual(rc, EXIT_UNAVAILABLE, json.dumps(doc, indent=1) + err)
        self.assertEqual(doc["verdict"], "unreachable")
        self.assertLess(elapsed, 1.0 + 3.0)


class Zk2000Store(chaos.ZkStore):
    """A standalone ZooKeeper as chaos.ZkStore starts it, but with tickTime 2000 and the default
    session bounds (2 and 20 ticks: 4 s and 40 s), conf in the 4lw whitelist, and no proxy."""

    def start(self, run_dir):
        self.run_dir = run_dir
        self.dir = tempfile.mkdtemp(prefix="leasehold-check-zk2000-")
        os.makedirs(os.path.join(self.dir, "data"))
        self.port = chaos.free_port()
        while self.port in (2181, 2888, 3888, 8080):
            self.port = chaos.free_port()
        with open(os.path.join(self.dir, "zoo.cfg"), "w") as f:
            f.write(f"tickTime=2000\ninitLimit=10\nsyncLimit=5\n"
                    f"dataDir={self.dir}/data\nclientPort={self.port}\n"
                    "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
                    "4lw.commands.whitelist=ruok,srvr,conf\nmaxClientCnxns=0\n"
                    "preAllocSize=1024\n")
        with open(os.path.join(self.dir, "log4j.properties"), "w") as f:
            f.write("log4j.rootLogger=WARN, CONSOLE\n"
                    "log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n"
                    "log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n"
                    "log4j.appender.CONSOLE.layout.ConversionPattern=%d %-5p %c{1} - %m%n\n")
        self._launch()

    def url(self):
        return f"zk://127.0.0.1:{self.port}/check"

    def stop(self):
        try:
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log_f.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@only("zk")
class ZkCheckTest(CheckHarness, unittest.TestCase):
    """ZooKeeper clamps a session timeout (the TTL) to [minSessionTimeout, maxSessionTimeout]:
    the chaos ZkStore (tickTime 100, max 120 s, srvr only in the 4lw whitelist) and a second
    server with tickTime 2000 (4 s .. 40 s, conf whitelisted) started once for the class."""

    zk2000 = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.zk2000 = Zk2000Store()
        t = time.monotonic()
        try:
            cls.zk2000.start(SERVER.run_dir_)
        except SystemExit as e:
            cls.zk2000 = None
            raise AssertionError(f"the tickTime-2000 ZooKeeper did not start: {e}") from None
        figure("zk tickTime=2000 start", time.monotonic() - t, 60.0)

    @classmethod
    def tearDownClass(cls):
        if cls.zk2000 is not None:
            cls.zk2000.stop()
            cls.zk2000 = None
        super().tearDownClass()

    def test_healthy_reports_bounds_mode_and_acl(self):
        rc, doc, err = self.check()
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        self.assertEqual(doc["round_trip"]["probe"], "exists (missing node)")
        self.assert_item(doc, "session", "warn",
                         "the server grants session timeouts (TTLs) in [200ms, 2m0s]")
        # conf is not in this server's whitelist: no tickTime, so no granularity.
        self.assert_item(doc, "session", "warn", "tickTime could not be read")
        self.assertEqual(doc["ttl"]["granularity_ms"], 0)
        self.assert_item(doc, "topology", "warn", "is standalone: no fault tolerance")
        self.assert_item(doc, "permissions", "pass", "grants world:anyone cdrwa")
        self.assert_item(doc, "durability", "pass", "czxids")

    def test_tick_2000_grants_a_2s_ttl_as_4s(self):
        rc, doc, err = self.check("--ttl", "2s", store=self.zk2000.url())
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        self.assertEqual(doc["cycle"]["ttl_requested_ms"], 2000)
        self.assertEqual(doc["cycle"]["ttl_granted_ms"], 4000, doc)
        item = self.assert_item(doc, "session", "warn", "a TTL of 2s is granted as 4s")
        self.assertIn("ask for 4s", item["fix"])
        self.assert_item(doc, "session", "pass",
                         "the server grants session timeouts (TTLs) in [4s, 40s], in ticks of 2s")
        self.assertEqual(doc["ttl"]["granularity_ms"], 2000)
        self.assertEqual(doc["ttl"]["recommended_ms"] % 2000, 0, doc["ttl"])
        # No advice below what the server grants: minSessionTimeout, 4 s.
        self.assertGreaterEqual(doc["ttl"]["min_ms"], 4000, doc["ttl"])
        self.assertGreaterEqual(doc["ttl"]["recommended_ms"], 4000, doc["ttl"])
        self.assert_item(doc, "durability", "pass", "czxids")
        text = self.cli("check", "--ttl", "2s", "--store", self.zk2000.url(), store=False)
        self.assertIn("a TTL of 2s is granted as 4s", text.stdout)

    def test_paused_zookeeper_is_unreachable_within_the_connect_timeout(self):
        url = SERVER_URL + "?connect_timeout=1s&command_timeout=1s"
        SERVER._signal(signal.SIGSTOP)
        try:
            t = time.monotonic()
            rc, doc, err = self.check(store=url, timeout=30)
            elapsed = time.monotonic() - t
        finally:
            SERVER._signal(signal.SIGCONT)
        figure("paused zk check", elapsed, 1.0 + 3.0)
        self.assertEqual(rc, EXIT_UNAVAILABLE, json.dumps(doc, indent=1) + err)
        self.assertEqual(doc["verdict"], "unreachable")
        self.assertLess(elapsed, 1.0 + 3.0)


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
