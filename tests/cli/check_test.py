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
    """Runs the class's tests only with --store `store`. Judged in setUp, not when the class is
    defined: main() sets STORE after this module (and its decorators) has run."""

    def wrap(cls):
        set_up = cls.setUp

        def setUp(self):
            if STORE != store:
                self.skipTest(f"--store {store} only")
            set_up(self)

        cls.setUp = setUp
        return cls

    return wrap


def fs_type(path):
    """The file system type name of path (`stat -f -c %T`), or None."""
    r = subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


@only("sqlite")
class SqliteCheckTest(CheckHarness, unittest.TestCase):
    """The file's durability (WAL, synchronous FULL, the file system), its single-host topology
    and its permissions."""

    def setUp(self):
        self.undo = []  # run by kill_leftovers, before tearDown removes the temp dir
        super().setUp()

    def kill_leftovers(self):
        for undo in reversed(self.undo):
            undo()

    def db(self):
        return os.path.join(self.tmp, "leases.db")

    def immutable(self, path):
        """Makes path unwritable even for root (chattr +i; chmod for another user), undone in
        tearDown; skips the test where neither can be done here."""
        if os.geteuid() != 0:
            mode = os.stat(path).st_mode
            os.chmod(path, 0o500 if os.path.isdir(path) else 0o400)
            self.undo.append(lambda: os.chmod(path, mode))
            return
        # root passes every mode check (access(2) says yes): only the immutable flag (or a
        # read-only mount) refuses it.
        r = subprocess.run(["chattr", "+i", path], capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest(f"chattr +i is not available here: {r.stderr.strip()}")
        self.undo.append(lambda: subprocess.run(["chattr", "-i", path], capture_output=True))

    def test_healthy_file_is_wal_full_on_a_local_disk_single_host_and_writable(self):
        rc, doc, err = self.check()
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        self.assertEqual(doc["round_trip"]["probe"], "BEGIN IMMEDIATE/COMMIT")
        self.assert_item(doc, "durability", "pass", "journal_mode wal, synchronous FULL")
        if fs_type(self.tmp) not in ("tmpfs", "ramfs"):
            self.assert_item(doc, "durability", "pass", "is on a local file system")
        self.assert_item(doc, "topology", "pass", "single host")
        self.assert_item(doc, "permissions", "pass", "and its directory are writable")

    def test_file_on_tmpfs_is_unsafe_its_fencing_counters_end_at_a_reboot(self):
        if fs_type("/dev/shm") != "tmpfs":
            self.skipTest("/dev/shm is not a tmpfs here")
        shm = tempfile.mkdtemp(prefix="leasehold-check-", dir="/dev/shm")
        self.addCleanup(shutil.rmtree, shm, True)
        url = "sqlite://" + os.path.join(shm, "leases.db")
        rc, doc, err = self.check(store=url)
        self.assertEqual(rc, EXIT_UNSAFE, json.dumps(doc, indent=1) + err)
        item = self.assert_item(doc, "durability", "unsafe", "is on tmpfs")
        self.assertIn("fencing tokens start again at 1", item["found"])
        self.assertIn("local disk file system", item["fix"])
        self.assertTrue(doc["cycle"]["done"], doc)

    def test_unwritable_file_is_permission_denied(self):
        self.immutable(self.db())
        rc, doc, err = self.check()
        self.assertEqual(rc, EXIT_PERMISSION, json.dumps(doc, indent=1) + err)
        self.assertEqual(doc["verdict"], "permission")
        item = self.assert_item(doc, "connect", "permission", self.db())
        self.assertTrue(item["fix"], item)
        text = self.cli("check")
        self.assertEqual(text.returncode, EXIT_PERMISSION, text.stdout + text.stderr)
        self.assertRegex(text.stdout, r"(?m)^connect +permission +.*leases\.db")

    def test_unwritable_directory_is_permission_denied_naming_the_wal_file(self):
        # The file stays writable: only the -wal and -shm files cannot be made beside it.
        self.immutable(self.tmp)
        rc, doc, err = self.check()
        self.assertEqual(rc, EXIT_PERMISSION, json.dumps(doc, indent=1) + err)
        self.assert_item(doc, "connect", "permission", "cannot create its -wal and -shm files")


class RedisServerProcess:
    """A throwaway redis-server with the given settings, on a free loopback port, its data in
    dir; stop() kills it (after a SIGCONT, should a test have paused it)."""

    def __init__(self, dir, *args):
        self.port = chaos.free_port()
        self.dir = dir
        os.makedirs(dir)
        self.log = open(os.path.join(dir, "redis.log"), "ab")
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", dir,
             "--daemonize", "no", *args], stdout=self.log, stderr=self.log,
            start_new_session=True)
        deadline = time.monotonic() + 10
        while self.cli("PING") != "PONG":
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise AssertionError(f"redis-server {args} did not come up on {self.port}")
            time.sleep(0.02)

    def cli(self, *args):
        r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip()

    def url(self, userinfo="", query=""):
        return f"redis://{userinfo}127.0.0.1:{self.port}{query}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.log.close()


AOF_ALWAYS = ("--save", "", "--appendonly", "yes", "--appendfsync", "always")


