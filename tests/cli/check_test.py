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
import socket
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
# A paused store must be "unreachable" within its timeout: the bound is the timeout plus this, for
# two process starts on a busy machine (a check that hangs takes far longer: libpq's cancel of a
# stopped server blocks until it resumes, a client without a bound forever).
SLACK_S = 8.0


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

    def check_paused(self, what, pause, resume, url, timeout_s):
        """Runs `check` on `url` while the store is paused (pause(), then resume() whatever
        happens): it must say "unreachable" (exit 69) within the store's timeout `timeout_s` plus
        SLACK_S. Returns the report."""
        pause()
        try:
            t = time.monotonic()
            rc, doc, err = self.check(store=url, timeout=60)
            elapsed = time.monotonic() - t
        finally:
            resume()
        figure(f"check of a paused {what}", elapsed, timeout_s + SLACK_S)
        self.assertEqual(rc, EXIT_UNAVAILABLE, json.dumps(doc, indent=1) + err)
        self.assertEqual(doc["verdict"], "unreachable")
        self.assertLess(elapsed, timeout_s + SLACK_S)
        return doc

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
        self.assertEqual(r.returncode, 1, r.stderr)  # free
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

    def test_short_ttls_are_judged_by_the_rule_and_the_one_second_floor(self):
        if STORE in ("etcd", "zk"):
            self.skipTest("the store grants short TTLs as longer ones: see its own class")
        # Shorter than the cycle itself: the grant expires within it.
        rc, doc, err = self.check("--ttl", "1ms")
        self.assertEqual(rc, EXIT_UNSAFE, json.dumps(doc, indent=1) + err)
        self.assertFalse(doc["ttl"]["safe"], doc)
        # Under 1 s: a warning if it meets 10x the p99 measured (nearly always), else unsafe;
        # judged from the report's own figures, not from a guess about the machine.
        rc, doc, err = self.check("--ttl", "900ms")
        p99 = max(doc["round_trip"]["p99_ms"], doc["cycle"]["renew"]["p99_ms"])
        if 10 * p99 <= 900:
            self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
            self.assertTrue(doc["ttl"]["safe"], doc)
            item = self.assert_item(doc, "ttl", "warn", "--ttl 900ms meets the rule")
            self.assertIn("--ttl 1s --renew-every 333ms", item["fix"])
        else:
            self.assertEqual(rc, EXIT_UNSAFE, json.dumps(doc, indent=1) + err)
            self.assert_item(doc, "ttl", "unsafe", "--ttl 900ms is too short")

    def test_a_store_that_cannot_be_opened_is_unreachable_and_its_password_is_masked(self):
        port = cli_harness.free_port()  # nothing listens there
        for url in (f"redis://app:s3cret-pw@127.0.0.1:{port}",
                    f"postgres://app:s3cret-pw@127.0.0.1:{port}/db?connect_timeout=2"):
            for json_flag in ([], ["--json"]):
                r = self.cli("check", "--store", url, *json_flag, store=False)
                self.assertEqual(r.returncode, EXIT_UNAVAILABLE, (url, r.stdout, r.stderr))
                self.assertNotIn("s3cret-pw", r.stdout + r.stderr, url)
                self.assertIn("unreachable", r.stdout, url)

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

    def test_healthy_file_is_wal_full_on_a_local_disk_private_and_writable(self):
        rc, doc, err = self.check()
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        self.assertEqual(doc["round_trip"]["probe"], "BEGIN IMMEDIATE/COMMIT")
        self.assert_item(doc, "durability", "pass", "journal_mode wal, synchronous FULL")
        if fs_type(self.tmp) not in ("tmpfs", "ramfs"):
            self.assert_item(doc, "durability", "pass", "is on a local file system")
        # A file made by an explicit URL is private to its owner: check says so (a warning);
        # the host-wide store passes (tests/cli/scope_test.py).
        self.assert_item(doc, "topology", "warn", "this user on this host")
        self.assertEqual(doc["scope"], "this user on this host")
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
        self.args = args
        self.start()

    def start(self):
        args = self.args
        dir = self.dir
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

    def kill9_and_restart(self):
        """kill -9, then the same server again on its port and dir at once (a supervisor)."""
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.start()

    def cli(self, *args):
        r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip()

    def url(self, userinfo="", query=""):
        return f"redis://{userinfo}127.0.0.1:{self.port}{query}"

    def fill_memory(self):
        """Writes cache keys (100 KB, then 64 bytes) until the server refuses one for its
        maxmemory, then lowers maxmemory to 64 KB under what is used: nothing more fits.
        Returns the open connection."""
        c = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        f = c.makefile("rb")
        for size, count in ((100_000, 200), (64, 5000)):
            for i in range(count):
                value = b"c" * size
                name = b"cache:%d:%d" % (size, i)
                c.sendall(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"
                          % (len(name), name, len(value), value))
                if f.readline().startswith(b"-OOM"):
                    break
            else:
                c.close()
                raise AssertionError(f"{count} keys of {size} bytes fitted: no maxmemory?")
        # A refused write leaves a few KB that closing buffers give back; the limit just under
        # what is used keeps the memory full for the next client.
        used = int(re.search(r"used_memory:(\d+)", self.cli("INFO", "memory")).group(1))
        self.cli("CONFIG", "SET", "maxmemory", str(used - 65536))
        return c

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

    def test_a_master_without_persistence_wipes_its_replicas_when_restarted(self):
        off = ("--save", "", "--appendonly", "no")
        master = self.server(*off)
        replica = self.server(*off, "--replicaof", "127.0.0.1", str(master.port))
        self.wait_for(lambda: "connected_slaves:1" in master.cli("INFO", "replication"),
                      "the replica connects")
        rc, doc, err = self.check(store=master.url())
        self.assertEqual(rc, EXIT_UNSAFE, json.dumps(doc, indent=1) + err)
        item = self.assert_item(doc, "durability", "unsafe", "copy the empty dataset")
        self.assertIn("1 replica(s)", item["found"])
        self.assertIn("never restart a master without persistence", item["fix"])
        # The negative control: what the finding warns of. The check left its fencing counter;
        # once the replica has it, kill -9 and restart the master at once: the replica resyncs
        # from the empty master and loses the counter too.
        keys = int(master.cli("DBSIZE"))
        self.assertGreater(keys, 0)
        self.wait_for(lambda: int(replica.cli("DBSIZE") or 0) == keys, "the replica has the keys")
        t0 = time.monotonic()
        master.kill9_and_restart()
        restart_ms = (time.monotonic() - t0) * 1000
        self.wait_for(lambda: "master_link_status:up" in replica.cli("INFO", "replication")
                      and int(replica.cli("DBSIZE") or -1) == 0,
                      "the replica resyncs with the restarted master", timeout=20)
        print(f"\n  [figure] persistence-off master restarted in {restart_ms:.0f} ms: replica "
              f"keys {keys} -> 0", file=sys.stderr)

    def wait_for(self, pred, what, timeout=10):
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                self.fail(f"timed out waiting: {what}")
            time.sleep(0.05)

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

    def test_an_evicting_policy_is_unsafe_and_open_refuses_it_unless_the_url_accepts_it(self):
        # Redis as a cache: with maxmemory set, every policy but noeviction can drop a grant
        # (volatile-*: they carry a TTL) or a fencing counter too (allkeys-*).
        for policy in ("volatile-ttl", "volatile-lru", "allkeys-lru", "allkeys-random"):
            with self.subTest(policy=policy):
                server = self.server(*AOF_ALWAYS, "--maxmemory", "8mb",
                                     "--maxmemory-policy", policy)
                rc, doc, err = self.check(store=server.url())
                self.assertEqual(rc, EXIT_UNSAFE, json.dumps(doc, indent=1) + err)
                self.assertEqual(doc["store"], server.url())
                item = self.assert_item(doc, "eviction", "unsafe",
                                        f"maxmemory-policy {policy} with maxmemory 8388608")
                self.assertIn("noeviction", item["fix"])
                self.assertTrue(doc["cycle"]["done"], doc)

                keys = server.cli("DBSIZE")  # the check's fencing counter
                run = self.cli("run", "--store", server.url(), "job", "--", "true", store=False)
                self.assertEqual(run.returncode, EXIT_UNSAFE, run.stdout + run.stderr)
                self.assertIn(f"may evict leases (maxmemory-policy {policy}", run.stderr)
                self.assertIn("accept_eviction=true", run.stderr)
                self.assertEqual(server.cli("DBSIZE"), keys)  # nothing was written

                run = self.cli("run", "--store", server.url(query="?accept_eviction=true"),
                               "job", "--", "true", store=False)
                self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
                self.assertIn("may evict leases", run.stderr)
                server.stop()

    def test_noeviction_or_no_maxmemory_passes_and_a_full_memory_refuses_an_acquire(self):
        server = self.server(*AOF_ALWAYS, "--maxmemory", "8mb", "--maxmemory-policy",
                             "noeviction")
        rc, doc, err = self.check(store=server.url())
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        self.assert_item(doc, "eviction", "pass", "noeviction: when memory is full")
        # Fill the memory: the acquire fails closed (69, out of memory), nothing is granted.
        filler = server.fill_memory()
        self.addCleanup(filler.close)
        run = self.cli("run", "--store", server.url(query="?connect_timeout=1s"), "job",
                       "--wait", "1s", "--", "true", store=False)
        self.assertEqual(run.returncode, EXIT_UNAVAILABLE, run.stdout + run.stderr)
        self.assertIn("out of memory", run.stderr)
        self.assertEqual(server.cli("KEYS", "leasehold:{6a6f62}*"), "")  # hex("job")
        server.stop()

        server = self.server(*AOF_ALWAYS, "--maxmemory-policy", "allkeys-lru")
        rc, doc, err = self.check(store=server.url())
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        self.assert_item(doc, "eviction", "pass", "no maxmemory: Redis evicts nothing")

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
        self.assert_item(doc, "eviction", "warn", "could not be read")
        self.assert_item(doc, "topology", "warn", "could not be read")

    def test_paused_server_is_unreachable_within_the_connect_timeout(self):
        server = self.server(*AOF_ALWAYS)
        url = server.url(query="?connect_timeout=1s&command_timeout=1s")
        doc = self.check_paused("redis", lambda: server.proc.send_signal(signal.SIGSTOP),
                                lambda: server.proc.send_signal(signal.SIGCONT), url, 1.0)
        self.assert_item(doc, "connect", "unreachable", "bounded by connect_timeout, 1s")


# --- PostgreSQL (both modes) ------------------------------------------------------------------


_PG_SEQ = [0]


def pg_name(prefix):
    """A role or schema name no other test (or run on the same server) uses."""
    _PG_SEQ[0] += 1
    return f"{prefix}_{os.getpid()}_{_PG_SEQ[0]}"


def pg_url(user="postgres", port=None, **params):
    """SERVER_URL as `user`, on `port` (default the server's), with leasehold's or libpq's
    parameters added."""
    base, _, query = SERVER_URL.partition("?")
    base = base.replace("//postgres@", f"//{user}@", 1)
    if port is not None:
        base = base.replace(f":{SERVER.port}/", f":{port}/", 1)
    pairs = [q for q in query.split("&") if q] + [f"{k}={v}" for k, v in params.items()]
    return base + ("?" + "&".join(pairs) if pairs else "")


def pg_set_system(setting, value):
    """ALTER SYSTEM SET setting = value and reload; returns once new sessions see it (bounded)."""
    SERVER._psql(f"ALTER SYSTEM SET {setting} = {value}")
    SERVER._psql("SELECT pg_reload_conf()")
    for _ in range(100):
        if SERVER._psql(f"SHOW {setting}").strip() == value:
            return
        time.sleep(0.05)
    raise AssertionError(f"{setting} did not become {value} after pg_reload_conf()")