@only("redis")
class RedisCheckTest(CheckHarness, unittest.TestCase):
    """Persistence settings, an ACL user without evalsha (and the ACL line that fixes it), a
    paused server. Each test starts the servers it needs (RedisServerProcess) in its temp dir."""

    def setUp(self):
        self.servers = []
        super().setUp()

    def kill_leftovers(self):
        for server in self.servers:
            server.stop()

    def server(self, *args):
        s = RedisServerProcess(os.path.join(self.tmp, f"redis-{len(self.servers)}"), *args)
        self.servers.append(s)
        return s

    def test_healthy_server_reports_aof_always_its_version_and_no_replicas(self):
        rc, doc, err = self.check()
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        self.assertEqual(doc["round_trip"]["probe"], "PING")
        self.assert_item(doc, "durability", "pass", "AOF on, appendfsync always")
        item = self.assert_item(doc, "topology", "warn", "no replicas")
        self.assertRegex(item["found"], r"^redis \d+\.\d+\.\d+, a master")
        self.assertIn("min_replicas", item["fix"])

    def test_persistence_off_is_unsafe_fencing_does_not_survive_a_restart(self):
        server = self.server("--save", "", "--appendonly", "no")
        rc, doc, err = self.check(store=server.url())
        self.assertEqual(rc, EXIT_UNSAFE, json.dumps(doc, indent=1) + err)
        self.assertEqual(doc["verdict"], "unsafe")
        self.assertTrue(doc["cycle"]["done"], doc)
        item = self.assert_item(doc, "durability", "unsafe", "fencing does not survive a restart")
        self.assertIn("appendonly yes", item["fix"])
        self.assertIn("appendfsync always", item["fix"])

        text = self.cli("check", "--store", server.url(), store=False)
        self.assertEqual(text.returncode, EXIT_UNSAFE, text.stdout + text.stderr)
        self.assertRegex(text.stdout,
                         r"(?m)^durability +unsafe +.*fencing does not survive a restart")
        self.assertRegex(text.stdout, r"(?m)^FIX  durability: .*appendonly yes")
        self.assertRegex(text.stdout, r"(?m)^verdict +unsafe$")

    def test_each_persistence_setting_is_reported_as_what_a_restart_keeps(self):
        cases = [
            (("--save", "3600 1", "--appendonly", "no"), EXIT_UNSAFE, "unsafe",
             "go back to the last snapshot on restart"),
            (("--save", "", "--appendonly", "yes", "--appendfsync", "everysec"), 0, "pass",
             "about the last second"),
            (("--save", "", "--appendonly", "yes", "--appendfsync", "no"), 0, "warn",
             "appendfsync no"),
            (AOF_ALWAYS, 0, "pass", "appendfsync always"),
        ]
        for args, code, verdict, found in cases:
            with self.subTest(args=args):
                server = self.server(*args)
                rc, doc, err = self.check(store=server.url())
                self.assertEqual(rc, code, json.dumps(doc, indent=1) + err)
                item = self.assert_item(doc, "durability", verdict, found)
                self.assertEqual(bool(item["fix"]), verdict != "pass", item)

    def test_acl_user_without_evalsha_is_named_and_the_fix_is_the_acl_line_that_works(self):
        server = self.server(*AOF_ALWAYS)
        self.assertEqual(server.cli("ACL", "SETUSER", "nolua", "on", ">s3cret-pw", "~*", "&*",
                                    "+@all", "-evalsha"), "OK")
        url = server.url("nolua:s3cret-pw@")
        rc, doc, err = self.check(store=url)
        self.assertEqual(rc, EXIT_PERMISSION, json.dumps(doc, indent=1) + err)
        self.assertEqual(doc["verdict"], "permission")
        self.assertFalse(doc["cycle"]["done"])
        item = self.assert_item(doc, "permissions", "permission", "evalsha")
        fix = item["fix"]
        self.assertTrue(fix.startswith("ACL SETUSER nolua on ~leasehold:* &leasehold:* -@all "),
                        fix)
        self.assertIn("+evalsha", fix.split())
        self.assertNotIn("s3cret-pw", json.dumps(doc))

        text = self.cli("check", "--store", url, store=False)
        self.assertEqual(text.returncode, EXIT_PERMISSION, text.stdout + text.stderr)
        self.assertRegex(text.stdout, r"(?m)^permissions +permission +.*'evalsha'")
        self.assertIn("FIX  permissions: " + fix, text.stdout.splitlines())
        self.assertNotIn("s3cret-pw", text.stdout + text.stderr)

        # The line is exact: a user with nothing but its rules passes the whole check.
        rules = fix[len("ACL SETUSER nolua "):fix.index(" (optional:")].split()
        self.assertEqual(server.cli("ACL", "SETUSER", "lean", "reset", ">pw2", *rules), "OK")
        rc, doc, err = self.check(store=server.url("lean:pw2@"))
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        self.assertTrue(doc["cycle"]["done"], doc)
        self.assertFalse(self.items(doc, "permissions"), doc)
        # What the rules leave out (CONFIG GET, INFO) is said, not guessed.
        self.assert_item(doc, "durability", "warn", "could not be read")
        self.assert_item(doc, "topology", "warn", "could not be read")

    def test_paused_server_is_unreachable_within_the_connect_timeout(self):
        server = self.server(*AOF_ALWAYS)
        timeout = 1.0
        url = server.url(query="?connect_timeout=1s&command_timeout=1s")
        server.proc.send_signal(signal.SIGSTOP)
        try:
            t = time.monotonic()
            rc, doc, err = self.check(store=url, timeout=30)
            elapsed = time.monotonic() - t
        finally:
            server.proc.send_signal(signal.SIGCONT)
        figure("check of a paused redis", elapsed, timeout + 3.0)
        self.assertEqual(rc, EXIT_UNAVAILABLE, json.dumps(doc, indent=1) + err)
        self.assertEqual(doc["verdict"], "unreachable")
        self.assert_item(doc, "connect", "unreachable", "within connect_timeout (1s)")
        self.assertLess(elapsed, timeout + 3.0)


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