class PgBouncer:
    """PgBouncer 1.18 in transaction pooling in front of the check's server, as
    tests/testing/postgres_server.cc starts it (trust auth, a throwaway directory, a free
    loopback port), run as the `postgres` OS user when the harness is root (pgbouncer refuses
    root). Started by the test that needs it; stop() in its finally."""

    BIN = "/usr/sbin/pgbouncer"

    def __init__(self):
        import pwd
        self.dir = tempfile.mkdtemp(prefix="leasehold-check-pgbouncer-")
        self.port = cli_harness.free_port()
        user = None
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            user = "postgres"
        with open(os.path.join(self.dir, "users.txt"), "w") as f:
            f.write('"postgres" ""\n')
        with open(os.path.join(self.dir, "pgbouncer.ini"), "w") as f:
            f.write(f"[databases]\n* = host=127.0.0.1 port={SERVER.port}\n[pgbouncer]\n"
                    f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
                    f"auth_type = trust\nauth_file = {self.dir}/users.txt\n"
                    f"pool_mode = transaction\nmax_client_conn = 100\ndefault_pool_size = 10\n"
                    f"ignore_startup_parameters = extra_float_digits\n"
                    f"logfile = {self.dir}/pgbouncer.log\n")
        self.log = open(os.path.join(self.dir, "pgbouncer.out"), "wb")
        self.proc = subprocess.Popen([self.BIN, os.path.join(self.dir, "pgbouncer.ini")],
                                     stdout=self.log, stderr=self.log, user=user, cwd=self.dir,
                                     start_new_session=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self.proc.poll() is None:
            r = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                                "-d", "postgres", "-X", "-q", "-A", "-t", "-c", "SELECT 1"],
                               capture_output=True, text=True, timeout=10)
            if r.returncode == 0:
                return
            time.sleep(0.1)
        self.stop()
        raise AssertionError("pgbouncer did not come up")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class PgStandby:
    """A streaming standby of the check's server (pg_basebackup -R), on a free loopback port, run
    as the `postgres` OS user when the harness is root, in a throwaway directory. Returns once
    the server shows it streaming (bounded); stop() in the test's finally."""

    def __init__(self):
        import pwd
        self.dir = tempfile.mkdtemp(prefix="leasehold-check-standby-")
        user = None
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            user = "postgres"
        data = os.path.join(self.dir, "data")
        r = subprocess.run([f"{chaos.PG_BIN}/pg_basebackup", "-h", "127.0.0.1", "-p",
                            str(SERVER.port), "-U", "postgres", "-D", data, "-R", "-X", "stream"],
                           capture_output=True, text=True, timeout=60, user=user, cwd=self.dir)
        if r.returncode != 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise AssertionError(f"pg_basebackup failed: {r.stderr.strip()}")
        self.port = cli_harness.free_port()
        self.log = open(os.path.join(self.dir, "pg.log"), "wb")
        # max_connections as the primary's (a standby may not have fewer).
        self.proc = subprocess.Popen(
            [f"{chaos.PG_BIN}/postgres", "-D", data, "-p", str(self.port), "-c",
             "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.dir}", "-c",
             "max_connections=200", "-c", "shared_buffers=32MB"],
            stdout=self.log, stderr=self.log, user=user, cwd=self.dir, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            if SERVER._psql("SELECT count(*) FROM pg_stat_replication "
                            "WHERE state = 'streaming'").strip() == "1":
                return
            time.sleep(0.1)
        self.stop()
        raise AssertionError("the standby did not start streaming")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        # Gone from the server's view too before the next test counts standbys.
        for _ in range(100):
            if SERVER._psql("SELECT count(*) FROM pg_stat_replication").strip() == "0":
                break
            time.sleep(0.1)


class PostgresChecks(CheckHarness):
    """What `leasehold check` finds on PostgreSQL, in both modes (the mode comes from the store:
    postgres or postgres-table). The module turned fsync on for these runs (setUpModule)."""

    TABLE = False

    def test_healthy_server_reports_durability_topology_and_permissions(self):
        rc, doc, err = self.check()
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        self.assertEqual(doc["round_trip"]["probe"], "SELECT 1")
        self.assert_item(doc, "durability", "pass",
                         "fsync on, synchronous_commit on, full_page_writes on")
        self.assert_item(doc, "topology", "pass", "a primary (not in recovery)")
        if self.TABLE:
            self.assert_item(doc, "topology", "pass", "pooler-safe")
        else:
            self.assert_item(doc, "topology", "pass", "a server session of its own")
        self.assert_item(doc, "topology", "warn", "no standby streams from this server")
        self.assert_item(doc, "permissions", "pass", 'role "postgres" has USAGE on schema')

    def test_role_without_create_and_no_table_is_77_naming_create(self):
        role = pg_name("nocreate")
        SERVER._psql(f"CREATE ROLE {role} LOGIN")
        # A schema that does not exist (CREATE on the database needed) and one that exists with
        # USAGE but no CREATE (CREATE on the schema needed), neither with a table.
        existing = pg_name("bare")
        SERVER._psql(f"CREATE SCHEMA {existing}; GRANT USAGE ON SCHEMA {existing} TO {role}")
        for schema in (pg_name("absent"), existing):
            rc, doc, err = self.check(store=pg_url(role, schema=schema))
            self.assertEqual(rc, EXIT_PERMISSION, (schema, json.dumps(doc, indent=1), err))
            self.assertEqual(doc["verdict"], "permission")
            denied = [i for i in doc["items"] if i["verdict"] == "permission"]
            self.assertTrue(denied, doc)
            self.assertIn("CREATE", denied[0]["found"], denied[0])
            self.assertIn("leasehold schema", denied[0]["found"], denied[0])

    def test_role_without_table_privileges_is_77_naming_the_grant(self):
        schema = pg_name("granted")
        rc, doc, err = self.check(store=pg_url(schema=schema))  # the superuser makes the tables
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        role = pg_name("noprivs")
        SERVER._psql(f"CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA {schema} TO {role}; "
                     f"GRANT SELECT ON {schema}.records TO {role}")
        rc, doc, err = self.check(store=pg_url(role, schema=schema))
        self.assertEqual(rc, EXIT_PERMISSION, json.dumps(doc, indent=1) + err)
        item = self.assert_item(doc, "permissions", "permission",
                                f'role "{role}" lacks SELECT, INSERT, UPDATE on "{schema}".leases')
        self.assertEqual(item["fix"],
                         f'GRANT SELECT, INSERT, UPDATE ON "{schema}".leases TO "{role}"')
        self.assert_item(doc, "permissions", "permission",
                         f'role "{role}" lacks INSERT, UPDATE on "{schema}".records')
        # The cycle's refused acquire names every GRANT the role needs.
        acquire = self.assert_item(doc, "permissions", "permission", "acquire failed")
        self.assertIn(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"', acquire["fix"])
        self.assertFalse(doc["cycle"]["done"])

        SERVER._psql(f"GRANT SELECT, INSERT, UPDATE ON {schema}.leases, {schema}.records "
                     f"TO {role}")
        rc, doc, err = self.check(store=pg_url(role, schema=schema))
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        self.assert_item(doc, "permissions", "pass", f'role "{role}" has USAGE')

    def test_synchronous_commit_off_for_the_role_is_unsafe(self):
        # Per role: the setting leasehold's sessions really run with, and no reload.
        role = pg_name("async")
        SERVER._psql(f"CREATE ROLE {role} LOGIN; GRANT CREATE ON DATABASE postgres TO {role}; "
                     f"ALTER ROLE {role} SET synchronous_commit = off")
        rc, doc, err = self.check(store=pg_url(role, schema=pg_name("async")))
        self.assertEqual(rc, EXIT_UNSAFE, json.dumps(doc, indent=1) + err)
        item = self.assert_item(doc, "durability", "unsafe", "synchronous_commit is off")
        self.assertIn("reuse a fencing token", item["found"])
        self.assertIn("synchronous_commit", item["fix"])
        self.assertTrue(doc["cycle"]["done"], doc)  # leases work; fencing is what is at risk

    def test_fsync_off_is_unsafe(self):
        pg_set_system("fsync", "off")
        try:
            rc, doc, err = self.check()
        finally:
            pg_set_system("fsync", "on")
        self.assertEqual(rc, EXIT_UNSAFE, json.dumps(doc, indent=1) + err)
        item = self.assert_item(doc, "durability", "unsafe", "fsync is off")
        self.assertIn("a crash of the server host can lose or corrupt grants and fencing "
                      "counters", item["found"])
        self.assertIn("fsync = on", item["fix"])

    def test_paused_server_is_unreachable_within_the_connect_timeout(self):
        connect_timeout = 2  # libpq's least: it takes 1 as 2
        url = pg_url(connect_timeout=connect_timeout, command_timeout="1s")
        doc = self.check_paused("postgres", lambda: SERVER._signal(signal.SIGSTOP),
                                lambda: SERVER._signal(signal.SIGCONT), url, connect_timeout)
        self.assert_item(doc, "connect", "unreachable", "timeout")

    def test_a_standby_is_unsafe_and_an_asynchronous_one_is_a_warning(self):
        rc, doc, err = self.check()  # the tables exist before the base backup copies them
        self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
        standby = PgStandby()
        try:
            rc, doc, err = self.check()
            self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
            item = self.assert_item(doc, "topology", "warn",
                                    "1 standby(s), none of which confirms leasehold's commits")
            self.assertIn("fencing tokens still only grow", item["found"])
            self.assertIn("synchronous_standby_names", item["fix"])
            self.assert_item(doc, "topology", "pass", "timeline 1, system identifier ")
            if not self.TABLE:
                self.assert_item(doc, "topology", "warn", "advisory locks are not replicated")
            # The same standby, synchronous: every grant waits for it.
            SERVER._psql("ALTER SYSTEM SET synchronous_standby_names = '*'")
            SERVER._psql("SELECT pg_reload_conf()")
            try:
                for _ in range(100):  # bounded: the standby reports sync at its next reply
                    if SERVER._psql("SELECT count(*) FROM pg_stat_replication "
                                    "WHERE sync_state = 'sync'").strip() == "1":
                        break
                    time.sleep(0.05)
                rc, doc, err = self.check()
            finally:
                SERVER._psql("ALTER SYSTEM RESET synchronous_standby_names")
                SERVER._psql("SELECT pg_reload_conf()")
            self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
            self.assert_item(doc, "topology", "pass", "1 standby(s), 1 synchronous")
            rc, doc, err = self.check(store=pg_url(port=standby.port))
        finally:
            standby.stop()
        self.assertEqual(rc, EXIT_UNSAFE, json.dumps(doc, indent=1) + err)
        item = self.assert_item(doc, "topology", "unsafe", "is a standby (pg_is_in_recovery())")
        self.assertIn("primary", item["fix"])
        self.assertFalse(doc["cycle"]["done"], doc)  # it refuses the grant's write
        self.assertFalse([i for i in self.items(doc, "topology") if "standby streams" in i["found"]])

    def test_through_pgbouncer(self):
        bouncer = PgBouncer()
        try:
            url = pg_url(port=bouncer.port, schema=pg_name("pooled"))
            if self.TABLE:
                rc, doc, err = self.check(store=url)
                self.assertEqual(rc, 0, json.dumps(doc, indent=1) + err)
                self.assert_item(doc, "topology", "pass", "through a connection pooler")
                self.assert_item(doc, "topology", "pass", "pooler-safe")
                self.assertTrue(doc["cycle"]["done"], doc)
            else:
                # Advisory mode refuses a pooler when the store opens, as every command does:
                # a usage error naming the pooler and mode=table, not a report.
                r = self.cli("check", "--store", url, store=False)
                self.assertEqual(r.returncode, EXIT_USAGE, r.stdout + r.stderr)
                self.assertIn("connection pooler", r.stderr)
                self.assertIn("mode=table", r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        finally:
            bouncer.stop()


@only("postgres")
class PostgresCheckTest(PostgresChecks, unittest.TestCase):
    TABLE = False


@only("postgres-table")
class PostgresTableCheckTest(PostgresChecks, unittest.TestCase):
    TABLE = True


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
        self.check_paused("etcd", lambda: SERVER._signal(signal.SIGSTOP),
                          lambda: SERVER._signal(signal.SIGCONT), url, 1.0)


class Zk2000Store(chaos.ZkStore):
    """A standalone ZooKeeper as chaos.ZkStore starts it, but with tickTime 2000 and the default
    session bounds (2 and 20 ticks: 4 s and 40 s), conf in the 4lw whitelist, and no proxy."""

    TICK_MS = 2000
    FOUR_LETTER_WORDS = "ruok,srvr,conf"
    EXTRA_CFG = ""
    DIR_PREFIX = "leasehold-check-zk2000-"

    def start(self, run_dir):
        self.run_dir = run_dir
        self.configure()
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
        self.check_paused("zk", lambda: SERVER._signal(signal.SIGSTOP),
                          lambda: SERVER._signal(signal.SIGCONT), url, 1.0)


@only("redis")
class HeadroomWarningTest(CheckHarness, unittest.TestCase):
    """The run-time half of the rule: `leasehold run` warns (once, rate-limited) when the
    heartbeat's p99 round trip exceeds a tenth of the TTL, and counts it in /metrics; silent
    otherwise. The store is reached through the chaos fault proxy, which, once the command has
    started, holds every reply for 600 ms in the slow case: 3x the threshold of a 2 s TTL
    (200 ms). Not 5x: renewals are serial, so a round trip of ttl/2 (1 s here) loses the lease
    (each round confirms a send one round trip old: safe_until = t_send + 1.98 s, the next reply
    comes at t_send + 2 s). At 600 ms the lease stays held: a round confirms every ~667 ms, each
    a send 1.27 s after the one before; --kill-grace 100ms puts the SIGTERM at safe_until -
    100 ms = t_send + 1.88 s, 0.6 s after the next confirmation (the default 500 ms grace would
    leave 0.2 s: too little for a busy machine)."""

    TTL = "2s"
    DELAY_S = 0.6

    def store_url(self):
        return SERVER.url()  # through the proxy

    def tearDown(self):
        SERVER.proxy.mode = "pass"
        super().tearDown()

    def run_job(self, delay):
        port = cli_harness.free_port()
        run = self.start("run", "--ttl", self.TTL, "--kill-grace", "100ms", "--metrics-addr",
                         f"127.0.0.1:{port}", f"headroom-{delay}", "--", "sleep", "9")
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
    if STORE.startswith("postgres"):
        # The chaos server runs with fsync=off (its host never crashes), which the check rightly
        # calls unsafe: these runs judge a server with the default (on), which ALTER SYSTEM can
        # then turn off for the test that wants it.
        store.fsync = None
    t = time.monotonic()
    try:
        store.start(run_dir)
    except SystemExit as e:  # chaos's starters exit with a message
        # tearDownModule does not run after a failed setUpModule: stop what did start.
        try:
            store.stop()
        except Exception:  # noqa: BLE001 (a half-started store: best effort)
            pass
        shutil.rmtree(run_dir, ignore_errors=True)
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
    # The sqlite store lives in each test's temp dir, and a file on tmpfs is (rightly) reported
    # unsafe: its fencing counters end at a reboot. Keep the temp dirs on a disk.
    if fs_type(tempfile.gettempdir()) in ("tmpfs", "ramfs") and os.path.isdir("/var/tmp"):
        tempfile.tempdir = "/var/tmp"
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
