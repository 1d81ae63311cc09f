#!/usr/bin/env python3
"""leasehold safety harness (issue 4): orchestrator, fault injector and checker.

Starts N chaos_worker processes against one store, injects faults for a bounded time, then
reads every worker's event log, the orchestrator's fault log and the fenced register, and
prints one summary line per run:

  chaos: store=<scheme> scenario=<name> handoffs=<n> pauses_gt_ttl=<n> overlaps=<n>
         stale_attempted=<n> stale_accepted=<n> token_regressions=<n> takeover_p99_ms=<n>
         violations=<n>

(on one line), followed by a `chaos-detail:` line with the other figures. Exit status: 0 if
every run is clean; 1 on any safety violation; 2 if a run could not have caught one (no stale
write attempted in a pause scenario: the pauses did not bite) or the harness itself failed.

  --quick                 each scenario for a few seconds (the CTest runs: <= 60 s per store)
  --duration SECONDS      run each chosen scenario this long (long runs by hand)
  --scenario NAME         one of: pause-hot, kill-multi, calm (default: all of the store's)
  --negative-control      run the deliberately unsafe client; exit 0 only if the checker
                          catches it (every control), 1 if it does not
  --check-only DIR        re-run the checker on a kept run directory
  --guard register|native where the workers write (below; default register)
  --limit N               semaphore runs: workers acquire with limit N (below)
  --control NAME          with --negative-control: only this control (repeatable)
  --cli LEASEHOLD         CLI mode (below): the workers are `leasehold run` processes

Guards. register: the fenced register, a SQLite file outside the store (fenced_register.h);
staleness and order come from its own history. native: every write is Lease::Write to data in
the store itself, checked by the store's guard in the write's atomic step (chaos_worker.cc,
NativeWriter: a Put of "chaos-data/<key>", on ZooKeeper the node "/chaos-data-<key>" under the
chroot, on SQL stores an upsert into chaos_data(k, v)); the value is "<token>:<writer>:<seq>".
The checker does not take the worker's word for staleness: a write is stale if its token is
lower than that of a grant of its key whose `acquired` line (another worker's) is older than the
write's t_send (check_native). After each run the data keys are read back with the store's own
client (redis-cli, etcdctl, psql, SQLite itself, zkCli) into native-audit.txt: each key must
hold a value whose token is at least the highest accepted for it (audit_violations otherwise).
The summary line then carries guard=native, and the detail line native_errors, audit=ok (or
skipped/failed) and audit_violations in place of register_order_regressions. A native run in
which no write was accepted (the store lacks Lease::Write) is ineffective (exit 2). With
--negative-control the control is noguard (pause-hot): the library's leases, every write sent
with the store's guard skipped; it must be caught as stale_accepted > 0.

Semaphores (--limit N, N > 1; issue 19). Every worker acquires with LeaseOptions::limit = N
(N + 2 workers unless --workers says otherwise, so that the permits are contended) and logs its
grant's slot. The checker adds, per key: at most N validity windows open at once (over_limit:
grants whose window opened while N others were open), open windows have distinct slots in
0..N-1 (slot_clashes), and no two grants of a key share a fencing token (token_dups); token order
(token_regressions) stays per key, since one counter serves every grant of the key. The summary
line then carries limit=N max_concurrent=<most windows of a key open at once> over_limit=
slot_clashes= token_dups= after the scenario, and `overlaps` counts over_limit + slot_clashes.
A run whose keys never had N windows open at once did not test the limit (exit 2).
The register for N > 1: N holders write at once with different tokens, legitimately, so one
register per key would call every write of a lower-token holder stale. Each slot is an exclusive
lease of its own instead (a live grant's slot is never given to another grant while it lives,
and the key's counter makes the next holder of the slot's token higher), so every holder writes
the register key "<key>#s<slot>" and the register's stale/accepted/order checks apply per slot
unchanged: a paused holder whose slot was retaken must be fenced out by its slot's newer token.
The exclusive checks that compare a grant with the key's later grants compare it with the later
grants of its slot (overlap, foreign release, takeover after a kill: the next grant of the slot).
--guard native with N > 1 is refused: the native data key is the lease's, shared by all N.
With --negative-control and --limit N the first control is overlimit: the library's leases, every
acquire asking for N + 1 while the run is judged by N (what a store whose admission counts one
grant too few would do); it must be caught as over_limit > 0. The exclusive controls follow, at
limit N (nofence: stale writes accepted by a slot's register); --control NAME picks some.

CLI mode (--cli PATH_TO_leasehold, --store sqlite or redis, --quick for the CTest runs) tests
`leasehold run`'s supervision of the command's whole process tree. Each worker wN is

  leasehold run --store URL --ttl TTL --wait 4xTTL --holder wN KEY -- sh -c SCRIPT ...

where SCRIPT starts tests/chaos/fenced_writer.py in the background (the grandchild: a fenced
write into the register with $LEASEHOLD_FENCING_TOKEN every --write-gap-ms, forever, never
checking the lease; it dies only by a signal), sleeps a hold time (--hold-min-ms..--hold-max-ms,
chosen here) and exits 0 WITHOUT stopping the writer. leasehold must stop that leftover before it
releases the lease; kill the whole tree by safe_until when the lease is lost; when leasehold is
kill -9ed, its keeper process kills the tree at once; when leasehold is SIGSTOPped, the keeper
SIGKILLs the tree at safe_until. Defaults: TTL 1000 ms (kill grace 250 ms, renew every 333 ms),
holds 100-1200 ms, 4 workers (an exited one is replaced by a new wN until the end), a fault every
0.5-1.5 x 2 TTL. Scenarios: cli-hot (one key; kill -9 and SIGSTOP 0.5-5 x TTL of a holding
leasehold process, only leasehold's own process: its command lives in another session),
cli-multi (three keys, kill-heavy), cli-calm (no faults). A holder is a live leasehold whose
command has started (its stderr says 'started the command') and whose tree wrote to the register
within the last few gaps. A fenced_writer.py of the run (found by its --register argument in
/proc/*/cmdline) still alive more than 1 s after its leasehold exited is an orphan: counted,
then killed. At the end everything is resumed and killed, writers included. One line per run:

  chaos: store=<s> scenario=cli-<name> grants=<n> writes=<n> stale_attempted=<n>
         stale_accepted=<n> orphans=<n> violations=<n>

violations = stale_attempted + stale_accepted + register order regressions + orphans (why a
stale *attempt* counts: see check_cli). Exit 0 clean, 1 on violations, 2 if ineffective (fewer
than 5 grants, no handoff, no kill or pause injected in a fault scenario). With
--negative-control, cli-hot runs with LEASEHOLD_TEST_UNSAFE_DIRECT_CHILD_ONLY=1 in the workers'
environment (leasehold's test-only switch back to supervising the direct child only); exit 0 only
if the checker flags it (stale_attempted > 0 or orphans > 0), 1 if not ("NOT CAUGHT").
--cli-arg ARG passes one more option to `leasehold run` (before KEY), e.g.
--cli-arg=--contain=pidns (the default, auto, is cgroup when run as root). The chaos-detail line
also gives the containment leasehold reported per grant and cgroups_left: cgroup leaves of exited
leasehold processes still present at the end (reported, not removed; not a violation).

Every time is CLOCK_BOOTTIME in nanoseconds (time.clock_gettime_ns(time.CLOCK_BOOTTIME) here,
leasehold::BootClock in the workers): one clock for every process on the host.

Stores join through a StoreControl: a URL for the workers plus optional server faults (pause,
kill -9 and restart on the same port and data, and a TCP fault proxy between workers and the
server). SqliteStore has no server; RedisStore is the hook for redis://, PostgresStore for
postgres:// (advisory mode), PostgresTableStore for ?mode=table, EtcdStore for etcd:// and
ZkStore for zk:// (see their docstrings). RedisSentinelStore (redis+sentinel://, server fault
master-kill) and RedisClusterStore (redis+cluster://, 3 masters + 3 replicas, server faults
master-kill and reshard of a lease key's hash slot) have no proxy: the workers reach several
servers. Their workers' min_replicas: --sentinel-min-replicas, --cluster-min-replicas (default 1).
PostgresHaStore (postgres-ha, mode=advisory) and PostgresHaTableStore (postgres-ha-table,
mode=table) run two PostgreSQL members under Patroni with a throwaway etcd as its DCS, the workers
on one multi-host URL; server faults switchover, primary-kill and primary-partition, taken in
turn (--pg-ha-faults picks some, and adds standby-cut: the replica's WAL stream cut, then
kill -9 of the primary), replication by --pg-ha-sync on|strict|off (default on). Their default
scenario is store-faults (45 s with --quick); exit 77 when the machine cannot run them (not root,
no nft, patroni, etcd or PostgreSQL 15). See the class's docstring for what the checker should
find. With --store postgres-ha-table --negative-control the control is trustcommit (scenario
failovers: server faults only; 120 s with --quick): the library's leases with unconfirmed commits
trusted, under --pg-ha-sync strict and standby-cut only (8 s cuts), TTL 15 s, holds of 10-30 s
(PG_HA_NEGATIVE_CONTROL); it must be caught as overlaps > 0. --pg-ha-standby-cut-setup runs the
same without the control, the library's side of it: 0 overlaps.

Store faults in the checker. A store may mark a fault `window=1` (its store-fault line): overlaps
whose later grant, and "stolen" grants whose loss, fall between that fault and its end (its last
store-heal/-ready line) + 2 TTL, the earlier grant taken before its heal, are the documented
window of that store (advisory locks are not replicated; an asynchronous standby may lack the
latest commits). They are counted in overlaps=, shown as window_overlaps=, and kept out of
violations; every other overlap or stolen grant is a violation as before. For every fault kind
whose store logs its failovers or marks a window, one line:

  chaos-failover: store=<s> kind=<k> faults=<n> window=0|1 failover_ms p50= max= (n=) ready_ms
                  p50= max= no_grant_ms p50= max= overlaps=<n> overlap_ms p50= max= stolen=<n>

(failover_ms: from the fault to the new primary as the store saw it; ready_ms: from then to the
cluster being whole again; no_grant_ms: the longest stretch without a grant of any key from the
fault to the first grant after its heal; overlaps and stolen: those within that kind's faults,
window or not).
"""

import argparse
import bisect
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import struct
import threading
import statistics
import subprocess
import sys
import tempfile
import time

CLOCK = time.CLOCK_BOOTTIME


def now_ns():
    return time.clock_gettime_ns(CLOCK)


MS = 1_000_000


# ---- stores -------------------------------------------------------------------------------


class StoreControl:
    """How the harness reaches a store and hurts it. Subclasses override what they support."""

    scheme = "?"
    server_faults = ()  # names of the server faults this store supports
    quick_scale = 1.0  # --quick durations times this (stores that start slowly: fewer seconds)

    def start(self, run_dir):
        raise NotImplementedError

    def url(self):
        raise NotImplementedError

    def inject(self, fault, duration_ns, log):  # a server fault: pause, restart, proxy ...
        raise NotImplementedError

    def busy(self):  # a timed server fault is in force
        return False

    def spawn_ready(self):  # False: start no worker now (its Open would give up); later
        return True

    def tick(self, log):  # undo timed server faults whose time has come
        pass

    def heal(self, log):  # undo every fault before the run winds down
        pass

    def stop(self):
        pass

    # --guard native: the data keys the workers write (chaos_worker.cc, NativeWriter), made
    # ready before they start, and read back at the end with the store's own client, not
    # through leasehold (the audit).
    def prepare_native(self, keys):
        pass

    def read_native(self, keys):
        """Returns {key: final value or None}; raises NotImplementedError (with the reason)
        where this store has no audit read."""
        raise NotImplementedError("no audit read for this store")


class SqliteStore(StoreControl):
    """The embedded store: a file shared by the workers, no server to hurt."""

    scheme = "sqlite"

    def start(self, run_dir):
        self.path = os.path.join(run_dir, "leases.db")

    def url(self):
        return "sqlite://" + self.path + "?busy_timeout=10s"

    def read_native(self, keys):
        # Python's sqlite3 module is SQLite itself, reading the store's own file.
        if not os.path.exists(self.path):
            return {k: None for k in keys}
        db = sqlite3.connect(self.path, timeout=10)
        try:
            rows = dict(db.execute("SELECT k, v FROM chaos_data").fetchall())
        except sqlite3.OperationalError:  # no such table: no write was applied
            rows = {}
        finally:
            db.close()
        return {k: rows.get(k) for k in keys}


class FaultProxy:
    """A TCP proxy between workers and a store server, with faults (FACTS.md: no tc netem here).

    Modes: 'pass'; 'blackhole' (stop moving bytes either way while every connection stays
    open: the peers see a silent network, and what was sent arrives after the heal, as TCP
    retransmission would deliver it); 'delay' (each chunk from the server is held for a fixed
    time before it is passed on: a slow reply path). reset() closes every connection with a
    TCP RST (SO_LINGER 0)."""

    def __init__(self, upstream_port):
        self.upstream = ("127.0.0.1", upstream_port)
        self.mode = "pass"
        self.delay_s = 0.0
        self.lock = threading.Lock()
        self.conns = set()
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.port = self.srv.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(self.upstream, timeout=2)
                u.settimeout(None)
            except OSError:
                c.close()
                continue
            # As the peers' own sockets are (libpq, hiredis, gRPC set TCP_NODELAY): without it a
            # request sent in two writes waits here for the server's delayed ACK (~40 ms).
            for s_ in (c, u):
                s_.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.conns.add(c)
                self.conns.add(u)
            threading.Thread(target=self._pump, args=(c, u, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, True), daemon=True).start()

    def _pump(self, src, dst, from_server):
        try:
            while not self.closed:
                data = src.recv(65536)  # blocking: a blackhole holds at most this one chunk
                if not data:
                    break
                if from_server and self.mode == "delay" and self.delay_s > 0:
                    time.sleep(self.delay_s)
                while self.mode == "blackhole" and not self.closed:
                    time.sleep(0.005)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s_ in (src, dst):
                try:
                    s_.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s_.close()
            with self.lock:
                self.conns.discard(src)
                self.conns.discard(dst)

    def reset(self):
        with self.lock:
            conns = list(self.conns)
        for s_ in conns:
            try:
                # SO_LINGER 0: the close in _pump sends RST; SHUT_RD wakes its blocked recv.
                s_.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s_.shutdown(socket.SHUT_RD)
            except OSError:
                pass

    def close(self):
        self.closed = True
        self.srv.close()
        self.reset()


def free_port():
    with socket.socket() as s_:
        s_.bind(("127.0.0.1", 0))
        return s_.getsockname()[1]


class RedisStore(StoreControl):
    """redis://: a throwaway redis-server on a free loopback port in the run directory (never
    6379), AOF with appendfsync always so that grants and fencing counters survive kill -9, and
    the workers reach it through a FaultProxy.

    Server faults: store-pause (SIGSTOP the server for 0.5-3 x TTL), store-restart (kill -9,
    restart on the same port and data), proxy-blackhole (0.5-3 x TTL), proxy-reset,
    proxy-delay (each reply held 0.05-0.5 x TTL, for 1-3 x TTL)."""

    scheme = "redis"
    server_faults = ("store-pause", "store-restart", "proxy-blackhole", "proxy-reset",
                     "proxy-delay")

    def start(self, run_dir):
        self.dir = os.path.join(run_dir, "redis")
        os.makedirs(self.dir)
        self.port = free_port()
        if self.port == 6379:
            self.port = free_port()
        self._launch()
        self.proxy = FaultProxy(self.port)
        self.undo = []  # (t_ns, callable, name)

    def _launch(self):
        self.log_f = open(os.path.join(self.dir, "redis.log"), "ab")
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", self.dir,
             "--save", "", "--appendonly", "yes", "--appendfsync", "always",
             "--daemonize", "no", *self.server_args()], stdout=self.log_f, stderr=self.log_f,
            start_new_session=True)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise SystemExit(f"chaos: redis-server did not come up on port {self.port}")

    def server_args(self):  # more redis-server flags (RedisEvictStore)
        return ()

    def url(self):
        return f"redis://127.0.0.1:{self.proxy.port}?prefix=chaos"

    def read_native(self, keys):
        out = {}
        for k in keys:  # straight to the server, not through the proxy
            out[k] = None
            for name in redis_native_names(k):
                r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port),
                                    "--raw", "GET", name],
                                   capture_output=True, text=True, timeout=20)
                if r.returncode != 0:
                    raise RuntimeError(f"redis-cli GET failed: {r.stderr.strip()}")
                v = r.stdout.rstrip("\n")
                if v:  # --raw prints an empty line for nil
                    out[k] = v
                    break
        return out

    def _signal(self, sig):  # the server process (PostgresStore: its whole process group)
        os.kill(self.proc.pid, sig)

    def inject(self, fault, ttl_ns, orch):
        rng = orch.rng
        t = now_ns()
        if fault == "store-pause":
            dur = int(rng.uniform(0.5, 3.0) * ttl_ns)
            self._signal(signal.SIGSTOP)
            self.undo.append((t + dur, lambda: self._signal(signal.SIGCONT), fault))
        elif fault == "store-restart":
            dur = 0
            self._signal(signal.SIGKILL)
            self.proc.wait()
            self.proxy.reset()
            self._launch()
        elif fault == "proxy-blackhole":
            dur = int(rng.uniform(0.5, 3.0) * ttl_ns)
            self.proxy.mode = "blackhole"
            self.undo.append((t + dur, lambda: setattr(self.proxy, "mode", "pass"), fault))
        elif fault == "proxy-reset":
            dur = 0
            self.proxy.reset()
        elif fault == "proxy-delay":
            dur = int(rng.uniform(1.0, 3.0) * ttl_ns)
            self.proxy.delay_s = rng.uniform(0.05, 0.5) * ttl_ns / 1e9
            self.proxy.mode = "delay"
            self.undo.append((t + dur, lambda: setattr(self.proxy, "mode", "pass"), fault))
        else:
            raise ValueError(fault)
        orch.log("store-fault", kind=fault, dur_ms=dur // MS)
        return True

    def busy(self):
        return bool(self.undo)

    def tick(self, orch):
        t = now_ns()
        for item in list(self.undo):
            if t >= item[0]:
                item[1]()
                self.undo.remove(item)
                orch.log("store-heal", kind=item[2])

    def heal(self, orch):
        for item in list(self.undo):
            item[1]()
            orch.log("store-heal", kind=item[2])
        self.undo.clear()

    def stop(self):
        self.proxy.close()
        try:
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


PG_BIN = "/usr/lib/postgresql/15/bin"


class PostgresStore(RedisStore):
    """postgres:// (mode=advisory, the default): a throwaway PostgreSQL 15 as
    tests/testing/postgres_server.cc starts it: initdb and postgres run as the `postgres` OS
    user when the harness runs as root (initdb refuses root), in a temporary directory of their
    own under /tmp (the run directory is root's, mode 0700), on a free 127.0.0.1 port (never
    5432), the Unix socket in that directory. fsync=off (the OS never crashes here; see
    `fsync` below) but synchronous_commit=on, so that a kill -9 of the server loses no committed
    fence. The workers reach it through a FaultProxy. The server's log is copied to the run
    directory.

    Server faults, as RedisStore's: store-pause SIGSTOPs the server's whole process group
    (postmaster and every backend); store-restart kill -9s the group and restarts on the same
    port and data (crash recovery).

    Advisory mode leaves out store-restart and proxy-reset: both end the holder's session,
    which frees its advisory lock at once, while the holder learns it only at its next
    heartbeat. The README (PostgreSQL, "The window") documents that window and leaves it to
    fencing; the checker would report it as overlaps. `--pg-session-faults` adds them back
    (expect overlaps and stolen grants, and stale_accepted=0). Table mode (a row with a
    server-side expiry, which survives both) takes every fault."""

    scheme = "postgres"
    query = ""
    server_faults = ("store-pause", "proxy-blackhole", "proxy-delay")
    session_faults = ("store-restart", "proxy-reset")
    quick_scale = 0.8  # initdb + start per scenario: keeps --quick under 60 s
    # The fsync setting on the server's command line; None: none there (the default, on, which
    # ALTER SYSTEM can then change: tests/cli/check_test.py judges a durable server).
    fsync = "off"

    def start(self, run_dir):
        import pwd
        self.run_dir = run_dir
        self.dir = tempfile.mkdtemp(prefix="leasehold-chaos-pg-")
        self.user = None
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")  # KeyError: install the postgresql package
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self.user = "postgres"
        with open(os.path.join(self.dir, "initdb.log"), "wb") as log:
            rc = subprocess.run([f"{PG_BIN}/initdb", "-D", os.path.join(self.dir, "data"), "-U",
                                 "postgres", "-A", "trust", "--no-sync", "--no-instructions"],
                                stdout=log, stderr=log, user=self.user, cwd=self.dir).returncode
        if rc != 0:
            raise SystemExit(f"chaos: initdb failed (rc {rc}), see {self.dir}/initdb.log")
        self.port = free_port()
        while self.port in (5432, 6432):
            self.port = free_port()
        self._launch()
        self.proxy = FaultProxy(self.port)
        self.undo = []

    def _launch(self):
        for attempt in range(20):  # after a kill -9, orphaned backends may linger a moment
            self.log_f = open(os.path.join(self.dir, "pg.log"), "ab")
            self.proc = subprocess.Popen(
                [f"{PG_BIN}/postgres", "-D", os.path.join(self.dir, "data"), "-p", str(self.port),
                 "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.dir}",
                 "-c", "synchronous_commit=on", "-c", "max_connections=200",
                 "-c", "shared_buffers=32MB"] + (["-c", f"fsync={self.fsync}"] if self.fsync else []),
                stdout=self.log_f, stderr=self.log_f, user=self.user, cwd=self.dir,
                start_new_session=True)
            deadline = time.time() + 30
            while time.time() < deadline and self.proc.poll() is None:
                if subprocess.run([f"{PG_BIN}/pg_isready", "-q", "-h", "127.0.0.1", "-p",
                                   str(self.port), "-t", "1"]).returncode == 0:
                    return
                time.sleep(0.05)
            if self.proc.poll() is None:
                break
            time.sleep(0.25)
        raise SystemExit(f"chaos: postgres did not come up on port {self.port}, see "
                         f"{self.dir}/pg.log")

    def url(self):
        return f"postgres://postgres@127.0.0.1:{self.proxy.port}/postgres{self.query}"

    def _psql(self, sql):
        r = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                            "-d", "postgres", "-X", "-q", "-A", "-t", "-F", "\t",
                            "-v", "ON_ERROR_STOP=1", "-c", sql],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"psql failed: {r.stderr.strip()}")
        return r.stdout

    def prepare_native(self, keys):
        # The workers' own CREATE TABLE IF NOT EXISTS can race between two first writes (two
        # keys' holders) on PostgreSQL; created here, theirs is a no-op.
        self._psql(NATIVE_SQL_TABLE)

    def read_native(self, keys):
        rows = {}
        for line in self._psql("SELECT k, v FROM chaos_data").splitlines():
            k, _, v = line.partition("\t")
            rows[k] = v
        return {k: rows.get(k) for k in keys}

    def _signal(self, sig):
        os.killpg(self.proc.pid, sig)

    def stop(self):
        super().stop()
        try:
            shutil.copy(os.path.join(self.dir, "pg.log"), os.path.join(self.run_dir, "pg.log"))
        except OSError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


class PostgresTableStore(PostgresStore):
    """postgres://...?mode=table: the same server; every server fault."""

    scheme = "postgres-table"
    query = "?mode=table"
    server_faults = PostgresStore.server_faults + PostgresStore.session_faults

class StoreSkip(Exception):
    """This machine cannot run the store (missing tool, not root): the harness exits 77,
    CTest's SKIP_RETURN_CODE, with the reason."""


PATRONI = "/usr/bin/patroni"
PATRONICTL = "/usr/bin/patronictl"
PG_HA_NFT_PREFIX = "leasehold_chaos_pgha_"


def http_json(url, timeout=0.5):
    """(HTTP status, parsed JSON body or None) of a GET of `url`, (None, None) when nothing
    answers in time. No proxy, whatever the environment says: the targets are on loopback."""
    import json
    import urllib.error
    import urllib.request
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"null")
        except (OSError, ValueError):
            return e.code, None
    except (OSError, ValueError):
        return None, None


def pg_ha_missing():
    """Why this machine cannot run the Patroni pair ("" if it can)."""
    import pwd
    if os.geteuid() != 0:
        return "not root (nftables rules; Patroni and postgres run as the postgres OS user)"
    for path in (PATRONI, PATRONICTL, "/usr/bin/etcd", f"{PG_BIN}/initdb", f"{PG_BIN}/pg_rewind"):
        if not os.access(path, os.X_OK):
            return f"no {path}"
    if shutil.which("nft") is None:
        return "no nft (nftables)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres OS user (the postgresql package)"
    r = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        return f"nft cannot list tables here: {r.stderr.strip()}"
    r = subprocess.run(["/usr/bin/python3", "-c", "import patroni.dcs.etcd3, psycopg2"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return f"Patroni's etcd3 DCS does not import under /usr/bin/python3: " \
               f"{r.stderr.strip().splitlines()[-1:]}"
    return ""


def pg_ha_delete_stale_tables():
    """Deletes the nftables tables of harness processes that are gone (a run killed before its
    stop): their rules name ports that a later run may be given."""
    r = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, timeout=10)
    for line in r.stdout.splitlines():
        words = line.split()
        if len(words) == 3 and words[1] == "inet" and words[2].startswith(PG_HA_NFT_PREFIX):
            pid = words[2][len(PG_HA_NFT_PREFIX):]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                subprocess.run(["nft", "delete", "table", "inet", words[2]],
                               capture_output=True, timeout=10)


class PostgresHaStore(StoreControl):
    """postgres:// on a real high-availability pair (mode=advisory; PostgresHaTableStore:
    mode=table): two PostgreSQL 15 members under Patroni 3.0.2 (Debian's /usr/bin/patroni, run
    by /usr/bin/python3), its DCS a throwaway single-member etcd 3.4 started here (`etcd3` in
    Patroni's configuration). Everything on 127.0.0.1 free ports, in a temporary directory owned
    by the `postgres` OS user; Patroni and postgres run as that user (initdb refuses root), the
    harness as root (it needs nftables). Patroni: ttl 10, loop_wait 1, retry_timeout 3 (a lost
    primary's leader key lapses within 10 s; loop_wait + 2 x retry_timeout <= ttl, so a primary
    cut off from etcd demotes itself before it lapses), watchdog off, use_pg_rewind with
    wal_log_hints (plus remove_data_directory_on_rewind_failure and _on_diverged_timelines: a
    deposed primary always comes back as a replica), use_unix_socket (Patroni reaches its own
    postgres by its socket, which the partition below does not cut), fsync off as for
    PostgresStore (the OS never crashes here) with synchronous_commit on.

    Replication (--pg-ha-sync): `on` (the default) synchronous_mode: true: Patroni names the
    replica in synchronous_standby_names once it streams, and fails over only to the member its
    /sync key names; `strict` adds synchronous_mode_strict (with the replica gone, commits wait
    instead of going on alone: every grant and renewal blocks until the deposed primary rejoins,
    and the library reports the cancelled waits as unavailable); `off` asynchronous replication
    (Patroni fails over to a replica within maximum_lag_on_failover, 1 MB: the latest commits of
    a killed or cut-off primary can be lost).

    The workers reach the pair through one multi-host URL (leasehold passes host and port lists
    to libpq intact: postgres_options.cc, SplitAuthority):
      postgres://postgres@127.0.0.1:P0,127.0.0.1:P1/postgres?target_session_attrs=read-write
        &mode=advisory|table&connect_timeout=2&command_timeout=1s
    (libpq tries the members in order and keeps the first that takes writes; connect_timeout 2,
    libpq's least, bounds a try of a cut-off member; command_timeout 1 s a statement's wait).

    Server faults, one at a time and only on a whole cluster (one primary, the replica streaming
    and, when synchronous, named sync standby by both PostgreSQL and Patroni's /sync key); the
    store takes them in turn (switchover, primary-kill, primary-partition, again; --pg-ha-faults
    picks some), so that a short run sees each kind:
      switchover         `patronictl switchover --leader OLD --candidate NEW --force`: Patroni
                         stops the primary (fast shutdown: its sessions end, and with them its
                         advisory locks) and promotes the replica; the old one follows it.
      primary-kill       kill -9 of the primary's Patroni and of its postmaster's process group
                         (every backend); the replica takes over once the leader key lapses
                         (ttl). Then the killed member's Patroni is started again: it rewinds
                         its data (pg_rewind) and rejoins as a replica.
      primary-partition  an nftables table of this harness's own (inet leasehold_chaos_pgha_<pid>,
                         a chain on the output hook, so loopback traffic both ways) drops every
                         packet to or from the primary's postgres port (workers, the replica's
                         WAL stream), its Patroni's etcd client port (each member talks to etcd
                         on a client port of its own, use_proxies: no discovery of the other)
                         and its Patroni REST API port (a real partition cuts the node off
                         whole; reachable, it would tell the replica "Primary is still alive",
                         or that its WAL is ahead, and stop the failover). Patroni demotes the
                         cut-off primary (it cannot renew its leader key) and the replica takes
                         over once the key lapses. The table is deleted as soon as the new
                         primary is seen (or after 60 s), at the wind-down, and always in stop().
      standby-cut        the issue's scenario: the replica's WAL stream cut (an nftables table:
                         the walsender's and walreceiver's packets of the replication
                         connection, and any new connection of the postgres user to the
                         primary's port, a reconnecting walreceiver; the workers run as root
                         and pass) for CUT_S while grants flow, then kill -9 of the primary
                         as in primary-kill and the cut deleted. Under `strict` every COMMIT
                         of the cut waits for the replica and is cancelled at command_timeout
                         (the server's "canceling wait for synchronous replication" warning):
                         the library reports those as unavailable, and the replica that
                         Patroni then promotes never had them. Not among the default kinds
                         (pick it with --pg-ha-faults); the negative control runs it (see
                         main).
    Each fault logs store-fault (window=1 if its overlaps are the documented window, below),
    store-heal with failover_ms (from the fault to the new primary's Patroni reporting it
    running as primary; -1 if none did within 60 s) when the fault is undone, and store-ready
    with ready_ms once the cluster is whole again (busy() until then: no other store fault,
    and no worker is started while no member is primary, so that its Open does not give up).
    No fault is started with less of the run left than its failover takes (MIN_LEFT_S).

    What the checker should find:
      - stale_accepted = 0 and token_regressions = 0 in every variant (fencing tokens carry the
        timeline: a token of a later timeline is greater; a handle refuses one of an older
        timeline than it saw);
      - mode=table with a synchronous standby (sync on or strict): 0 overlaps, 0 stolen grants
        (the lease rows are on the standby before the grant is confirmed; an unconfirmed commit
        is reported unavailable, never granted);
      - mode=advisory, any replication: advisory locks are not replicated. After a failover the
        new primary grants keys at once while the old holders learn of it only at their next
        heartbeat (or at safe_until, when their session is cut off): overlaps and "stolen"
        grants (lost with reason store before safe_until: the lease's session ended, e.g.
        "terminating connection due to unexpected postmaster exit") within a failover are that
        documented window. They are reported (chaos-failover: count, median and max overlap per
        fault kind), not counted as violations; any outside a fault's window still is;
      - mode=table with asynchronous replication: the same for primary-kill and
        primary-partition (a lost commit can hand a key out again); a switchover waits for the
        replica to have every WAL record, so its overlaps stay violations.
    """

    scheme = "postgres-ha"
    mode = "advisory"
    server_faults = ("switchover", "primary-kill", "primary-partition")
    extra_faults = ("standby-cut",)  # by --pg-ha-faults only
    sync = "on"  # --pg-ha-sync: on, strict or off
    faults = None  # --pg-ha-faults: the kinds to take in turn (default: server_faults)
    default_scenarios = ("store-faults",)  # without --scenario
    quick_s = {"store-faults": 45}  # --quick: two or three failovers of ~10 s each
    needs_store_faults = True  # a store-faults run without a completed fault tested nothing
    MEMBERS = ("m0", "m1")
    DCS = dict(ttl=10, loop_wait=1, retry_timeout=3)
    FAILOVER_LIMIT_NS = 60 * 10**9
    REPAIR_AFTER_NS = 40 * 10**9  # rejoin not done by then (~8-17 s when it works): repair
    # No fault with less of the run left than its failover takes here (switchover ~3 s,
    # primary-kill ~10 s, primary-partition ~13 s) and a margin: the wind-down would cut it.
    MIN_LEFT_S = {"switchover": 8, "primary-kill": 15, "primary-partition": 18,
                  "standby-cut": 25}
    # standby-cut: how long grants flow with the WAL stream cut before the kill. Shorter than
    # wal_sender_timeout plus a Patroni loop: once the primary's walsender gives the replica up,
    # Patroni takes it out of the /sync key and then never promotes it ("following a different
    # leader because i am not the healthiest node": seen with a 6 s cut and the default 2 s
    # timeout), which closes the window by itself. Commits wait 1 s (command_timeout) in the
    # cut. --pg-ha-standby-cut-setup: 8 s with a timeout of 60 s.
    CUT_S = 1.5
    WAL_SENDER_TIMEOUT = "2s"
    READY_LIMIT_NS = 120 * 10**9
    POLL_S = 0.1

    def window_faults(self):
        """The fault kinds whose overlaps and stolen grants are the documented window."""
        if self.mode == "advisory":
            return set(self.server_faults + self.extra_faults)
        return ({"primary-kill", "primary-partition", "standby-cut"} if self.sync == "off"
                else set())

    def url(self):
        hosts = ",".join(f"127.0.0.1:{m['pg']}" for m in self.members.values())
        return (f"postgres://postgres@{hosts}/postgres?target_session_attrs=read-write"
                f"&mode={self.mode}&connect_timeout=2&command_timeout=1s")

    # ---- start and stop ----

    def start(self, run_dir):
        why = pg_ha_missing()
        if why:
            raise StoreSkip(why)
        self.run_dir = run_dir
        self.members = {}
        self.procs = {}  # member -> Popen of its Patroni
        self.etcd = None
        self.ctl = None  # a running patronictl switchover
        self.nft_table = None
        self.pending = None
        self.turn = 0
        self.status = {}  # member -> (t_ns, its /patroni JSON or None): the poller's
        self.poll_stop = threading.Event()
        self.poller = None
        self.dir = None
        try:
            self._start()
        except BaseException:
            self.stop()  # main() stops only a store that started
            raise

    def _start(self):
        import json
        import pwd
        pg_ha_delete_stale_tables()
        pw = pwd.getpwnam("postgres")
        self.uid, self.gid = pw.pw_uid, pw.pw_gid
        self.dir = tempfile.mkdtemp(prefix="leasehold-chaos-pgha-")
        os.chown(self.dir, self.uid, self.gid)
        used = {2379, 2380, 5432, 6432, 8008}
        ports = []
        while len(ports) < 7:
            p = free_port()
            if p not in used:
                used.add(p)
                ports.append(p)
        self.etcd_peer = ports.pop()
        for name in self.MEMBERS:
            self.members[name] = dict(pg=ports.pop(), rest=ports.pop(), etcd=ports.pop(),
                                      dir=os.path.join(self.dir, name))
        # etcd (as root; its data in the temporary directory), one client port per member.
        edir = os.path.join(self.dir, "etcd")
        os.makedirs(edir)
        client = ",".join(f"http://127.0.0.1:{m['etcd']}" for m in self.members.values())
        peer = f"http://127.0.0.1:{self.etcd_peer}"
        self.etcd_log = open(os.path.join(edir, "etcd.log"), "ab")
        self.etcd = subprocess.Popen(
            ["/usr/bin/etcd", "--name", "chaos", "--data-dir", os.path.join(edir, "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"chaos={peer}", "--initial-cluster-state", "new"],
            stdout=self.etcd_log, stderr=self.etcd_log, start_new_session=True)
        env = dict(os.environ, ETCDCTL_API="3")
        deadline = time.time() + 20
        while subprocess.run(["/usr/bin/etcdctl", f"--endpoints={client}", "--dial-timeout=1s",
                              "--command-timeout=2s", "endpoint", "health"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
            if time.time() > deadline or self.etcd.poll() is not None:
                raise SystemExit(f"chaos: etcd did not come up, see {edir}/etcd.log")
            time.sleep(0.05)
        dcs = dict(self.DCS, maximum_lag_on_failover=1048576,
                   synchronous_mode=self.sync != "off",
                   synchronous_mode_strict=self.sync == "strict",
                   postgresql=dict(use_pg_rewind=True, use_slots=True, parameters=dict(
                       wal_level="replica", hot_standby="on", wal_log_hints="on",
                       max_wal_senders=10, max_replication_slots=10, max_connections=200,
                       wal_keep_size="128MB", wal_sender_timeout=self.WAL_SENDER_TIMEOUT)))
        for name, m in self.members.items():
            os.makedirs(m["dir"])
            os.chown(m["dir"], self.uid, self.gid)
            os.chmod(m["dir"], 0o700)
            conf = dict(
                scope="chaos", name=name,
                restapi=dict(listen=f"127.0.0.1:{m['rest']}",
                             connect_address=f"127.0.0.1:{m['rest']}"),
                etcd3=dict(hosts=[f"127.0.0.1:{m['etcd']}"], use_proxies=True),
                bootstrap=dict(dcs=dcs, initdb=["no-sync", dict(encoding="UTF8")]),
                postgresql=dict(
                    listen=f"127.0.0.1:{m['pg']}", connect_address=f"127.0.0.1:{m['pg']}",
                    data_dir=os.path.join(m["dir"], "data"), bin_dir=PG_BIN,
                    pgpass=os.path.join(m["dir"], "pgpass"), use_unix_socket=True,
                    remove_data_directory_on_rewind_failure=True,
                    remove_data_directory_on_diverged_timelines=True,
                    authentication=dict(superuser=dict(username="postgres"),
                                        replication=dict(username="replicator"),
                                        rewind=dict(username="postgres")),
                    parameters=dict(unix_socket_directories=m["dir"], fsync="off",
                                    synchronous_commit="on", shared_buffers="32MB"),
                    pg_hba=["local all all trust", "host all all 127.0.0.1/32 trust",
                            "host replication all 127.0.0.1/32 trust"]),
                watchdog=dict(mode="off"),
                tags=dict(nofailover=False, noloadbalance=False, clonefrom=False,
                          nosync=False))
            m["conf"] = os.path.join(m["dir"], "patroni.yml")
            with open(m["conf"], "w") as f:
                json.dump(conf, f, indent=1)  # JSON is YAML
            os.chown(m["conf"], self.uid, self.gid)
        self.ctl_conf = os.path.join(self.dir, "patronictl.yml")
        with open(self.ctl_conf, "w") as f:
            json.dump(dict(scope="chaos", etcd3=dict(
                hosts=[f"127.0.0.1:{m['etcd']}" for m in self.members.values()])), f)
        # Both at once: the one that takes etcd's initialize key runs initdb, the other waits
        # for it and clones it (pg_basebackup).
        for name in self.MEMBERS:
            self._launch(name)
        self._wait(lambda: not self._why_not_ready(fresh=True), 120, "the cluster to be whole")
        self.poller = threading.Thread(target=self._poll, daemon=True)
        self.poller.start()

    def _wait(self, cond, timeout_s, what):
        deadline = time.time() + timeout_s
        while not cond():
            if time.time() > deadline:
                raise SystemExit(f"chaos: timed out after {timeout_s} s waiting for {what} "
                                 f"({self._why_not_ready(fresh=True) or 'whole now'}); logs in "
                                 f"{self.dir}")
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise SystemExit(f"chaos: Patroni {name} exited (rc {p.returncode}), see "
                                     f"{self.members[name]['dir']}/patroni.log")
            time.sleep(0.2)

    def _launch(self, name):
        m = self.members[name]
        with open(os.path.join(m["dir"], "patroni.log"), "ab") as log:
            self.procs[name] = subprocess.Popen(
                [PATRONI, m["conf"]], stdout=log, stderr=log, cwd=m["dir"],
                user=self.uid, group=self.gid, extra_groups=[], start_new_session=True,
                env=dict(PATH="/usr/bin:/bin", HOME=m["dir"], LANG="C.UTF-8",
                         PGHOST=m["dir"], PGPORT=str(m["pg"])))

    def _fetch(self, name, timeout=1.0):
        """The member's GET /patroni (role, state, timeline, replication, sync_standby), {} if
        its REST API does not answer."""
        code, body = http_json(f"http://127.0.0.1:{self.members[name]['rest']}/patroni",
                               timeout)
        return body if code == 200 and isinstance(body, dict) else {}

    def _poll(self):
        while not self.poll_stop.wait(self.POLL_S):
            for name in self.MEMBERS:
                t = now_ns()
                self.status[name] = (t, self._fetch(name))

    def _state(self, name, since=0):
        """The poller's latest /patroni of `name`, None if it predates `since`."""
        t, body = self.status.get(name, (0, {}))
        return body if t >= since else None

    @staticmethod
    def _is_primary(body):
        return bool(body) and body.get("role") in ("master", "primary") and \
            body.get("state") == "running"

    def _why_not_ready(self, fresh=False, since=0):
        """What the cluster still lacks, "" when it is whole: one primary, the other member a
        running replica streaming from it on its timeline, and (synchronous) the replica named
        sync standby by PostgreSQL and by Patroni's /sync key."""
        st = {n: (self._fetch(n) if fresh or self.poller is None else self._state(n, since))
              for n in self.MEMBERS}
        if any(b is None for b in st.values()):
            return "no fresh status yet"
        prim = [n for n, b in st.items() if self._is_primary(b)]
        if len(prim) != 1:
            return f"primaries={prim or 'none'}"
        p = prim[0]
        r = next(n for n in self.MEMBERS if n != p)
        b = st[r]
        if b.get("role") != "replica" or b.get("state") != "running":
            return f"{r}_role={b.get('role')}_state={b.get('state')}"
        if b.get("timeline") != st[p].get("timeline"):
            return f"{r}_timeline={b.get('timeline')}_primary's={st[p].get('timeline')}"
        rows = [x for x in st[p].get("replication") or []
                if x.get("application_name") == r and x.get("state") == "streaming"]
        if not rows:
            return f"{r}_not_streaming"
        if self.sync != "off":
            if rows[0].get("sync_state") != "sync":
                return f"{r}_sync_state={rows[0].get('sync_state')}"
            if not b.get("sync_standby"):
                return f"{r}_not_in_/sync"
        return ""

    def primary(self):
        prim = [n for n in self.MEMBERS if self._is_primary(self._fetch(n))]
        return prim[0] if len(prim) == 1 else None

    def _postmaster_pid(self, name):
        try:
            with open(os.path.join(self.members[name]["dir"], "data", "postmaster.pid")) as f:
                pid = int(f.readline())
            with open(f"/proc/{pid}/comm") as f:
                return pid if f.read().strip() in ("postgres", "postmaster") else None
        except (OSError, ValueError):
            return None

    def _kill_member(self, name):
        """kill -9 of the member's Patroni (first, so it starts nothing more), then of its
        postmaster's process group (the postmaster and every backend)."""
        p = self.procs.get(name)
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        pid = self._postmaster_pid(name)
        if pid:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _kill_dir_processes(self, path):
        """SIGKILL of every process whose command line names `path` (a postmaster that Patroni
        lost track of still runs with -D <path>/data)."""
        needle = os.fsencode(path)
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid():
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if needle in f.read():
                        os.kill(int(d), signal.SIGKILL)
            except OSError:
                pass

    def _repair(self, name):
        """The member as Patroni would rebuild it by hand (`patronictl reinit`), done from
        outside because its Patroni may be the broken part: kill -9 of its Patroni and of every
        process running on its directory, its data directory removed, its Patroni started again
        (it clones the leader with pg_basebackup)."""
        self._kill_member(name)
        self._kill_dir_processes(self.members[name]["dir"] + "/")
        shutil.rmtree(os.path.join(self.members[name]["dir"], "data"), ignore_errors=True)
        self._launch(name)

    def _drop(self, rules):
        """Installs this harness's nftables table: one chain on the output hook (loopback both
        ways) dropping what `rules` (rule lines) match."""
        self.nft_table = f"{PG_HA_NFT_PREFIX}{os.getpid()}"
        table = (f"table inet {self.nft_table} {{\n"
                 f"  chain out {{\n"
                 f"    type filter hook output priority 0; policy accept;\n"
                 + "".join(f"    {rule} drop\n" for rule in rules) +
                 f"  }}\n}}\n")
        r = subprocess.run(["nft", "-f", "-"], input=table, capture_output=True, text=True,
                           timeout=10)
        if r.returncode != 0:
            self.nft_table = None
            raise SystemExit(f"chaos: nft -f failed: {r.stderr.strip()}")

    def _partition(self, name):
        m = self.members[name]
        ports = f"{{ {m['pg']}, {m['etcd']}, {m['rest']} }}"
        self._drop([f"tcp dport {ports}", f"tcp sport {ports}"])

    def _cut_stream(self, primary):
        """standby-cut's nftables table (see the class comment)."""
        port = self.members[primary]["pg"]
        rows = self._psql_at(primary, "SELECT client_port FROM pg_stat_replication "
                                      "WHERE client_port IS NOT NULL").split()
        if not rows:
            raise RuntimeError("standby-cut: no walreceiver in pg_stat_replication")
        rules = []
        for c in rows:
            rules += [f"tcp sport {port} tcp dport {c}", f"tcp sport {c} tcp dport {port}"]
        # self.uid: the postgres OS user's, as _start found it (a reconnecting walreceiver).
        self._drop(rules + [f"meta skuid {self.uid} tcp dport {port}"])

    def _unpartition(self):
        if self.nft_table:
            subprocess.run(["nft", "delete", "table", "inet", self.nft_table],
                           capture_output=True, timeout=10)
            self.nft_table = None

    def stop(self):
        self.poll_stop.set()
        try:
            self._unpartition()
        finally:
            if self.ctl is not None and self.ctl.poll() is None:
                self.ctl.kill()
                self.ctl.wait()
            for name in self.members:
                self._kill_member(name)
            if self.dir:
                self._kill_dir_processes(self.dir + "/")
            if self.etcd is not None:
                self.etcd.kill()
                self.etcd.wait()
            if self.dir:
                for name, m in self.members.items():
                    try:
                        shutil.copy(os.path.join(m["dir"], "patroni.log"),
                                    os.path.join(self.run_dir, f"patroni-{name}.log"))
                    except OSError:
                        pass
                for src, dst in ((os.path.join(self.dir, "etcd", "etcd.log"), "etcd.log"),
                                 (os.path.join(self.dir, "patronictl.log"), "patronictl.log")):
                    try:
                        shutil.copy(src, os.path.join(self.run_dir, dst))
                    except OSError:
                        pass
                shutil.rmtree(self.dir, ignore_errors=True)
                self.dir = None

    # ---- --guard native ----

    def _psql(self, sql):
        name = self.primary()
        if name is None:
            raise RuntimeError("no primary to read from")
        return self._psql_at(name, sql)

    def _psql_at(self, name, sql):
        r = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.members[name]["pg"]),
                            "-U", "postgres", "-d", "postgres", "-X", "-q", "-A", "-t", "-F",
                            "\t", "-v", "ON_ERROR_STOP=1", "-c", sql],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"psql failed: {r.stderr.strip()}")
        return r.stdout

    prepare_native = PostgresStore.prepare_native
    read_native = PostgresStore.read_native

    # ---- faults ----

    def spawn_ready(self):
        """False while no member is primary, or one is being repaired (a new worker's Open
        would give up)."""
        return self.pending is None or self.pending["phase"] not in ("failover", "repair")

    def inject(self, fault, ttl_ns, orch):
        kinds = self.faults or self.server_faults
        kind = kinds[self.turn % len(kinds)]  # the store's own turn, whatever was drawn
        if getattr(orch, "end_ns", 0) and orch.end_ns - now_ns() < self.MIN_LEFT_S[kind] * 10**9:
            return False  # no time left for this failover: the wind-down would cut it short
        why = self._why_not_ready(since=now_ns() - int(1e9))
        if why:  # only a whole cluster is hurt
            orch.log("store-fault-skipped", kind=kind, why=re.sub(r"\s+", "_", why))
            return False
        old = next(n for n in self.MEMBERS if self._is_primary(self._state(n)))
        new = next(n for n in self.MEMBERS if n != old)
        self.turn += 1
        t = now_ns()
        if kind == "switchover":
            with open(os.path.join(self.dir, "patronictl.log"), "ab") as log:
                log.write(f"--- {t} switchover {old} -> {new}\n".encode())
                log.flush()
                self.ctl = subprocess.Popen(
                    [PATRONICTL, "-c", self.ctl_conf, "switchover", "--leader", old,
                     "--candidate", new, "--force", "chaos"], stdout=log, stderr=log,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                    env=dict(os.environ, HOME=self.dir))
        elif kind == "primary-kill":
            self._kill_member(old)
        elif kind == "primary-partition":
            self._partition(old)
        elif kind == "standby-cut":
            self._cut_stream(old)
        else:
            raise ValueError(kind)
        self.pending = dict(kind=kind, phase="cut" if kind == "standby-cut" else "failover",
                            old=old, new=new, t0=t, cut_end=t + int(self.CUT_S * 10**9),
                            deadline=t + self.FAILOVER_LIMIT_NS)
        orch.log("store-fault", kind=kind, dur_ms=0, old_primary=old, new_primary=new,
                 window=int(kind in self.window_faults()))
        return True

    def _undo(self, p):
        if p["kind"] in ("primary-partition", "standby-cut"):
            self._unpartition()
        if p["kind"] in ("primary-kill", "standby-cut") and p["phase"] != "cut":
            self._launch(p["old"])

    def busy(self):
        return self.pending is not None

    def tick(self, orch):
        p = self.pending
        if p is None:
            return
        t = now_ns()
        if p["phase"] == "cut":
            if t < p["cut_end"]:
                return
            self._kill_member(p["old"])
            self._unpartition()
            orch.log("store-cut-end", kind=p["kind"], old_primary=p["old"],
                     cut_ms=(t - p["t0"]) // MS)
            p.update(phase="failover", deadline=t + self.FAILOVER_LIMIT_NS)
            return
        if p["phase"] == "failover":
            promoted = self._is_primary(self._state(p["new"], since=p["t0"]))
            if not promoted and t < p["deadline"]:
                return
            self._undo(p)
            orch.log("store-heal", kind=p["kind"], new_primary=p["new"] if promoted else "none",
                     failover_ms=(t - p["t0"]) // MS if promoted else -1)
            p.update(phase="rejoin", t1=t, deadline=t + self.READY_LIMIT_NS)
            return
        why = self._why_not_ready(since=p["t1"])
        if why and p["phase"] == "rejoin" and t > p["t1"] + self.REPAIR_AFTER_NS:
            # Seen here: Patroni 3.0.2 demoting a cut-off primary twice at once (its
            # AsyncExecutor busy with a slow shutdown: "demoting from the main thread"), two
            # postmasters, pg_rewind failing, the data directory removed under a running
            # postmaster; the member never streams again (patroni/patroni#3649, PR #3372).
            member = p["old"] if not self._is_primary(self._state(p["old"])) else p["new"]
            self._repair(member)
            orch.log("store-repair", kind=p["kind"], member=member,
                     why=re.sub(r"\s+", "_", why))
            p.update(phase="repair")
            return
        if not why or t > p["deadline"]:
            fields = dict(kind=p["kind"], ready_ms=(t - p["t1"]) // MS)
            if why:
                fields["not_ready"] = re.sub(r"\s+", "_", why)
            orch.log("store-ready" if not why else "store-not-ready", **fields)
            self.pending = None

    def heal(self, orch):
        # Wind-down: a fault still being failed over is undone at once (no waiting: paused
        # workers wait on us); stop() kills everything after the workers are gone.
        p = self.pending
        if p is not None and p["phase"] in ("cut", "failover"):
            self._undo(p)
            orch.log("store-heal", kind=p["kind"], new_primary="wind-down", failover_ms=-1)
            self.pending = None


class PostgresHaTableStore(PostgresHaStore):
    """postgres-ha with ?mode=table: the same Patroni pair and faults (see PostgresHaStore)."""

    scheme = "postgres-ha-table"
    mode = "table"



class RedisFairStore(RedisStore):
    """redis://...?fair=true: the same server and faults; waiters queue, and a release hands the
    key to the head waiter inside its own script (the waiter takes the grant from the "handed"
    message, its validity counted from its latest queue refresh)."""

    scheme = "redis-fair"

    def url(self):
        return f"redis://127.0.0.1:{self.proxy.port}?prefix=chaos&fair=true"


class RedisEvictStore(RedisStore):
    """redis:// as a cache shares it: maxmemory 8mb and --redis-maxmemory-policy (noeviction by
    default), AOF always, no proxy faults. Server fault cache-fill: the application writes 25 MB
    of cache keys (2,500 x 10 KB, no TTL) straight to the server, memory stays full (maxmemory
    held just under what is used), and 3-8 TTL later the keys are deleted and maxmemory is 8mb
    again (the cache churning; longer than a worker's wait, so that acquires end refused).
    Under noeviction the fill meets OOM and so does an acquire whose script writes first with a
    command Redis refuses in a full memory (a script that first deletes an expired grant makes
    room and goes on: that is a grant, not a fault). A run in which no acquire met a full memory
    tested nothing (oom_fails=0: harness-ineffective). Under an evicting policy the URL says
    accept_eviction=true (Open refuses the server otherwise) and the evictions must be caught
    (the negative control: --negative-control)."""

    scheme = "redis"
    server_faults = ("cache-fill",)
    default_scenarios = ("eviction",)
    policy = "noeviction"
    MAXMEMORY = "8mb"
    FILL_KEYS = 2500
    FILL_VALUE = b"c" * 10_000

    def start(self, run_dir):
        super().start(run_dir)
        self.fills = 0

    def server_args(self):
        return ("--maxmemory", self.MAXMEMORY, "--maxmemory-policy", self.policy)

    def url(self):
        accept = "" if self.policy == "noeviction" else "&accept_eviction=true"
        return f"redis://127.0.0.1:{self.proxy.port}?prefix=chaos{accept}"

    def _pipeline(self, commands):
        """Sends `commands` (lists of bytes) in one pipeline; returns (ok, error) counts."""
        out = bytearray()
        for c in commands:
            out += b"*%d\r\n" % len(c)
            for a in c:
                out += b"$%d\r\n%s\r\n" % (len(a), a)
        ok = err = 0
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            sock.sendall(out)
            f = sock.makefile("rb")
            for _ in commands:
                r = _resp_read(f)
                if isinstance(r, RespError):
                    err += 1
                else:
                    ok += 1
        return ok, err

    def inject(self, fault, ttl_ns, orch):
        if fault != "cache-fill":
            raise ValueError(fault)
        self.fills += 1
        names = [b"cache:%d:%d" % (self.fills, i) for i in range(self.FILL_KEYS)]
        written = refused = 0
        for i in range(0, len(names), 100):  # 1 MB a pipeline: the query buffer stays small
            ok, err = self._pipeline([[b"SET", n, self.FILL_VALUE] for n in names[i:i + 100]])
            written, refused = written + ok, refused + err
        dur = int(orch.rng.uniform(3.0, 8.0) * ttl_ns)
        # A refused write leaves a few KB that the writer's freed buffers and the next release
        # give back; until the fill is undone, maxmemory stays 64 KB under what is used: the
        # memory stays full (an evicting policy evicts down to it).
        used = int(_info_fields(resp_call(self.port, "INFO", "memory"))["used_memory"])
        resp_call(self.port, "CONFIG", "SET", "maxmemory", str(used - 65536))

        def undo():
            resp_call(self.port, "CONFIG", "SET", "maxmemory", self.MAXMEMORY)
            for i in range(0, len(names), 500):
                self._pipeline([[b"DEL", n] for n in names[i:i + 500]])
        self.undo.append((now_ns() + dur, undo, fault))
        info = _info_fields(resp_call(self.port, "INFO", "stats"))
        orch.log("store-fault", kind=fault, dur_ms=dur // MS, written=written, oom=refused,
                 evicted_keys=info.get("evicted_keys", "?"))
        return True


class RedisSentinelStore(RedisStore):
    """redis+sentinel://: a master (AOF, appendfsync always), one replica (--sentinel-replicas)
    and three sentinels
    (`redis-server CONF --sentinel`, down-after-milliseconds 1000), as
    tests/testing/redis_sentinel.cc starts them; the workers learn the master from the
    sentinels. min_replicas=1 unless --sentinel-min-replicas says otherwise.

    Server fault: master-kill (kill -9 of the master the sentinels name; once they name
    another, the old one is started again on its port and data, and the sentinels make it a
    replica of the new master, ready for the next kill). No proxy: the workers reach several
    servers."""

    scheme = "redis-sentinel"
    server_faults = ("master-kill",)
    quick_s = {"store-faults": 20}  # --quick: five to eight failovers
    min_replicas = 1
    replicas = 1

    def start(self, run_dir):
        self.dir = os.path.join(run_dir, "sentinel")
        os.makedirs(self.dir)
        self.undo = []
        self.pending = None  # (old port, deadline ns) of a killed master not yet started again
        self.kills = 0
        self.next_poll = 0
        self.servers = {}  # port -> Popen
        master = free_port()
        self._launch_data(master, None)
        for _ in range(self.replicas):
            self._launch_data(free_port(), master)
        deadline = time.time() + 20
        while (time.time() < deadline and
               self._cli(master, "INFO", "replication").count("state=online") < self.replicas):
            time.sleep(0.05)
        self.sentinels = []
        for i in range(3):
            port = free_port()
            d = os.path.join(self.dir, f"sentinel{i}")
            os.makedirs(d)
            conf = os.path.join(d, "sentinel.conf")
            with open(conf, "w") as f:
                f.write(f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {d}\n"
                        f"sentinel monitor chaos 127.0.0.1 {master} 2\n"
                        f"sentinel down-after-milliseconds chaos 1000\n"
                        f"sentinel failover-timeout chaos 5000\n")
            log = open(os.path.join(d, "sentinel.log"), "ab")
            self.servers[("s", port)] = subprocess.Popen(
                ["redis-server", conf, "--sentinel"], stdout=log, stderr=log,
                start_new_session=True)
            self.sentinels.append(port)
        deadline = time.time() + 30
        while time.time() < deadline:
            out = self._cli(self.sentinels[0], "SENTINEL", "MASTER", "chaos").split("\n")
            fields = dict(zip(out[::2], out[1::2]))
            if (fields.get("num-slaves") == str(self.replicas) and
                    fields.get("num-other-sentinels") == "2"):
                return
            time.sleep(0.1)
        raise SystemExit("chaos: the sentinels did not find the replica and each other in 30 s")

    def _launch_data(self, port, replica_of):
        d = os.path.join(self.dir, f"redis-{port}")
        os.makedirs(d, exist_ok=True)
        args = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", d,
                "--save", "", "--appendonly", "yes", "--appendfsync", "always",
                "--repl-diskless-sync-delay", "0", "--daemonize", "no"]
        if replica_of:
            args += ["--replicaof", "127.0.0.1", str(replica_of)]
        log = open(os.path.join(d, "redis.log"), "ab")
        self.servers[port] = subprocess.Popen(args, stdout=log, stderr=log,
                                              start_new_session=True)
        deadline = time.time() + 10
        while time.time() < deadline and "PONG" not in self._cli(port, "PING"):
            time.sleep(0.02)

    def _cli(self, port, *args):
        r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else ""

    def master_port(self):
        """The master most sentinels name (one that has not seen a failover yet names the old
        one, which must then not be started again as a master), or None."""
        named = []
        for port in self.sentinels:
            try:
                out = resp_call(port, "SENTINEL", "get-master-addr-by-name", "chaos",
                                timeout=1.0)
            except OSError:
                continue
            if isinstance(out, list) and len(out) == 2 and str(out[1]).isdigit():
                named.append(int(out[1]))
        if not named:
            return None
        return max(named, key=named.count)

    def url(self):
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinels)
        return (f"redis+sentinel://{hosts}/chaos?prefix=chaos&min_replicas={self.min_replicas}"
                f"&replica_timeout=200ms")

    def read_native(self, keys):
        port = self.master_port()
        out = {}
        for k in keys:
            out[k] = None
            for name in redis_native_names(k):
                v = self._cli(port, "--raw", "GET", name)
                if v:
                    out[k] = v
                    break
        return out

    def inject(self, fault, ttl_ns, orch):
        if fault != "master-kill":
            raise ValueError(fault)
        port = self.master_port()
        if port is None or port not in self.servers:
            return False
        proc = self.servers[port]
        proc.kill()
        proc.wait()
        self.kills += 1
        self.pending = (port, now_ns() + 30 * 10**9)
        orch.log("store-fault", kind=fault, dur_ms=0, port=port)
        return True

    def busy(self):
        return self.pending is not None

    def tick(self, orch):
        # Polled every 100 ms while a failover is pending (the orchestrator ticks every 5 ms):
        # three questions a poll, on a machine whose sentinels must keep their timing.
        if self.pending is None or now_ns() < self.next_poll:
            return
        self.next_poll = now_ns() + 100 * MS
        old, deadline = self.pending
        now_master = self.master_port()
        if (now_master is not None and now_master != old) or now_ns() > deadline:
            self._launch_data(old, now_master if now_master != old else None)
            self.pending = None
            orch.log("store-heal", kind="master-kill", new_master=now_master)

    def heal(self, orch):
        # Wind-down: a failover under way is waited for (at most its 30 s deadline), so a kill
        # late in the run is healed and counted, and the old master is started again.
        while self.pending is not None:
            self.tick(orch)
            time.sleep(0.05)

    def stop(self):
        for proc in self.servers.values():
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            proc.wait()


class RespError(str):
    """An error reply of a Redis server (resp_call returns it; it does not raise)."""


def _resp_read(f):
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise OSError("connection closed mid-reply")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        return RespError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        if len(data) != n + 2:
            raise OSError("connection closed mid-reply")
        return data[:-2].decode(errors="surrogateescape")
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_resp_read(f) for _ in range(n)]
    raise OSError(f"not a RESP2 reply: {line[:60]!r}")


def resp_call(port, *args, timeout=2.0):
    """One command to the Redis server on 127.0.0.1:`port` over a fresh connection (RESP2);
    returns the reply: str, int, None, a list, or a RespError. OSError if the server does not
    answer. The cluster store's own control (polled while a fault heals): a socket, not a
    redis-cli process per poll, to keep a 2-core machine quiet."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a.encode(errors="surrogateescape") if isinstance(a, str) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        c.sendall(b"".join(out))
        with c.makefile("rb") as f:
            return _resp_read(f)


def crc16_xmodem(data):
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def cluster_key_slot(key):
    """Redis Cluster's hash slot of `key`: of the part between the first '{' and the next '}'
    when it is not empty, else of the whole key."""
    b = key.encode()
    i = b.find(b"{")
    if i >= 0:
        j = b.find(b"}", i + 1)
        if j > i + 1:
            b = b[i + 1:j]
    return crc16_xmodem(b) % 16384


def redis_lease_key(prefix, key):
    """The grant's hash of lease `key` (RedisBackend::LeaseKeyName): "<prefix>:{<hex key>}"."""
    return f"{prefix}:{{{key.encode().hex()}}}"


def redis_data_key(key):
    """The workers' data key of lease `key` named with Lease::DataKey, as every Redis store
    names data it keeps beside a grant: "{<hex key>}:chaos:chaos-data/<key>" (the hash tag, then
    the URL's prefix=chaos), in the lease's hash slot (a Redis Cluster refuses a fenced write of
    a data key in another slot)."""
    return "{" + key.encode().hex() + "}:chaos:" + native_data_key("redis", key)


def redis_native_names(key):
    """Where the audit looks for lease `key`'s data on a single Redis server (redis://,
    Sentinel), first found wins: the Lease::DataKey name (redis_data_key), then the plain
    "chaos-data/<key>" that a chaos_worker built before its NativeWriter named its data with
    Lease::DataKey writes (only one of them exists: every run starts an empty server). A
    cluster has only the first: it refuses a fenced write of a key outside the lease's slot."""
    return (redis_data_key(key), native_data_key("redis", key))


def _info_fields(text):
    out = {}
    for line in (text or "").splitlines():
        k, sep, v = line.strip().partition(":")
        if sep:
            out[k] = v
    return out


class RedisClusterStore(StoreControl):
    """redis+cluster://: a Redis Cluster of 3 masters and 3 replicas (one each), every node a
    redis-server in cluster mode on a free loopback port with its own cluster bus port and data
    directory (AOF, appendfsync always), cluster-node-timeout 1000 ms,
    cluster-replica-validity-factor 0 and repl-ping-replica-period 1 (as
    tests/testing/redis_cluster.cc starts them), joined by `redis-cli --cluster create
    --cluster-replicas 1`. Ready when every node says cluster_state:ok with all slots and all 6
    nodes known, every node's CLUSTER SLOTS names the same masters with one replica each, and
    every replica's link is up (each master sees its replica online). The workers open
    redis+cluster://<the 3 masters at start>?prefix=chaos&min_replicas=N&replica_timeout=200ms,
    min_replicas=1 unless --cluster-min-replicas says otherwise. No proxy: the workers reach
    every node.

    Server faults, on the hash slot of one of the scenario's lease keys (their grant hashes are
    "chaos:{<hex key>}"):
      master-kill  kill -9 of the slot's master (a key chosen at random); its replica takes
                   over (~2-3 s). Once a live node's CLUSTER SLOTS names another master for the
                   slot (or after 30 s), the killed node is started again on its port and data
                   (store-heal); it rejoins as a replica of the new master. busy() until the
                   whole cluster is ready again (store-ready, at most 30 s more), so that the
                   next fault never finds a master without a synced replica.
      reshard      moves the slot of a key (one a worker holds, if any) to another master, as
                   `redis-cli --cluster reshard` does for one slot: CLUSTER SETSLOT IMPORTING on
                   the target, MIGRATING on the source, then one key per step (every
                   RESHARD_STEP_MS: workers see ASK and TRYAGAIN while the lease's keys are
                   split) CLUSTER GETKEYSINSLOT + MIGRATE ... KEYS until none are left, then
                   CLUSTER SETSLOT NODE on every master (store-heal); busy() until every node
                   agrees (store-ready)."""

    scheme = "redis-cluster"
    server_faults = ("master-kill", "reshard")
    min_replicas = 1
    MASTERS = 3
    REPLICAS = 1  # per master
    NODE_TIMEOUT_MS = 1000
    RESHARD_STEP_MS = 40
    RESHARD_MAX_ERRORS = 20
    POLL_NS = 50 * MS  # how often tick() polls the nodes while a fault heals

    def start(self, run_dir):
        self.procs = {}  # port -> Popen
        try:
            self._start(run_dir)
        except BaseException:
            self.stop()  # main() stops only a store that started
            raise

    def _start(self, run_dir):
        self.dir = os.path.join(run_dir, "cluster")
        os.makedirs(self.dir)
        self.pending = None  # the fault being healed (a dict, see inject)
        self.next_poll = 0
        self.bus = {}  # port -> cluster bus port
        n = self.MASTERS * (1 + self.REPLICAS)
        used = {6379, 16379}
        ports = []
        while len(ports) < 2 * n:
            p = free_port()
            if p not in used:
                used.add(p)
                ports.append(p)
        self.ports = ports[:n]
        for port, bus in zip(self.ports, ports[n:]):
            self.bus[port] = bus
            self._launch(port)
        deadline = time.time() + 10
        for port in self.ports:
            while self._call(port, "PING") != "PONG":
                if time.time() > deadline or self.procs[port].poll() is not None:
                    raise SystemExit(f"chaos: redis-server (cluster node) did not come up on "
                                     f"port {port}, see {self._node_dir(port)}/redis.log")
                time.sleep(0.02)
        r = subprocess.run(["redis-cli", "--cluster", "create"] +
                           [f"127.0.0.1:{p}" for p in self.ports] +
                           ["--cluster-replicas", str(self.REPLICAS), "--cluster-yes"],
                           capture_output=True, text=True, timeout=60)
        with open(os.path.join(self.dir, "create.log"), "w") as f:
            f.write(r.stdout + r.stderr)
        if r.returncode != 0 or "[OK] All 16384 slots covered" not in r.stdout:
            raise SystemExit(f"chaos: redis-cli --cluster create failed (rc {r.returncode}), "
                             f"see {self.dir}/create.log")
        deadline = time.time() + 30
        why = self._why_not_ready()
        while why and time.time() < deadline:
            time.sleep(0.05)
            why = self._why_not_ready()
        if why:
            raise SystemExit(f"chaos: the cluster was not ready within 30 s: {why} (logs in "
                             f"{self.dir})")
        # The seeds: the masters at start, in slot order (they stay the seeds after failovers).
        self.seeds = []
        for first, last, master, _, _ in self._slots():
            if master not in self.seeds:
                self.seeds.append(master)

    def _node_dir(self, port):
        return os.path.join(self.dir, f"redis-{port}")

    def _launch(self, port):
        d = self._node_dir(port)
        os.makedirs(d, exist_ok=True)
        log = open(os.path.join(d, "redis.log"), "ab")
        self.procs[port] = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", d,
             "--save", "", "--appendonly", "yes", "--appendfsync", "always",
             "--repl-diskless-sync-delay", "0", "--cluster-enabled", "yes",
             "--cluster-config-file", os.path.join(d, "nodes.conf"),
             "--cluster-node-timeout", str(self.NODE_TIMEOUT_MS),
             "--cluster-port", str(self.bus[port]), "--cluster-replica-validity-factor", "0",
             "--repl-ping-replica-period", "1", "--daemonize", "no"],
            stdout=log, stderr=log, start_new_session=True)
        log.close()

    def _alive(self, port):
        return self.procs[port].poll() is None

    def _call(self, port, *args, timeout=2.0):
        """resp_call, None when the node does not answer."""
        try:
            return resp_call(port, *args, timeout=timeout)
        except OSError:
            return None

    def _slots(self, port=None):
        """CLUSTER SLOTS of the node on `port` (else of the first live node that answers) as
        sorted (first, last, master port, master id, sorted replica ports); [] if none
        answers."""
        for p in [port] if port else [q for q in self.ports if self._alive(q)]:
            reply = self._call(p, "CLUSTER", "SLOTS")
            if not isinstance(reply, list):
                continue
            out = []
            for r in reply:
                master = r[2]
                out.append((int(r[0]), int(r[1]), int(master[1]), master[2],
                            sorted(int(n[1]) for n in r[3:])))
            return sorted(out)
        return []

    def _master_of(self, slot, ranges=None):
        for first, last, master, _, _ in ranges if ranges is not None else self._slots():
            if first <= slot <= last:
                return master
        return None

    def _why_not_ready(self):
        """What the cluster still lacks (as tests/testing/redis_cluster.cc's WhyNotReady), or ""
        when every node is up and agrees, and every replica is in sync."""
        first_map = None
        masters = set()
        for port in self.ports:
            if not self._alive(port):
                return f"node {port} is down"
            info = _info_fields(self._call(port, "CLUSTER", "INFO"))
            if (info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384" or
                    info.get("cluster_known_nodes") != str(len(self.ports))):
                return (f"node {port}: cluster_state={info.get('cluster_state')} "
                        f"slots_ok={info.get('cluster_slots_ok')} "
                        f"known_nodes={info.get('cluster_known_nodes')}")
            ranges = self._slots(port)
            # Replicas included: each node learns who replicates whom by gossip, a little
            # after the replica's link is up.
            m = [(a, b, mp, reps) for a, b, mp, _, reps in ranges]
            if first_map is None:
                first_map = m
            elif m != first_map:
                return f"node {port} has another slot map"
            masters = {mp for _, _, mp, _ in m}
            if len(masters) != self.MASTERS or any(len(reps) != self.REPLICAS
                                                   for _, _, _, reps in m):
                return f"node {port} lists masters/replicas {sorted(masters)} {m[:3]}"
            repl = self._call(port, "INFO", "replication") or ""
            role = _info_fields(repl).get("role")
            if role == "slave" and _info_fields(repl).get("master_link_status") != "up":
                return f"replica {port}: master_link_status " \
                       f"{_info_fields(repl).get('master_link_status')}"
            if role == "master" and port in masters and \
                    repl.count("state=online") < self.REPLICAS:
                return f"master {port}: its replica is not online"
        return ""

    def url(self):
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.seeds)
        return (f"redis+cluster://{hosts}?prefix=chaos&min_replicas={self.min_replicas}"
                f"&replica_timeout=200ms")

    def read_native(self, keys):
        # With redis-cli -c from the slot's master (it follows a MOVED or ASK, should the map
        # have changed since). A master killed just before the wind-down may still be failing
        # over: up to 20 s for a live master of the slot that answers.
        out = {}
        for k in keys:
            name = redis_data_key(k)
            deadline = time.time() + 20
            while True:
                port = self._master_of(cluster_key_slot(name))
                r = None
                if port is not None and self._alive(port):
                    r = subprocess.run(["redis-cli", "-c", "-h", "127.0.0.1", "-p", str(port),
                                        "--raw", "GET", name], capture_output=True, text=True,
                                       timeout=20)
                    if r.returncode == 0 and not r.stdout.startswith(
                            ("MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN", "ERR")):
                        break
                if time.time() > deadline:
                    raise RuntimeError(f"redis-cli -c GET {name}: no answer from the master of "
                                       f"its slot ({port}): "
                                       f"{(r.stdout + r.stderr).strip() if r else 'down'}")
                time.sleep(0.1)
            v = r.stdout.rstrip("\n")
            out[k] = v if v else None
        return out

    # ---- faults ----

    def inject(self, fault, ttl_ns, orch):
        why = self._why_not_ready()
        if why:  # only a whole, settled cluster is hurt
            orch.log("store-fault-skipped", kind=fault, why=re.sub(r"\s+", "_", why))
            return False
        ranges = self._slots()
        if fault == "master-kill":
            key = orch.rng.choice(orch.sc["keys"])
            slot = cluster_key_slot(redis_lease_key("chaos", key))
            port = self._master_of(slot, ranges)
            if port is None or port not in self.procs or not self._alive(port):
                return False
            self.procs[port].kill()
            self.procs[port].wait()
            t = now_ns()
            self.pending = dict(kind=fault, phase="failover", port=port, slot=slot, t0=t,
                                deadline=t + 30 * 10**9)
            orch.log("store-fault", kind=fault, dur_ms=0, port=port, slot=slot, key=key)
            return True
        if fault != "reshard":
            raise ValueError(fault)
        # Orchestrator.holding: worker -> the "key=<key>" field of its latest acquired line.
        held = sorted({k.partition("=")[2] if k.startswith("key=") else k
                       for k in orch.holding.values() if k} & set(orch.sc["keys"]))
        key = orch.rng.choice(held or orch.sc["keys"])
        slot = cluster_key_slot(redis_lease_key("chaos", key))
        src = self._master_of(slot, ranges)
        others = sorted({m for _, _, m, _, _ in ranges} - {src})
        if src is None or not others:
            return False
        dst = orch.rng.choice(others)
        src_id, dst_id = self._call(src, "CLUSTER", "MYID"), self._call(dst, "CLUSTER", "MYID")
        # The target first, as redis-cli does: once the source says ASK, the target must accept.
        r1 = self._call(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        r2 = self._call(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id) if r1 == "OK" \
            else None
        if r1 != "OK" or r2 != "OK":
            for p in (src, dst):
                self._call(p, "CLUSTER", "SETSLOT", slot, "STABLE")
            orch.log("store-fault-failed", kind=fault, slot=slot, importing=r1, migrating=r2)
            return False
        t = now_ns()
        self.pending = dict(kind=fault, phase="migrate", slot=slot, src=src, dst=dst,
                            dst_id=dst_id, t0=t, next_step=t + self.RESHARD_STEP_MS * MS,
                            moved=0, steps=0)
        orch.log("store-fault", kind=fault, dur_ms=0, slot=slot, from_port=src, to_port=dst,
                 key=key)
        return True

    def _migrate_step(self, count):
        """Moves up to `count` keys of the pending reshard's slot; returns how many were listed
        (0: none left on the source), or an error text."""
        p = self.pending
        keys = self._call(p["src"], "CLUSTER", "GETKEYSINSLOT", p["slot"], count)
        if not isinstance(keys, list):
            return f"GETKEYSINSLOT: {keys}"
        if not keys:
            return 0
        # Database 0 (the only one in a cluster), no REPLACE: a key on both sides is an error.
        r = self._call(p["src"], "MIGRATE", "127.0.0.1", p["dst"], "", 0, 5000, "KEYS", *keys,
                       timeout=10)
        if r not in ("OK", "NOKEY"):
            return f"MIGRATE: {r}"
        p["moved"] += len(keys)
        p["steps"] += 1
        return len(keys)

    def _finish_reshard(self, orch):
        p = self.pending
        s = p["slot"]
        left = self._call(p["src"], "CLUSTER", "COUNTKEYSINSLOT", s)
        if left != 0:
            return f"{left} keys left on {p['src']}"
        # The target first (it bumps its config epoch), then the source, then the other masters.
        masters = {m for _, _, m, _, _ in self._slots()}
        order = [p["dst"], p["src"]] + sorted(masters - {p["dst"], p["src"]})
        for port in order:
            r = self._call(port, "CLUSTER", "SETSLOT", s, "NODE", p["dst_id"])
            if r != "OK":
                return f"SETSLOT NODE on {port}: {r}"
        t = now_ns()
        orch.log("store-heal", kind="reshard", slot=s, from_port=p["src"], to_port=p["dst"],
                 keys=p["moved"], took_ms=(t - p["t0"]) // MS)
        p.update(phase="settle", deadline=t + 30 * 10**9)
        return ""

    def _reshard_error(self, orch, what):
        """Logs a failed step of the reshard (it is tried again); gives up on the run after
        RESHARD_MAX_ERRORS: the harness, not the library, failed."""
        p = self.pending
        p["errors"] = p.get("errors", 0) + 1
        orch.log("store-fault-error", kind="reshard", slot=p["slot"],
                 what=re.sub(r"\s+", "_", str(what)))
        if p["errors"] >= self.RESHARD_MAX_ERRORS:
            raise SystemExit(f"chaos: reshard of slot {p['slot']} from {p['src']} to "
                             f"{p['dst']} failed: {what} (logs in {self.dir})")

    def busy(self):
        return self.pending is not None

    def tick(self, orch):
        p = self.pending
        if p is None:
            return
        t = now_ns()
        if p["kind"] == "reshard" and p["phase"] == "migrate":
            if t < p["next_step"]:
                return
            p["next_step"] = t + self.RESHARD_STEP_MS * MS
            n = self._migrate_step(1)
            if isinstance(n, str):
                self._reshard_error(orch, n)
            elif n == 0 or p["steps"] > 1000:
                err = self._finish_reshard(orch)
                if err:
                    self._reshard_error(orch, err)
            return
        if t < self.next_poll:
            return
        self.next_poll = t + self.POLL_NS
        if p["phase"] == "failover":
            new = None
            for port in self.ports:
                if port != p["port"] and self._alive(port):
                    m = self._master_of(p["slot"], self._slots(port))
                    if m is not None and m != p["port"]:
                        new = m
                        break
            if new is None and t < p["deadline"]:
                return
            self._launch(p["port"])
            orch.log("store-heal", kind="master-kill", port=p["port"], new_master=new,
                     failover_ms=(t - p["t0"]) // MS)
            p.update(phase="rejoin", t1=t, deadline=t + 30 * 10**9)
            return
        # rejoin (master-kill) or settle (reshard): the whole cluster agrees and is in sync.
        why = self._why_not_ready()
        if not why or t > p["deadline"]:
            fields = dict(kind=p["kind"], ready_ms=(t - p.get("t1", p["t0"])) // MS)
            if why:
                fields["not_ready"] = re.sub(r"\s+", "_", why)
            orch.log("store-ready" if not why else "store-not-ready", **fields)
            self.pending = None

    def heal(self, orch):
        # Wind-down: a reshard still moving keys is finished at once; a killed master is started
        # again if its failover is done (one tick; no waiting here, paused workers wait on us).
        # Then the error replies the nodes sent (INFO errorstats, summed over the live nodes,
        # each counted since its last start): ASK, TRYAGAIN and MOVED show that the workers met
        # the reshards and failovers; the checker prints them as store_errors.
        errors = {}
        for port in self.ports:
            if self._alive(port):
                for k, v in _info_fields(self._call(port, "INFO", "errorstats")).items():
                    if k.startswith("errorstat_"):
                        n = int(v.partition("count=")[2].split(",")[0] or 0)
                        errors[k[len("errorstat_"):]] = errors.get(k[len("errorstat_"):], 0) + n
        orch.log("store-errors", **{k: v for k, v in sorted(errors.items())})
        p = self.pending
        while p is not None and p["kind"] == "reshard" and p["phase"] == "migrate":
            n = self._migrate_step(100)
            if isinstance(n, str):
                self._reshard_error(orch, n)
            elif n == 0:
                err = self._finish_reshard(orch)
                if err:
                    self._reshard_error(orch, err)
        if p is not None and p["phase"] == "failover":
            self.next_poll = 0
            self.tick(orch)

    def stop(self):
        for proc in self.procs.values():
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            proc.wait()
        self.procs = {}


class EtcdStore(RedisStore):
    """etcd://: a throwaway single-member etcd (/usr/bin/etcd) on free loopback client and peer
    ports (never 2379/2380), its data directory in the run directory, reached through a
    FaultProxy. etcd keeps no lease shorter than 2 s, so the harness's TTL defaults to 2000 ms
    for this store (a shorter --ttl-ms would be granted as 2 s and the pauses, scaled from the
    requested TTL, would never outlast it).

    Server faults, as RedisStore's: store-pause SIGSTOPs etcd; store-restart kill -9s it and
    restarts it on the same ports and data (etcd restores its leases with a fresh TTL)."""

    scheme = "etcd"
    default_ttl_ms = 2000

    def start(self, run_dir):
        self.dir = os.path.join(run_dir, "etcd")
        os.makedirs(self.dir)
        self.port = free_port()
        self.peer_port = free_port()
        while self.port in (2379, 2380) or self.peer_port in (2379, 2380, self.port):
            self.port, self.peer_port = free_port(), free_port()
        self._launch()
        self.proxy = FaultProxy(self.port)
        self.undo = []

    def _launch(self):
        self.log_f = open(os.path.join(self.dir, "etcd.log"), "ab")
        client = f"http://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.proc = subprocess.Popen(
            ["/usr/bin/etcd", "--name", "chaos", "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"chaos={peer}", "--initial-cluster-state", "new"],
            stdout=self.log_f, stderr=self.log_f, start_new_session=True)
        deadline = time.time() + 20
        env = dict(os.environ, ETCDCTL_API="3")
        while time.time() < deadline and self.proc.poll() is None:
            r = subprocess.run(["/usr/bin/etcdctl", f"--endpoints=127.0.0.1:{self.port}",
                                "--dial-timeout=1s", "--command-timeout=2s", "endpoint",
                                "health"], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
            if r.returncode == 0:
                return
            time.sleep(0.05)
        raise SystemExit(f"chaos: etcd did not come up on port {self.port}, see "
                         f"{self.dir}/etcd.log")

    def url(self):
        return f"etcd://127.0.0.1:{self.proxy.port}?prefix=chaos&command_timeout=500ms"

    def read_native(self, keys):
        env = dict(os.environ, ETCDCTL_API="3")
        out = {}
        for k in keys:
            r = subprocess.run(["/usr/bin/etcdctl", f"--endpoints=127.0.0.1:{self.port}",
                                "--command-timeout=5s", "get", native_data_key(self.scheme, k),
                                "--print-value-only"], env=env, capture_output=True, text=True,
                               timeout=20)
            if r.returncode != 0:
                raise RuntimeError(f"etcdctl get failed: {r.stderr.strip()}")
            v = r.stdout.rstrip("\n")
            out[k] = v if v else None
        return out


class ZkStore(RedisStore):
    """zk://: a throwaway standalone ZooKeeper 3.8 (a JVM, -Xmx128m) as
    tests/testing/zk_server.cc starts it: zoo.cfg in a temporary directory of its own, a free
    127.0.0.1 port (never 2181), tickTime 100 ms so that the default 500 ms TTL is a 500 ms
    session (the shortest is two ticks), and the workers reach it through a FaultProxy.

    Server faults, as RedisStore's: store-pause SIGSTOPs the JVM; store-restart kill -9s it and
    starts it again on the same port and data (sessions and their ephemeral nodes come back
    from the transaction log; a holder cut off past its TTL has lost its lease by then, and its
    handle deletes the node if the session survived)."""

    scheme = "zk"
    quick_scale = 0.7  # a JVM start per scenario (and per restart): keeps --quick near 60 s
    CLASSPATH = ("/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:"
                 "/usr/share/java/log4j-1.2.jar")

    # zoo.cfg: a subclass may change these (tests/cli/check_test.py's Zk2000Store).
    TICK_MS = 100
    FOUR_LETTER_WORDS = "ruok,srvr"
    EXTRA_CFG = "maxSessionTimeout=120000\nforceSync=no\n"
    DIR_PREFIX = "leasehold-chaos-zk-"

    def configure(self):
        """Makes the server's directory, port, zoo.cfg and log4j.properties."""
        self.dir = tempfile.mkdtemp(prefix=self.DIR_PREFIX)
        os.makedirs(os.path.join(self.dir, "data"))
        self.port = free_port()
        while self.port in (2181, 2888, 3888, 8080):
            self.port = free_port()
        with open(os.path.join(self.dir, "zoo.cfg"), "w") as f:
            f.write(f"tickTime={self.TICK_MS}\ninitLimit=10\nsyncLimit=5\n"
                    f"dataDir={self.dir}/data\nclientPort={self.port}\n"
                    "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
                    f"4lw.commands.whitelist={self.FOUR_LETTER_WORDS}\nmaxClientCnxns=0\n"
                    f"{self.EXTRA_CFG}preAllocSize=1024\n")
        with open(os.path.join(self.dir, "log4j.properties"), "w") as f:
            f.write("log4j.rootLogger=WARN, CONSOLE\n"
                    "log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n"
                    "log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n"
                    "log4j.appender.CONSOLE.layout.ConversionPattern=%d %-5p %c{1} - %m%n\n")

    def start(self, run_dir):
        self.run_dir = run_dir
        self.configure()
        self._launch()
        self.proxy = FaultProxy(self.port)
        self.undo = []

    def _launch(self):
        self.log_f = open(os.path.join(self.dir, "zookeeper.log"), "ab")
        self.proc = subprocess.Popen(
            ["java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             f"-Dlog4j.configuration=file:{self.dir}/log4j.properties", "-cp", self.CLASSPATH,
             "org.apache.zookeeper.server.quorum.QuorumPeerMain",
             os.path.join(self.dir, "zoo.cfg")],
            stdout=self.log_f, stderr=self.log_f, cwd=self.dir, start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline and self.proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as c:
                    c.sendall(b"srvr")
                    if b"Mode:" in c.recv(4096):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise SystemExit(f"chaos: ZooKeeper did not come up on port {self.port}, see "
                         f"{self.dir}/zookeeper.log")

    def url(self):
        return f"zk://127.0.0.1:{self.proxy.port}/chaos"

    def read_native(self, keys):
        # zkCli (ZooKeeperMain, one JVM per key): `get` prints the node's data on a line of its
        # own; a missing node says "Node does not exist".
        out = {}
        for k in keys:
            path = "/chaos" + native_data_key(self.scheme, k)
            r = subprocess.run(
                ["java", "-Xmx64m", "-XX:TieredStopAtLevel=1",
                 f"-Dlog4j.configuration=file:{self.dir}/log4j.properties", "-cp",
                 self.CLASSPATH, "org.apache.zookeeper.ZooKeeperMain", "-server",
                 f"127.0.0.1:{self.port}", "get", path],
                capture_output=True, text=True, timeout=60)
            text = r.stdout + r.stderr
            if "Node does not exist" in text:
                out[k] = None
                continue
            vals = [line.strip() for line in r.stdout.splitlines()
                    if NATIVE_VALUE_RE.fullmatch(line.strip())]
            if not vals:
                raise RuntimeError(f"zkCli get {path}: no value in its output (rc "
                                   f"{r.returncode}): {text.strip()[-200:]}")
            out[k] = vals[-1]
        return out

    def stop(self):
        super().stop()
        try:
            shutil.copy(os.path.join(self.dir, "zookeeper.log"),
                        os.path.join(self.run_dir, "zookeeper.log"))
        except OSError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


# --guard native: where the workers write (chaos_worker.cc, NativeWriter) and what.
NATIVE_SQL_TABLE = "CREATE TABLE IF NOT EXISTS chaos_data(k TEXT PRIMARY KEY, v TEXT NOT NULL)"
NATIVE_VALUE_RE = re.compile(r"(\d+):(w\d+):(\d+)")  # token:writer:seq
NATIVE_AUDIT = "native-audit.txt"


def native_data_key(scheme, key):
    """The data key of lease `key`: the SQL row's k, the ZooKeeper node (under the chroot),
    or the key-value store's key."""
    if scheme.startswith(("sqlite", "postgres")):
        return key
    return "/chaos-data-" + key if scheme == "zk" else "chaos-data/" + key


STORES = {"sqlite": SqliteStore, "redis": RedisStore, "redis-fair": RedisFairStore,
          "redis-evict": RedisEvictStore,
          "redis-sentinel": RedisSentinelStore, "redis-cluster": RedisClusterStore,
          "postgres": PostgresStore,
          "postgres-table": PostgresTableStore, "postgres-ha": PostgresHaStore,
          "postgres-ha-table": PostgresHaTableStore, "etcd": EtcdStore, "zk": ZkStore}


# ---- scenarios ----------------------------------------------------------------------------

# Fault weights per scenario: pause-check (SIGUSR1: the holder stops itself right after a
# validity check, before the write), pause (external SIGSTOP of a holder, at a random point),
# kill (SIGKILL of a holder, or of any worker: mid-acquire, mid-renew).
SCENARIOS = {
    "pause-hot": dict(keys=["hot"], faults={"pause-check": 5, "pause": 3, "kill": 2},
                      quick_s=18, needs_stale=True),
    "kill-multi": dict(keys=["k0", "k1", "k2"], faults={"kill": 5, "pause": 3, "pause-check": 2},
                       quick_s=12, needs_stale=False),
    # Server and network faults, for stores with a server (StoreControl.server_faults).
    "store-faults": dict(keys=["hot", "k1"],
                         faults={"pause-check": 2, "pause": 1, "kill": 1, "store-pause": 2,
                                 "store-restart": 1, "proxy-blackhole": 2, "proxy-reset": 1,
                                 "proxy-delay": 2, "master-kill": 2, "reshard": 2,
                                 "switchover": 2, "primary-kill": 2, "primary-partition": 2},
                         quick_s=18, needs_stale=False, server=True),
    # The same server faults with no worker paused or killed, on 8 keys (holders that outlive a
    # failover, and grants often enough that some fall into a fault: the PostgreSQL HA negative
    # control).
    "failovers": dict(keys=[f"f{i}" for i in range(8)],
                      faults={"store-pause": 1, "store-restart": 1, "proxy-blackhole": 1,
                              "proxy-reset": 1, "proxy-delay": 1, "master-kill": 1, "reshard": 1,
                              "switchover": 1, "primary-kill": 1, "primary-partition": 1},
                      quick_s=18, needs_stale=False, server=True),
    "calm": dict(keys=["hot", "k1"], faults={}, quick_s=5, needs_stale=False),
    # The application fills the cache beside 4 contended leases (RedisEvictStore), no worker
    # faults: every overlap is the store's doing.
    "eviction": dict(keys=[f"e{i}" for i in range(4)], faults={"cache-fill": 1}, quick_s=12,
                     needs_stale=False, server=True),
}


# The fenced register's tables (the same as tests/chaos/fenced_register.cc creates).
REGISTER_SCHEMA = """
CREATE TABLE IF NOT EXISTS reg(key TEXT PRIMARY KEY, max_token INTEGER NOT NULL,
  value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS writes(id INTEGER PRIMARY KEY, key TEXT NOT NULL,
  token INTEGER NOT NULL, writer TEXT NOT NULL, max_before INTEGER NOT NULL,
  accepted INTEGER NOT NULL, t_commit_ns INTEGER NOT NULL);
"""


# ---- orchestrator -------------------------------------------------------------------------


def read_new_lines(path, offsets, name):
    """The complete lines appended to `path` since the last call for `name` (offsets[name])."""
    try:
        with open(path, "rb") as f:
            f.seek(offsets.get(name, 0))
            data = f.read()
    except FileNotFoundError:
        return []
    end = data.rfind(b"\n")
    if end < 0:
        return []
    offsets[name] = offsets.get(name, 0) + end + 1
    return data[: end + 1].decode(errors="replace").splitlines()


class Orchestrator:
    def __init__(self, args, store, scenario, run_dir, rng, worker_flags, scenarios=SCENARIOS):
        self.args = args
        self.store = store
        self.sc = scenarios[scenario]
        self.run_dir = run_dir
        self.rng = rng
        self.ttl_ns = args.ttl_ms * MS
        self.worker_flags = worker_flags
        self.log_f = open(os.path.join(run_dir, "orch.log"), "a", buffering=1)
        self.procs = {}  # pid -> (Popen, worker id)
        self.stopped = {}  # pid -> cont_at_ns
        self.pause_req = {}  # pid -> (requested_at_ns, duration_ns)
        self.holding = {}  # worker id -> key or None, from tailing the worker logs
        self.offsets = {}  # worker id -> bytes read of its log
        self.next_id = 0
        self.deferred = 0  # workers to start once the store can take them (spawn_ready)

    def log(self, event, **fields):
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        self.log_f.write(f"{now_ns()} orch {event} {extra}\n")

    def spawn(self, end_ns):
        wid = f"w{self.next_id}"
        self.next_id += 1
        dur_ms = max(0, (end_ns - now_ns()) // MS)
        cmd = [self.args.worker, f"--store={self.worker_url(wid)}",
               f"--keys={','.join(self.sc['keys'])}",
               f"--register={os.path.join(self.run_dir, 'register.db')}",
               f"--log={os.path.join(self.run_dir, wid + '.log')}", f"--id={wid}",
               f"--ttl-ms={self.args.ttl_ms}", f"--duration-ms={dur_ms}",
               f"--hold-min-ms={self.args.hold_min_ms}", f"--hold-max-ms={self.args.hold_max_ms}",
               f"--write-gap-ms={self.args.write_gap_ms}", f"--idle-max-ms={self.args.idle_max_ms}", f"--wait-ms={4 * self.args.ttl_ms}",
               f"--seed={self.rng.getrandbits(63)}"] + self.worker_flags
        if self.args.limit > 1:
            cmd.append(f"--limit={self.args.limit}")
        if self.args.ignore_sigpipe:
            cmd.append("--ignore-sigpipe=1")
        cmd = self.wrap_worker(wid, cmd)
        err = open(os.path.join(self.run_dir, wid + ".stderr"), "wb")
        p = subprocess.Popen(cmd, stdout=err, stderr=err, start_new_session=True,
                             preexec_fn=self.worker_preexec)
        err.close()
        self.procs[p.pid] = (p, wid)
        self.holding[wid] = None
        self.log("spawn", pid=p.pid, worker=wid)

    # Hooks for tests/partition/partition.py: each worker's own store URL (its endpoint
    # order), its command wrapped (`ip netns exec NS ...`, which execs, so the pid is still the
    # worker's) and a function run in the child before exec.
    def worker_url(self, wid):
        return self.store.url()

    def wrap_worker(self, wid, cmd):
        return cmd

    worker_preexec = None

    def tail_logs(self):
        for _, wid in list(self.procs.values()):
            for line in read_new_lines(os.path.join(self.run_dir, wid + ".log"), self.offsets,
                                       wid):
                parts = line.split()
                if len(parts) < 3:
                    continue
                ev = parts[2]
                if ev == "acquired":
                    self.holding[wid] = parts[3]
                elif ev in ("release-sent", "lost", "invalid", "exit"):
                    self.holding[wid] = None

    @staticmethod
    def proc_state(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError, ProcessLookupError):
            return "?"

    def signal(self, pid, sig):
        try:
            os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False

    def reap(self, end_ns, respawn):
        for pid, (p, wid) in list(self.procs.items()):
            if p.poll() is not None:
                del self.procs[pid]
                self.stopped.pop(pid, None)
                self.pause_req.pop(pid, None)
                self.log("exited", pid=pid, worker=wid, rc=p.returncode)
                if respawn and now_ns() < end_ns - self.ttl_ns:
                    self.deferred += 1
        # (getattr: tests/partition/partition.py's clusters are no StoreControl.)
        while self.deferred and respawn and now_ns() < end_ns - self.ttl_ns and \
                getattr(self.store, "spawn_ready", lambda: True)():
            self.deferred -= 1
            self.spawn(end_ns)

    def live(self):
        return [pid for pid in self.procs if pid not in self.stopped and pid not in self.pause_req]

    def holders(self):
        return [pid for pid in self.live() if self.holding.get(self.procs[pid][1])]

    def inject(self, end_ns):
        faults = {k: w for k, w in self.sc["faults"].items()
                  if k in ("pause", "pause-check", "kill") or k in self.store.server_faults}
        kind = self.rng.choices(list(faults), weights=list(faults.values()))[0]
        holders = self.holders()
        if kind in ("pause", "pause-check"):
            if len(self.stopped) + len(self.pause_req) >= self.args.workers - 1 or not holders:
                return
            pid = self.rng.choice(holders)
            dur = int(self.rng.uniform(0.5, 5.0) * self.ttl_ns)
            wid = self.procs[pid][1]
            if kind == "pause":
                if self.signal(pid, signal.SIGSTOP):
                    self.stopped[pid] = now_ns() + dur
                    self.log("stop", pid=pid, worker=wid, kind="external", dur_ms=dur // MS)
            else:
                if self.signal(pid, signal.SIGUSR1):
                    self.pause_req[pid] = (now_ns(), dur)
                    self.log("pause-request", pid=pid, worker=wid, dur_ms=dur // MS)
        elif kind == "kill":
            pool = holders if holders and self.rng.random() < 0.8 else self.live()
            if not pool:
                return
            pid = self.rng.choice(pool)
            wid = self.procs[pid][1]
            self.log("kill", pid=pid, worker=wid, holding=self.holding.get(wid) or "-")
            self.signal(pid, signal.SIGKILL)
            self.stopped.pop(pid, None)
        elif kind in self.store.server_faults:
            if self.store.busy():
                return
            self.store.inject(kind, self.ttl_ns, self)
        self.faults += 1

    def service_pauses(self):
        t = now_ns()
        for pid, cont_at in list(self.stopped.items()):
            if t >= cont_at:
                self.signal(pid, signal.SIGCONT)
                del self.stopped[pid]
                self.log("cont", pid=pid, worker=self.procs[pid][1] if pid in self.procs else "?")
        for pid, (req_at, dur) in list(self.pause_req.items()):
            if self.proc_state(pid) == "T":
                del self.pause_req[pid]
                self.stopped[pid] = now_ns() + dur
                self.log("stop", pid=pid, worker=self.procs[pid][1], kind="self", dur_ms=dur // MS)
            elif t - req_at > 20 * self.ttl_ns:
                # Still not at a pause point (waiting to acquire): give up on this one. The
                # flag stays set in the worker; if it stops later, the sweep below resumes it.
                del self.pause_req[pid]
        for pid in list(self.procs):
            if pid not in self.stopped and pid not in self.pause_req and \
                    self.proc_state(pid) == "T":
                dur = int(self.rng.uniform(0.5, 5.0) * self.ttl_ns)
                self.stopped[pid] = now_ns() + dur
                self.log("stop", pid=pid, worker=self.procs[pid][1], kind="self", dur_ms=dur // MS)

    def run(self, duration_s):
        self.faults = 0
        start = now_ns()
        end = start + int(duration_s * 1e9)
        self.end_ns = end  # the stores' inject() may look (PostgresHaStore: time for a failover)
        self.log("run-start", scenario=self.args.scenario_name, ttl_ms=self.args.ttl_ms,
                 end=end, store=self.store.scheme, guard=self.args.guard, limit=self.args.limit)
        if self.args.guard == "native":
            self.store.prepare_native(self.sc["keys"])
        else:
            # Create the register (and switch it to WAL) before the workers race to do it.
            db = sqlite3.connect(os.path.join(self.run_dir, "register.db"))
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(REGISTER_SCHEMA)
            db.close()
        for _ in range(self.args.workers):
            self.spawn(end)
        gap = self.args.fault_gap_ms * MS
        next_fault = start + self.ttl_ns + int(self.rng.uniform(0.5, 1.5) * gap)
        try:
            while now_ns() < end:
                self.tail_logs()
                self.service_pauses()
                self.store.tick(self)
                self.reap(end, respawn=True)
                if self.sc["faults"] and now_ns() >= next_fault and now_ns() < end - self.ttl_ns:
                    self.inject(end)
                    next_fault = now_ns() + int(self.rng.uniform(0.5, 1.5) * gap)
                time.sleep(0.005)
        finally:
            # Wind down: no more faults; resume everything; workers stop at their deadline.
            self.store.heal(self)
            for pid in list(self.stopped):
                self.signal(pid, signal.SIGCONT)
                self.log("cont", pid=pid, worker=self.procs.get(pid, (None, "?"))[1])
            self.stopped.clear()
            grace = now_ns() + 5 * self.ttl_ns + 5_000_000_000
            while self.procs and now_ns() < grace:
                self.service_pauses()
                for pid in list(self.stopped):
                    self.signal(pid, signal.SIGCONT)
                    del self.stopped[pid]
                self.reap(end, respawn=False)
                time.sleep(0.01)
            for pid, (p, wid) in list(self.procs.items()):
                self.log("final-kill", pid=pid, worker=wid)
                self.signal(pid, signal.SIGKILL)
                p.wait()
            self.log("run-end", faults=self.faults)
            self.log_f.close()


def audit_native(store, keys, run_dir):
    """--guard native: reads the final value of every data key with the store's own client
    (after the workers are gone, before the store stops) into run_dir/native-audit.txt:
    `audit ok` then `<key> <value or ->` lines, or `audit skipped <why>`."""
    try:
        values = store.read_native(keys)
        lines = ["audit ok"] + [f"{k} {values.get(k) or '-'}" for k in keys]
    except NotImplementedError as e:
        lines = [f"audit skipped {e}"]
    except (RuntimeError, OSError, subprocess.SubprocessError, sqlite3.Error) as e:
        lines = [f"audit failed {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]
    with open(os.path.join(run_dir, NATIVE_AUDIT), "w") as f:
        f.write("\n".join(lines) + "\n")


# ---- checker ------------------------------------------------------------------------------


def parse_line(line):
    parts = line.split()
    if len(parts) < 3:
        return None
    try:
        t = int(parts[0])
    except ValueError:
        return None
    f = {}
    for p in parts[3:]:
        k, _, v = p.partition("=")
        f[k] = v
    return t, parts[1], parts[2], f


def pct(values, q):
    if not values:
        return 0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class Grant:
    __slots__ = ("worker", "key", "token", "sent", "start", "su", "lost", "lost_reason",
                 "release", "release_result", "killed", "end", "invalid", "ended_known", "slot")

    def __init__(self, worker, key, token, sent, start, su, slot=0):
        self.worker, self.key, self.token, self.slot = worker, key, token, slot
        self.sent, self.start, self.su = sent, start, su
        self.lost = self.release = self.killed = self.invalid = None
        self.lost_reason = self.release_result = None
        self.ended_known = False


def check_limit(by_key, limit):
    """--limit N > 1: the semaphore's invariant, per key, over the validity windows.

    A sweep over window starts and ends (an end before a start at the same instant): a grant
    whose window opens while N others are open is over the limit; one whose slot an open window
    already has, or whose slot is not in 0..N-1, is a slot clash; two grants of a key with one
    fencing token are a token duplicate (the key's one counter is strictly increasing). Also
    returns the most windows open at once (over every key)."""
    over, clashes, dups, examples = 0, 0, 0, []
    max_open = 0
    for key, gs in by_key.items():
        seen = {}
        for g in gs:
            if g.token in seen:
                dups += 1
                examples.append(("token-dup", key, seen[g.token], g.worker, g.token))
            seen.setdefault(g.token, g.worker)
        edges = []
        for g in gs:
            if g.end > g.start:
                edges += [(g.start, 1, id(g), g), (g.end, 0, id(g), g)]
        edges.sort(key=lambda e: e[:3])
        open_ = {}
        for _, is_start, gid, g in edges:
            if not is_start:
                open_.pop(gid, None)
                continue
            if len(open_) >= limit:
                over += 1
                examples.append(("over-limit", key, g.worker, g.token, len(open_) + 1,
                                 sorted(h.worker for h in open_.values())))
            if not 0 <= g.slot < limit or any(h.slot == g.slot for h in open_.values()):
                clashes += 1
                examples.append(("slot-clash", key, g.worker, g.token, g.slot,
                                 [(h.worker, h.slot) for h in open_.values()]))
            open_[gid] = g
            max_open = max(max_open, len(open_))
    return dict(over_limit=over, slot_clashes=clashes, token_dups=dups, max_open=max_open,
                examples=examples)


def check(run_dir, ttl_ms, scheme, scenario, needs_stale, guard="register", limit=1,
          needs_store_faults=False, needs_oom=False):
    ttl = ttl_ms * MS
    drift = ttl // 100 + 2 * MS  # the library's default drift allowance: ttl/100 + 2 ms
    bound = ttl - drift

    # Fault log: which pid ran which worker, kills, stops and conts.
    orch = []
    with open(os.path.join(run_dir, "orch.log")) as f:
        for line in f:
            e = parse_line(line)
            if e:
                orch.append(e)
    kills = {}  # worker -> t
    crashes = []  # workers that died of a signal the harness did not send, or failed
    stops = []  # (worker, t_stop, t_cont)
    open_stops = {}
    faults = {"pause-check": 0, "pause": 0, "kill": 0}
    store_fault_times = []
    store_errors = {}  # error replies the store's servers counted (RedisClusterStore.heal)
    # Each store fault (one at a time: busy()): kind, t, end (its last store-heal / -ready /
    # -not-ready line, or t + dur), heal (its first store-heal: the failover done), window (the
    # store says overlaps within it are the documented window: PostgresHaStore), failover_ms
    # and ready_ms as the store logged them.
    sfaults = []
    for t, _, ev, f in orch:
        if ev == "store-errors":
            store_errors = f
        if ev == "store-fault":
            faults[f["kind"]] = faults.get(f["kind"], 0) + 1
            store_fault_times += [t, t + int(f.get("dur_ms", "0")) * MS]
            sfaults.append(dict(kind=f["kind"], t=t, end=t + int(f.get("dur_ms", "0")) * MS,
                                heal=None, window=f.get("window") == "1", failover_ms=None,
                                ready_ms=None, repairs=0))
        elif ev == "store-repair" and sfaults:
            sfaults[-1]["repairs"] += 1
        elif ev in ("store-heal", "store-ready", "store-not-ready"):
            # A fault whose end the store reports (a failover, a reshard settling) was in force
            # until then.
            store_fault_times.append(t)
            if sfaults and sfaults[-1]["kind"] == f.get("kind"):
                sf = sfaults[-1]
                sf["end"] = max(sf["end"], t)
                if ev == "store-heal" and sf["heal"] is None:
                    sf["heal"] = t
                    if "failover_ms" in f:
                        sf["failover_ms"] = int(f["failover_ms"])
                if "ready_ms" in f and ev == "store-ready":
                    sf["ready_ms"] = int(f["ready_ms"])
        if ev in ("kill", "final-kill"):
            kills.setdefault(f["worker"], t)
            if ev == "kill":
                faults["kill"] += 1
        elif ev == "stop":
            open_stops[f["worker"]] = (t, f["kind"])
            faults["pause" if f["kind"] == "external" else "pause-check"] += 1
        elif ev == "exited" and f.get("rc") != "0" and f.get("worker") not in kills:
            crashes.append((f.get("worker"), f.get("rc")))
        elif ev == "cont" and f.get("worker") in open_stops:
            t0, kind = open_stops.pop(f["worker"])
            stops.append((f["worker"], t0, t, kind))
    for w, (t0, kind) in open_stops.items():  # killed while stopped
        stops.append((w, t0, kills.get(w, t0), kind))

    # Worker logs -> grants.
    grants = []
    bound_violations = []
    per_worker_selfpause = {}
    native_writes = []  # --guard native: (worker, key, token, result, t_send, seq, msg)
    first_acq_fail = None
    acq_fails = {}  # the refusal's status code -> how many acquires failed with it
    oom_fails = 0  # acquires Redis refused for a full memory (noeviction: RedisEvictStore)
    at_risk = 0  # held -> at risk: a renewal failed, or none was confirmed in time
    lines = 0
    for name in sorted(os.listdir(run_dir)):
        if not (name.startswith("w") and name.endswith(".log")):
            continue
        wid = name[:-4]
        events = []
        with open(os.path.join(run_dir, name)) as f:
            for line in f:
                e = parse_line(line)
                if e:
                    events.append(e)
        lines += len(events)
        events.sort(key=lambda e: e[0])
        cur = None
        sent = None
        for t, _, ev, f in events:
            if ev == "write" and f.get("guard") == "native":
                native_writes.append((wid, f["key"], int(f["token"]), f["result"],
                                      int(f["t_send"]), f.get("seq"), f.get("msg")))
            if ev == "acq-fail":
                if first_acq_fail is None:
                    first_acq_fail = f.get("msg", "?")
                code = f.get("msg", "?").split(":", 1)[0]
                acq_fails[code] = acq_fails.get(code, 0) + 1
                if "out_of_memory" in f.get("msg", ""):
                    oom_fails += 1
            elif ev == "state" and f.get("state") == "at_risk":
                at_risk += 1
            if ev == "acq-sent":
                sent = t
            elif ev == "acquired":
                cur = Grant(wid, f["key"], int(f["token"]), sent if sent is not None else t, t,
                            int(f["safe_until"]), int(f.get("slot", "0")))
                grants.append(cur)
                if cur.su - t > bound:
                    bound_violations.append(("acquired", wid, cur.key, cur.token,
                                             (cur.su - t - bound) / MS))
            elif cur is None:
                continue
            elif ev in ("renew-ok", "valid-check"):
                su = int(f["safe_until"])
                if ev == "renew-ok" and su - t > bound:
                    bound_violations.append(("renew", wid, cur.key, cur.token,
                                             (su - t - bound) / MS))
                if su > cur.su:
                    cur.su = su
            elif ev == "lost":
                if cur.lost is None:
                    cur.lost, cur.lost_reason = t, f.get("reason", "?")
            elif ev == "invalid":
                if cur.invalid is None:
                    cur.invalid = t
            elif ev == "pause-self":
                per_worker_selfpause.setdefault(wid, []).append(t)
            elif ev == "release-sent":
                cur.release = t
            elif ev == "release-done":
                cur.release_result = f.get("result")
                cur.ended_known = True
                cur = None
        if cur is not None and wid in kills:
            cur.killed = kills[wid]
            cur.ended_known = True

    # Self pauses: the stop began at the worker's own pause-self line, not when we noticed.
    pauses = []
    for w, t0, t1, kind in stops:
        if kind == "self":
            cands = [t for t in per_worker_selfpause.get(w, []) if t <= t0]
            if cands:
                t0 = cands[-1]
        pauses.append((w, t0, t1, kind))

    # Validity windows: [acquired, min(safe_until, release sent, lost, killed)).
    incomplete = 0
    for g in grants:
        ends = [g.su]
        for x in (g.release, g.lost, g.killed, g.invalid):
            if x is not None:
                ends.append(x)
        g.end = min(ends)
        if not g.ended_known:
            incomplete += 1

    by_key = {}
    for g in grants:
        by_key.setdefault(g.key, []).append(g)

    # A semaphore's slot is an exclusive lease of its own: two live grants of a key never share a
    # slot, so the exclusive checks below that compare a grant with the key's later ones (overlap,
    # foreign release, takeover) compare it with the later ones of its slot. Token order and
    # uniqueness stay per key: one counter serves every slot.
    by_lane = {}
    for g in grants:
        by_lane.setdefault((g.key, g.slot) if limit > 1 else g.key, []).append(g)
    lim = check_limit(by_key, limit) if limit > 1 else None

    overlaps = []
    token_regressions = []
    handoffs = 0
    foreign = []
    for lane, gs in by_lane.items():
        key = lane[0] if limit > 1 else lane
        gs.sort(key=lambda g: (g.start, g.token))
        # Overlaps: a sweep over windows sorted by start (limit > 1: check_limit's sweep).
        best = None
        for g in gs if limit == 1 else ():
            if g.end <= g.start:
                continue
            if best is not None and g.start < best.end:
                overlaps.append((lane, best.worker, best.token, g.worker, g.token,
                                 (best.end - g.start) / MS))
            if best is None or g.end > best.end:
                best = g
    for key, gs in by_key.items():
        gs.sort(key=lambda g: (g.start, g.token))
        # Token regressions: a grant acquired before another's request was sent must carry a
        # lower token (definitely ordered pairs only, so no false alarms from races).
        starts = [g.start for g in gs]
        prefix_max = []
        m = -1
        for g in gs:
            m = max(m, g.token)
            prefix_max.append(m)
        for g in gs:
            i = bisect.bisect_left(starts, g.sent) - 1
            if i >= 0 and prefix_max[i] >= g.token:
                token_regressions.append((key, g.worker, g.token, prefix_max[i]))
        # Handoffs: successive grants (by token) taken by different workers.
        by_token = sorted(gs, key=lambda g: g.token)
        handoffs += sum(1 for a, b in zip(by_token, by_token[1:]) if a.worker != b.worker)
    for lane, gs in by_lane.items():
        key = lane[0] if limit > 1 else lane
        starts = [g.start for g in gs]
        prefix_max = []
        m = -1
        for g in gs:
            m = max(m, g.token)
            prefix_max.append(m)
        # Foreign release: a release reported as having deleted a live grant, sent after a
        # newer grant of the key had been acquired: it deleted someone else's lease.
        for g in gs:
            if g.release_result == "ok" and g.release is not None:
                i = bisect.bisect_left(starts, g.release) - 1
                if i >= 0 and prefix_max[i] > g.token:
                    foreign.append(("release", key, g.worker, g.token, prefix_max[i]))
            # The store said "not yours" while the grant was still within safe_until: someone
            # else deleted or took it (or the store lost it).
            if g.lost is not None and g.lost_reason == "store" and g.lost < g.su:
                foreign.append(("stolen", key, g.worker, g.token, 0))

    # The fenced register's own history, or (--guard native) the workers' writes judged by
    # timestamps, and the audit read of the store's data.
    stale_attempted = stale_accepted = writes = accepted = 0
    order_regressions = 0
    native = guard == "native"
    if native:
        nat = check_native(run_dir, by_key, native_writes)
        writes, accepted = nat["writes"], nat["accepted"]
        stale_attempted, stale_accepted = nat["stale_attempted"], nat["stale_accepted"]
        order_regressions = nat["audit_violations"]
    reg_path = os.path.join(run_dir, "register.db")
    if not native and os.path.exists(reg_path):
        db = sqlite3.connect(reg_path)
        last = {}
        for key, token, max_before, acc in db.execute(
                "SELECT key, token, max_before, accepted FROM writes ORDER BY id"):
            writes += 1
            accepted += acc
            if token < max_before:
                stale_attempted += 1
                stale_accepted += acc
            if acc:
                if token < last.get(key, -1):
                    order_regressions += 1
                last[key] = max(last.get(key, -1), token)
        db.close()

    # Pauses of holders, and takeover after a holder's death.
    def holding_at(worker, t):
        for g in grants:
            if g.worker == worker and g.start <= t and (t < g.end or g.killed == t):
                return g
        return None

    pauses_gt_ttl = sum(1 for w, t0, t1, _ in pauses if t1 - t0 > ttl and holding_at(w, t0))
    takeovers = []
    for w, t in kills.items():
        g = holding_at(w, t)
        if g is None or any(e[2] == "final-kill" and e[3]["worker"] == w for e in orch):
            continue
        nxt = [h.start for h in by_lane[(g.key, g.slot) if limit > 1 else g.key] if h.start > t]
        if nxt:
            takeovers.append((min(nxt) - t) / MS)

    # False loss: a grant lost although no fault was injected anywhere during it.
    fault_times = sorted([t for _, t0, t1, _ in pauses for t in (t0, t1)] + list(kills.values()) +
                         store_fault_times)
    lost_grants = [g for g in grants if g.lost is not None or g.invalid is not None]
    false_losses = 0
    for g in lost_grants:
        t_lost = min(x for x in (g.lost, g.invalid) if x is not None)
        i = bisect.bisect_left(fault_times, g.start - ttl)
        if i >= len(fault_times) or fault_times[i] > t_lost:
            # A store fault in force all along (begun before, ended after: a switchover that
            # Patroni carries out a second after it is asked for) is a fault during it too.
            if not any(sf["t"] <= t_lost and sf["end"] >= g.start - ttl for sf in sfaults):
                false_losses += 1

    # Store faults: which overlaps and stolen grants fall within one (the later grant, or the
    # loss, between the fault and its end + 2 TTL; the earlier grant taken before its heal),
    # and how long no grant was made (no_grant_ms: the longest stretch without a grant of any
    # key from the fault to the first grant after its heal; the old primary may still grant for
    # a while after a switchover is asked for). Those within a window fault (the documented
    # window) are reported per kind and kept out of the violations; any other overlap or theft
    # still counts.
    def fault_of(t_later, t_earlier):
        for sf in reversed(sfaults):
            if sf["t"] <= t_later:
                if t_later <= sf["end"] + 2 * ttl and \
                        t_earlier < (sf["heal"] if sf["heal"] is not None else sf["end"]):
                    return sf
                return None
        return None

    grant_of = {(g.worker, g.token): g for g in grants}
    all_starts = sorted(g.start for g in grants)
    per_kind = {}
    for sf in sfaults:
        k = per_kind.setdefault(sf["kind"], dict(n=0, window=sf["window"], failover=[],
                                                 ready=[], no_grant=[], overlaps=[],
                                                 stolen=0, repairs=0))
        k["n"] += 1
        k["repairs"] += sf["repairs"]
        if sf["failover_ms"] is not None and sf["failover_ms"] >= 0:
            k["failover"].append(sf["failover_ms"])
        if sf["ready_ms"] is not None:
            k["ready"].append(sf["ready_ms"])
        if sf["heal"] is not None:
            i = bisect.bisect_left(all_starts, sf["t"])
            j = bisect.bisect_right(all_starts, sf["heal"])
            if j < len(all_starts):
                points = [sf["t"]] + all_starts[i:j + 1]
                k["no_grant"].append(max(b - a for a, b in zip(points, points[1:])) / MS)
    window_overlaps = []
    for item in list(overlaps):
        lane, w_a, tok_a, w_b, tok_b, ms = item
        a, b = grant_of.get((w_a, tok_a)), grant_of.get((w_b, tok_b))
        sf = fault_of(b.start, a.start) if a and b else None
        if sf is not None:
            per_kind[sf["kind"]]["overlaps"].append(ms)
            if sf["window"]:
                overlaps.remove(item)
                window_overlaps.append(item + (sf["kind"],))
    window_stolen = []
    for item in list(foreign):
        if item[0] != "stolen":
            continue
        g = grant_of.get((item[2], item[3]))
        sf = fault_of(g.lost, g.start) if g is not None and g.lost is not None else None
        if sf is not None:
            per_kind[sf["kind"]]["stolen"] += 1
            if sf["window"]:
                foreign.remove(item)
                window_stolen.append(item + (sf["kind"],))

    violations = (len(overlaps) + stale_accepted + len(token_regressions) + len(foreign) +
                  order_regressions + len(bound_violations))
    if lim:
        violations += lim["over_limit"] + lim["slot_clashes"] + lim["token_dups"]
    print(f"chaos: store={scheme} scenario={scenario} "
          + ("guard=native " if native else "")
          + (f"limit={limit} max_concurrent={lim['max_open']} over_limit={lim['over_limit']} "
             f"slot_clashes={lim['slot_clashes']} token_dups={lim['token_dups']} " if lim else "")
          + f"handoffs={handoffs} "
          f"pauses_gt_ttl={pauses_gt_ttl} overlaps={len(overlaps) + len(window_overlaps)} "
          + (f"window_overlaps={len(window_overlaps)} "
             if any(sf["window"] for sf in sfaults) else "") +
          f"stale_attempted={stale_attempted} stale_accepted={stale_accepted} "
          f"token_regressions={len(token_regressions)} "
          f"takeover_p99_ms={round(pct(takeovers, 0.99))} violations={violations}")
    print(f"chaos-detail: ttl_ms={ttl_ms} grants={len(grants)} writes={writes} "
          f"accepted={accepted} foreign_changes={len(foreign)} "
          + (f"native_errors={nat['errors']} audit={nat['audit']} "
             f"audit_violations={order_regressions} " if native else
             f"register_order_regressions={order_regressions} ") +
          f"safe_until_bound_violations={len(bound_violations)} "
          f"faults={sum(faults.values())} (pause_after_check={faults['pause-check']} "
          f"pause={faults['pause']} kill={faults['kill']}"
          + "".join(f" {k}={v}" for k, v in faults.items()
                    if k not in ("pause-check", "pause", "kill"))
          + f") pauses={len(pauses)} "
          f"takeover_ms p50={round(pct(takeovers, 0.5))} p99={round(pct(takeovers, 0.99))} "
          f"max={round(max(takeovers, default=0))} n={len(takeovers)} "
          f"lost={len(lost_grants)} false_loss={false_losses}/{len(grants)} "
          f"acq_fail={sum(acq_fails.values())}"
          + (f" ({' '.join(f'{k}={v}' for k, v in sorted(acq_fails.items()))})"
             if acq_fails else "") +
          (f" oom_fails={oom_fails}"
           if needs_oom else "") +
          f" at_risk={at_risk} "
          + (f"store_errors=({' '.join(f'{k}={v}' for k, v in store_errors.items()) or '-'}) "
             if "store-errors" in {e[2] for e in orch} else "") +
          f"incomplete={incomplete} crashes={len(crashes)} events={lines} dir={run_dir}")
    for title, items in (("overlap", overlaps), ("token-regression", token_regressions),
                         ("foreign", foreign), ("safe-until-bound", bound_violations)):
        for item in items[:5]:
            print(f"  violation {title}: {item}")
    if lim:
        for item in lim["examples"][:5]:
            print(f"  violation {item[0]}: {item[1:]}")
    # One line per store fault kind whose store reports its failovers (store-heal failover_ms)
    # or marks a window: faults, failover and ready times, the longest stretch without a grant,
    # overlaps within its window (count, median and max ms) and grants stolen within it.
    def ms_stats(values):
        if not values:
            return "-"
        return f"p50={round(statistics.median(values))} max={round(max(values))}"
    for kind, k in per_kind.items():
        if not (k["window"] or k["failover"] or k["ready"]):
            continue
        print(f"chaos-failover: store={scheme} kind={kind} faults={k['n']} "
              f"window={int(k['window'])} failover_ms {ms_stats(k['failover'])} "
              f"(n={len(k['failover'])}) ready_ms {ms_stats(k['ready'])} "
              f"no_grant_ms {ms_stats(k['no_grant'])} "
              f"overlaps={len(k['overlaps'])} overlap_ms "
              f"{ms_stats(k['overlaps'])} stolen={k['stolen']}"
              + (f" store_repairs={k['repairs']}" if k["repairs"] else ""))
    for item in window_overlaps[:5]:
        print(f"  window overlap (documented, not a violation): {item}")
    for item in window_stolen[:5]:
        print(f"  window stolen (documented, not a violation): {item}")
    if native:
        for item in nat["examples"][:5]:
            print(f"  violation {item[0]}: {item[1:]}")
        if nat["audit"] != "ok":
            print(f"  note: no audit read of the store's data: {nat['audit_why']}")
        for n in nat["notes"][:3]:
            print(f"  note: {n}")
    ineffective = needs_stale and stale_attempted == 0
    if ineffective:
        print("  harness-ineffective: no stale write was attempted: the pauses did not bite")
    if needs_oom and oom_fails == 0:
        ineffective = True
        print("  harness-ineffective: no acquire met a full memory (no OOM refusal): the cache "
              "fills did not bite")
    if native and accepted == 0:
        ineffective = True
        print(f"  harness-ineffective: no native write was accepted ({writes} sent; e.g. "
              f"{nat['first_error']}): does this store implement Lease::Write?")
    if lim and lim["max_open"] < limit:
        ineffective = True
        print(f"  harness-ineffective: at most {lim['max_open']} grants of a key were valid at "
              f"once: the run never filled the limit {limit} ({len(grants)} grants; "
              f"the first refused acquire said: {first_acq_fail or '-'})")
    if needs_store_faults and not any(sf["heal"] is not None for sf in sfaults):
        ineffective = True
        print(f"  harness-ineffective: no store fault was injected and healed "
              f"({len(sfaults)} injected)")
    if crashes:
        ineffective = True
        print(f"  worker-crashes: {len(crashes)} workers died unbidden (rc -N: signal N), e.g. "
              f"{crashes[:4]}; see <worker>.stderr in the run directory")
    # overlaps: two valid windows of an exclusive key; limit > 1: the limit's sweep's findings.
    return dict(violations=violations, window_overlaps=len(window_overlaps),
                overlaps=len(overlaps) + len(window_overlaps) + (lim["over_limit"] + lim["slot_clashes"] if lim else 0),
                stale_accepted=stale_accepted,
                stale_attempted=stale_attempted, ineffective=ineffective, bound=len(bound_violations), foreign=len(foreign),
                over_limit=lim["over_limit"] if lim else 0,
                slot_clashes=lim["slot_clashes"] if lim else 0,
                token_regressions=len(token_regressions), oom_fails=oom_fails)


def check_native(run_dir, by_key, native_writes):
    """--guard native: the workers' writes to the store's own data, judged without their word.

    A write is stale if its token is lower than that of a grant of its key whose holder had
    logged `acquired` before the write's t_send (read by the writer just before the call): the
    store had already made that newer grant when the write was sent, so its guard must refuse
    it. stale_accepted counts the stale writes the store accepted. The audit (native-audit.txt,
    read with the store's own client after the run) must show, for every key with an accepted
    write, a value "<token>:<writer>:<seq>" whose token is not lower than the highest accepted
    one (a stale write applied after a newer one breaks that), and not the value of a write the
    store refused; each failure is an audit violation."""
    index = {}
    for key, gs in by_key.items():
        gs = sorted(gs, key=lambda g: g.start)
        pm, m = [], -1
        for g in gs:
            m = max(m, g.token)
            pm.append(m)
        index[key] = ([g.start for g in gs], pm)
    r = dict(writes=0, accepted=0, errors=0, stale_attempted=0, stale_accepted=0,
             audit_violations=0, audit="missing", audit_why="no " + NATIVE_AUDIT, examples=[],
             notes=[], first_error="-")
    max_acc = {}
    outcome = {}
    for wid, key, token, result, t_send, seq, msg in native_writes:
        r["writes"] += 1
        acc = result == "accepted"
        r["accepted"] += acc
        if result == "error":
            r["errors"] += 1
            if r["first_error"] == "-":
                r["first_error"] = msg or "?"
        if acc:
            max_acc[key] = max(max_acc.get(key, -1), token)
        outcome[(wid, seq)] = result
        starts, pm = index.get(key, ([], []))
        i = bisect.bisect_left(starts, t_send) - 1
        if i >= 0 and pm[i] > token:
            r["stale_attempted"] += 1
            if acc:
                r["stale_accepted"] += 1
                r["examples"].append(("stale-accepted", key, wid, token, pm[i]))
    path = os.path.join(run_dir, NATIVE_AUDIT)
    if not os.path.exists(path):
        return r
    with open(path) as f:
        lines = f.read().splitlines()
    head = lines[0].split(" ", 2) if lines else ["audit", "failed", "empty"]
    if head[1] != "ok":
        r["audit"], r["audit_why"] = head[1], head[2] if len(head) > 2 else "?"
        return r
    r["audit"] = "ok"
    for line in lines[1:]:
        key, _, value = line.partition(" ")
        m = NATIVE_VALUE_RE.fullmatch(value)
        if key not in max_acc:
            if m:
                r["notes"].append(f"{key} holds {value} but no write to it was accepted")
            continue
        if m is None:
            r["audit_violations"] += 1
            r["examples"].append(("audit-lost", key, value, max_acc[key]))
            continue
        token, writer, seq = int(m[1]), m[2], m[3]
        if token < max_acc[key]:
            r["audit_violations"] += 1
            r["examples"].append(("audit-older-than-accepted", key, value, max_acc[key]))
        elif outcome.get((writer, seq)) == "rejected":
            r["audit_violations"] += 1
            r["examples"].append(("audit-holds-a-rejected-write", key, value))
        elif outcome.get((writer, seq)) != "accepted":
            r["notes"].append(f"{key} holds {value}, a write logged as "
                              f"{outcome.get((writer, seq), 'nothing (its worker was killed)')}")
    return r


# ---- CLI mode (--cli): the `leasehold run` command's process-tree supervision --------------

# Faults per CLI scenario: kill (SIGKILL of a holding leasehold process), pause (SIGSTOP of a
# holding leasehold process for 0.5-5 x TTL, then SIGCONT). Only leasehold's own process is
# signalled: it was started with start_new_session, and its command lives in another session.
CLI_SCENARIOS = {
    "cli-hot": dict(keys=["hot"], faults={"kill": 1, "pause": 1}, quick_s=14),
    "cli-multi": dict(keys=["k0", "k1", "k2"], faults={"kill": 2, "pause": 1}, quick_s=9),
    "cli-calm": dict(keys=["hot", "k1"], faults={}, quick_s=5),
}
CLI_DEFAULT_TTL_MS = 1000  # kill grace min(ttl/4, 5s) = 250 ms, renew every ttl/3
CLI_DEFAULT_HOLD_MS = (100, 1200)  # a python start is tens of ms: shorter holds write nothing
# The test-only switch in leasehold that restores the old supervision (the direct child only:
# signals and waiting; leftovers left running). Set for the negative control only.
CLI_UNSAFE_ENV = "LEASEHOLD_TEST_UNSAFE_DIRECT_CHILD_ONLY"
# A fenced_writer.py still alive this long after its leasehold exited is an orphan.
ORPHAN_AFTER_NS = 1_000_000_000
WRITER_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fenced_writer.py")
# The supervised command: start the fenced writer in the background, sleep the hold, exit 0
# without stopping the writer (leasehold must). Positional parameters: $1 python, $2
# fenced_writer.py, $3 register, $4 writer id, $5 gap ms, $6 hold seconds.
CLI_SCRIPT = ('"$1" "$2" --register "$3" --key "$LEASEHOLD_KEY" '
              '--token "$LEASEHOLD_FENCING_TOKEN" --writer "$4" --gap-ms "$5" & '
              'sleep "$6"; exit 0')
# leasehold run exit codes that are part of the game: the command's 0, 75 (the wait expired),
# 79 (lease lost, command stopped), 130 (SIGTERM while waiting, at wind-down), 143 (the
# command died of a forwarded SIGTERM), -9 (our SIGKILL). 64/70/126/127 mean the harness
# itself is broken (bad flag, internal error, sh or python not runnable).
# stderr lines of leasehold that say its command is over (or being stopped): not a holder.
CLI_FINISHED_MARKS = ("leasehold: the command ", "leasehold: the keeper sent SIGKILL",
                      " lost", "released key=")
CLI_EXPECTED_RC = {"0", "75", "79", "130", "143", "-9"}
CLI_HARNESS_RC = {"64", "70", "126", "127"}


class CliOrchestrator(Orchestrator):
    """Runs `leasehold run` workers, one lease each, and hurts the holding ones.

    Worker wN is one process:
      leasehold run --store URL --ttl TTL --wait 4xTTL --holder wN KEY -- sh -c CLI_SCRIPT ...
    whose command starts fenced_writer.py in the background (the grandchild that writes to the
    fenced register with the lease's token), sleeps a hold time chosen here, and exits 0 without
    stopping the writer. An exited worker is replaced by a new one (new id) until the end.

    Faults (only on holders: a live, running leasehold whose command has started and whose tree
    wrote to the register within the last few gaps): SIGKILL of leasehold, SIGSTOP of leasehold
    for 0.5-5 x TTL then SIGCONT. Orphans: a fenced_writer.py of this run (found by its
    --register argument in /proc/*/cmdline) alive more than 1 s after its leasehold exited is
    logged as `orphan` and SIGKILLed. At the end: SIGCONT everything, SIGTERM the workers still
    waiting, give the holders their hold, SIGKILL what is left, wait out the orphan delay and
    SIGKILL every writer still alive."""

    def __init__(self, args, store, scenario, run_dir, rng, unsafe):
        # procs, stopped, pause_req (unused here: Orchestrator.live reads it), offsets (bytes
        # read of each worker's stderr), log_f and next_id come from the base.
        super().__init__(args, store, scenario, run_dir, rng, [], scenarios=CLI_SCENARIOS)
        self.scenario = scenario
        self.unsafe = unsafe
        self.env = dict(os.environ)
        self.env.pop(CLI_UNSAFE_ENV, None)
        if unsafe:
            self.env[CLI_UNSAFE_ENV] = "1"
        self.reg_path = os.path.join(run_dir, "register.db")
        self.started = {}  # worker id -> t its command started (stderr), None before
        self.finished = set()  # worker ids whose command's end leasehold has logged
        self.killed_at = {}  # worker id -> t of our SIGKILL
        self.exited = {}  # worker id -> t its leasehold exited (the kill's time if earlier)
        self.last_write = {}  # worker id -> t_commit_ns of its tree's latest write
        self.reg_db = None
        self.reg_last_id = 0
        self.orphans = {}  # writer pid -> worker id (counted, SIGKILLed)
        self.unknown_seen = {}  # writer pid -> first seen, for writers of no known worker
        self.unspawned = 0  # workers whose spawn failed, to start again

    def spawn(self, end_ns):
        wid = f"w{self.next_id}"
        key = self.sc["keys"][self.next_id % len(self.sc["keys"])]  # every key has contenders
        self.next_id += 1
        hold_ms = self.rng.uniform(self.args.hold_min_ms, self.args.hold_max_ms)
        ttl = self.args.ttl_ms
        cmd = ([self.args.cli, "-v", "run", "--store", self.store.url(), "--ttl", f"{ttl}ms",
                "--wait", f"{4 * ttl}ms", "--holder", wid] + self.args.cli_arg +
               [key, "--", "sh", "-c", CLI_SCRIPT, "sh", sys.executable, WRITER_PY,
                self.reg_path, wid, str(self.args.write_gap_ms), f"{hold_ms / 1000:.3f}"])
        err = open(os.path.join(self.run_dir, wid + ".stderr"), "wb")
        try:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                 start_new_session=True, env=self.env)
        except OSError as e:  # e.g. the binary is being relinked: try again soon
            self.log("spawn-failed", worker=wid, error=type(e).__name__)
            self.unspawned += 1
            return
        finally:
            err.close()
        self.procs[p.pid] = (p, wid)
        self.started[wid] = None
        self.log("spawn", pid=p.pid, worker=wid, key=key, hold_ms=int(hold_ms))

    def tail_one(self, wid):
        for line in read_new_lines(os.path.join(self.run_dir, wid + ".stderr"), self.offsets,
                                   wid):
            if "started the command" in line:
                if self.started.get(wid) is None:
                    self.started[wid] = now_ns()
            elif any(m in line for m in CLI_FINISHED_MARKS):
                self.finished.add(wid)

    def tail_logs(self):
        for _, wid in list(self.procs.values()):
            self.tail_one(wid)

    def poll_register(self):
        try:
            if self.reg_db is None:
                self.reg_db = sqlite3.connect(self.reg_path, timeout=0.2, isolation_level=None)
            rows = self.reg_db.execute(
                "SELECT id, writer, t_commit_ns FROM writes WHERE id > ? ORDER BY id",
                (self.reg_last_id,)).fetchall()
        except sqlite3.Error:
            return
        for id_, writer, t in rows:
            self.reg_last_id = id_
            if t > self.last_write.get(writer, 0):
                self.last_write[writer] = t

    def live(self):
        return [pid for pid, (_, wid) in self.procs.items()
                if pid not in self.stopped and wid not in self.killed_at]

    def holders(self):
        t = now_ns()
        recent = max(20 * self.args.write_gap_ms * MS, 300 * MS)
        out = []
        for pid in self.live():
            wid = self.procs[pid][1]
            if (self.started.get(wid) is not None and wid not in self.finished
                    and t - self.last_write.get(wid, 0) < recent
                    and self.proc_state(pid) not in ("T", "Z", "?")):
                out.append(pid)
        return out

    def inject(self, end_ns):
        """Injects one fault; False if there was no holder to hurt (try again soon)."""
        kinds = list(self.sc["faults"])
        kind = self.rng.choices(kinds, weights=[self.sc["faults"][k] for k in kinds])[0]
        holders = self.holders()
        if not holders:
            return False
        pid = self.rng.choice(holders)
        wid = self.procs[pid][1]
        if kind == "pause":
            if len(self.stopped) >= self.args.workers - 1:
                return False
            dur = int(self.rng.uniform(0.5, 5.0) * self.ttl_ns)
            if not self.signal(pid, signal.SIGSTOP):
                return False
            self.stopped[pid] = now_ns() + dur
            self.log("stop", pid=pid, worker=wid, kind="external", dur_ms=dur // MS)
        elif kind == "kill":
            self.log("kill", pid=pid, worker=wid, holding="yes")
            self.killed_at[wid] = now_ns()
            self.signal(pid, signal.SIGKILL)
            self.stopped.pop(pid, None)
        else:
            raise ValueError(kind)
        self.faults += 1
        return True

    def service_pauses(self):
        t = now_ns()
        for pid, cont_at in list(self.stopped.items()):
            if t >= cont_at:
                self.signal(pid, signal.SIGCONT)
                del self.stopped[pid]
                self.log("cont", pid=pid, worker=self.procs[pid][1] if pid in self.procs else "?")

    def reap(self, end_ns, respawn):
        for pid, (p, wid) in list(self.procs.items()):
            if p.poll() is not None:
                t = now_ns()
                del self.procs[pid]
                self.stopped.pop(pid, None)
                self.exited[wid] = min(t, self.killed_at.get(wid, t))
                self.tail_one(wid)
                self.log("exited", pid=pid, worker=wid, rc=p.returncode)
                if respawn and now_ns() < end_ns - self.ttl_ns:
                    self.spawn(end_ns)

    def scan_writers(self):
        """{pid: worker id} of this run's live fenced_writer.py processes (from /proc)."""
        reg = os.fsencode(self.reg_path)
        found = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if len(argv) < 2 or not argv[1].endswith(b"fenced_writer.py"):
                continue
            try:
                if argv[argv.index(b"--register") + 1] != reg:
                    continue
                wid = argv[argv.index(b"--writer") + 1].decode(errors="replace")
            except (ValueError, IndexError):
                continue
            if self.proc_state(int(d)) in ("Z", "X", "?"):
                continue
            found[int(d)] = wid
        return found

    def check_orphans(self):
        t = now_ns()
        for wpid, wid in self.scan_writers().items():
            if wpid in self.orphans:
                self.signal(wpid, signal.SIGKILL)  # counted already; make sure it goes
                continue
            if wid in self.exited:
                since = self.exited[wid]
            elif wid in self.started:
                continue  # its leasehold is alive
            else:
                since = self.unknown_seen.setdefault(wpid, t)
            if t - since > ORPHAN_AFTER_NS:
                self.orphans[wpid] = wid
                self.log("orphan", pid=wpid, worker=wid, after_ms=(t - since) // MS)
                self.signal(wpid, signal.SIGKILL)

    def run(self, duration_s):
        self.faults = 0
        start = now_ns()
        end = start + int(duration_s * 1e9)
        self.log("run-start", scenario=self.scenario, ttl_ms=self.args.ttl_ms, end=end,
                 store=self.store.scheme, mode="cli", unsafe=int(self.unsafe))
        db = sqlite3.connect(self.reg_path)
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(REGISTER_SCHEMA)
        db.close()
        for _ in range(self.args.workers):
            self.spawn(end)
        gap = self.args.fault_gap_ms * MS
        next_fault = start + self.ttl_ns + int(self.rng.uniform(0.5, 1.5) * gap)
        next_reg = next_scan = next_spawn = 0
        try:
            while now_ns() < end:
                t = now_ns()
                self.tail_logs()
                if t >= next_reg:
                    self.poll_register()
                    next_reg = t + 50 * MS
                if t >= next_scan:
                    self.check_orphans()
                    next_scan = t + 100 * MS
                self.service_pauses()
                self.reap(end, respawn=True)
                if self.unspawned and t >= next_spawn and t < end - self.ttl_ns:
                    self.unspawned -= 1
                    self.spawn(end)
                    next_spawn = t + 100 * MS
                if self.sc["faults"] and now_ns() >= next_fault and now_ns() < end - self.ttl_ns:
                    if self.inject(end):
                        next_fault = now_ns() + int(self.rng.uniform(0.5, 1.5) * gap)
                    else:
                        next_fault = now_ns() + 50 * MS  # no holder to hurt yet
                time.sleep(0.005)
        finally:
            self.wind_down()

    def wind_down(self):
        # No more faults or workers. Resume the stopped; interrupt the workers still waiting
        # (exit 130; one that has just acquired forwards the SIGTERM to its command, also fine);
        # let the holders finish their hold.
        self.store.heal(self)
        for pid in list(self.stopped):
            self.signal(pid, signal.SIGCONT)
            self.log("cont", pid=pid, worker=self.procs.get(pid, (None, "?"))[1])
        self.stopped.clear()
        self.tail_logs()
        for pid, (_, wid) in list(self.procs.items()):
            if self.started.get(wid) is None:
                self.log("term", pid=pid, worker=wid)
                self.signal(pid, signal.SIGTERM)
        grace = now_ns() + (self.args.hold_max_ms + 3 * self.args.ttl_ms) * MS + 2_000_000_000
        next_scan = 0
        while self.procs and now_ns() < grace:
            self.tail_logs()
            self.reap(0, respawn=False)
            if now_ns() >= next_scan:
                self.check_orphans()
                next_scan = now_ns() + 100 * MS
            time.sleep(0.01)
        for pid, (p, wid) in list(self.procs.items()):
            self.log("final-kill", pid=pid, worker=wid)
            self.killed_at.setdefault(wid, now_ns())
            self.signal(pid, signal.SIGCONT)
            self.signal(pid, signal.SIGKILL)
            p.wait()
        self.reap(0, respawn=False)
        # The last trees get the orphan delay too, then every writer left is killed (those
        # past the delay were counted as orphans by check_orphans).
        settle = max(self.exited.values(), default=now_ns()) + ORPHAN_AFTER_NS + 200 * MS
        while now_ns() < settle:
            self.check_orphans()
            time.sleep(0.05)
        self.check_orphans()
        for wpid, wid in self.scan_writers().items():
            self.log("writer-kill", pid=wpid, worker=wid)
            self.signal(wpid, signal.SIGCONT)
            self.signal(wpid, signal.SIGKILL)
        if self.reg_db is not None:
            self.reg_db.close()
        # Cgroup leaves (--contain cgroup, auto as root) that leasehold left behind: reported,
        # not removed (not a safety violation; a leak of leasehold's to see).
        for wid in sorted(self.exited):
            leaf = cli_containment(self.run_dir, wid)[1]
            if leaf and os.path.isdir(leaf):
                self.log("cgroup-left", worker=wid, path=leaf)
        self.log("run-end", faults=self.faults, orphans=len(self.orphans))
        self.log_f.close()


def cli_containment(run_dir, wid):
    """(mode, cgroup leaf or None) from worker wid's 'containment: MODE [PATH]: ...' line."""
    try:
        with open(os.path.join(run_dir, wid + ".stderr"), errors="replace") as f:
            for line in f:
                if line.startswith("leasehold: containment: "):
                    words = line[len("leasehold: containment: "):].split()
                    mode = words[0].rstrip(":") if words else "?"
                    leaf = words[1].rstrip(":") if mode == "cgroup" and len(words) > 1 else None
                    return mode, leaf
    except FileNotFoundError:
        pass
    return None, None


def check_cli(run_dir, ttl_ms, scheme, scenario, needs_faults):
    """The checker of CLI mode: from the fenced register's own history and the orchestrator's log.

    Counts writes, accepted, stale_attempted (a write whose token is lower than the key's
    max_before), stale_accepted, register order regressions (an accepted token lower than one
    accepted before it), grants (distinct (key, token) pairs written), handoffs (successive
    tokens of a key written by different workers; every worker is one `leasehold run`, so
    each is a handoff from one process tree to another) and orphans (fenced writers alive more
    than 1 s after their leasehold exited, found by the orchestrator).

    violations = stale_attempted + stale_accepted + order_regressions + orphans.

    Why a stale *attempt* is a violation, not just a stale acceptance: a committed write of
    token T happened before the tree of T was killed (a dead process commits nothing), which
    precedes the next grant of the key (leasehold stops the tree before it releases, by
    safe_until when the lease is lost or leasehold is stopped, at once when leasehold is
    killed), which precedes every write of a higher token. So with correct tree supervision no
    write ever arrives with a token lower than one already written: the register's fence never
    has to reject anything, and any stale attempt means an old tree outlived its lease.

    Ineffective (exit 2): fewer than 5 grants, no handoff, no kill or pause injected in a
    scenario with faults, a leasehold exit code that says the harness is broken, or a
    leasehold that could not be started at all."""
    orch = []
    with open(os.path.join(run_dir, "orch.log")) as f:
        for line in f:
            e = parse_line(line)
            if e:
                orch.append(e)
    faults = {"kill": 0, "pause": 0}
    orphans = []
    exit_t = {}
    rcs = {}
    spawn_failures = 0
    cgroups_left = 0
    for t, _, ev, f in orch:
        if ev == "kill":
            faults["kill"] += 1
            exit_t.setdefault(f["worker"], t)
        elif ev == "stop":
            faults["pause"] += 1
        elif ev == "orphan":
            orphans.append((f.get("worker"), f.get("pid"), f.get("after_ms")))
        elif ev == "exited":
            exit_t.setdefault(f["worker"], t)
            rcs[f.get("rc")] = rcs.get(f.get("rc"), 0) + 1
        elif ev == "spawn-failed":
            spawn_failures += 1
        elif ev == "cgroup-left":
            cgroups_left += 1

    writes = accepted = stale_attempted = stale_accepted = order_regressions = 0
    writes_after_exit = 0
    stale = []
    token_writers = {}  # (key, token) -> set of writers
    first_writer = {}  # (key, token) -> the first writer seen
    reg_path = os.path.join(run_dir, "register.db")
    if os.path.exists(reg_path):
        db = sqlite3.connect(reg_path)
        last = {}
        for key, token, writer, max_before, acc, t in db.execute(
                "SELECT key, token, writer, max_before, accepted, t_commit_ns FROM writes "
                "ORDER BY id"):
            writes += 1
            accepted += acc
            token_writers.setdefault((key, token), set()).add(writer)
            first_writer.setdefault((key, token), writer)
            if writer in exit_t and t > exit_t[writer]:
                writes_after_exit += 1
            if token < max_before:
                stale_attempted += 1
                stale_accepted += acc
                gone = (t - exit_t[writer]) / MS if writer in exit_t else None
                stale.append((key, writer, token, max_before, acc,
                              None if gone is None else round(gone, 1)))
            if acc:
                if token < last.get(key, -1):
                    order_regressions += 1
                last[key] = max(last.get(key, -1), token)
        db.close()
    grants = len(first_writer)
    handoffs = 0
    for key in {k for k, _ in first_writer}:
        toks = sorted(tok for k, tok in first_writer if k == key)
        handoffs += sum(1 for a, b in zip(toks, toks[1:])
                        if first_writer[(key, a)] != first_writer[(key, b)])
    shared = sum(1 for ws in token_writers.values() if len(ws) > 1)

    # leasehold's own view: grants it logged ("acquired key=... fencing_token=...").
    grants_logged = 0
    modes = {}
    for name in os.listdir(run_dir):
        if name.startswith("w") and name.endswith(".stderr"):
            with open(os.path.join(run_dir, name), errors="replace") as f:
                grants_logged += sum(1 for line in f if "acquired key=" in line)
            mode = cli_containment(run_dir, name[:-len(".stderr")])[0]
            if mode:
                modes[mode] = modes.get(mode, 0) + 1

    violations = stale_attempted + stale_accepted + order_regressions + len(orphans)
    print(f"chaos: store={scheme} scenario={scenario} grants={grants} writes={writes} "
          f"stale_attempted={stale_attempted} stale_accepted={stale_accepted} "
          f"orphans={len(orphans)} violations={violations}")
    unexpected = {rc: n for rc, n in rcs.items() if rc not in CLI_EXPECTED_RC}
    print(f"chaos-detail: ttl_ms={ttl_ms} handoffs={handoffs} accepted={accepted} "
          f"register_order_regressions={order_regressions} grants_logged={grants_logged} "
          f"shared_tokens={shared} writes_after_exit={writes_after_exit} "
          f"faults={faults['kill'] + faults['pause']} (kill={faults['kill']} "
          f"pause={faults['pause']}) exits="
          + ",".join(f"{rc}:{n}" for rc, n in sorted(rcs.items(), key=lambda x: str(x[0])))
          + " containment=" + (",".join(f"{m}:{n}" for m, n in sorted(modes.items())) or "-")
          + f" cgroups_left={cgroups_left} dir={run_dir}")
    for item in stale[:5]:
        print(f"  violation stale-attempt (key, writer, token, max_before, accepted, "
              f"ms_after_its_leasehold_exited): {item}")
    for item in orphans[:5]:
        print(f"  violation orphan (worker, pid, ms_after_its_leasehold_exited): {item}")
    if shared:
        print(f"  note: {shared} tokens were written by more than one worker (two grants with "
              f"one token?)")
    if unexpected:
        print(f"  note: unexpected leasehold exit codes {unexpected}; see wN.stderr")
    if cgroups_left:
        print(f"  note: {cgroups_left} cgroup leaves of exited leasehold processes were left "
              f"behind (cgroup-left in orch.log)")
    reasons = []
    if grants < 5:
        reasons.append(f"only {grants} grants wrote to the register")
    if handoffs == 0:
        reasons.append("no handoff")
    if needs_faults and faults["kill"] + faults["pause"] == 0:
        reasons.append("no kill or pause was injected")
    if any(rc in CLI_HARNESS_RC for rc in rcs):
        reasons.append("leasehold exited 64/70/126/127: the harness is broken")
    if spawn_failures:
        reasons.append(f"{spawn_failures} leasehold processes could not be started (see "
                       f"spawn-failed in orch.log)")
    for r in reasons:
        print(f"  harness-ineffective: {r}")
    return dict(violations=violations, stale_attempted=stale_attempted, orphans=len(orphans),
                ineffective=bool(reasons))


# ---- main ---------------------------------------------------------------------------------

NEGATIVE_CONTROLS = [
    # (name, --unsafe value, scenario, what must be flagged)
    ("all", "all", "pause-hot", ("overlaps", "stale_accepted")),
    ("nofence", "nofence", "pause-hot", ("stale_accepted",)),
    ("plaindelete", "plaindelete", "pause-hot", ("overlaps", "foreign")),
    ("nodrift", "nodrift", "calm", ("bound",)),
]
# --guard native: the library's leases, its writes sent with the store's guard skipped
# (chaos_worker --unsafe=noguard).
NATIVE_NEGATIVE_CONTROLS = [
    ("noguard", "noguard", "pause-hot", ("stale_accepted",)),
]
# --limit N > 1: first the limit's own control (the library's leases, every acquire asking for
# N + 1 while the run is judged by N: chaos_worker --unsafe=overlimit), then the controls above,
# their workers asking for N.
LIMIT_NEGATIVE_CONTROLS = [
    ("overlimit", "overlimit", "pause-hot", ("over_limit",)),
]
LIMIT_CONTROL_QUICK_S = 6  # the over-limit control needs no fault to bite: a few seconds
# --store postgres-ha-table: the library's leases with chaos_worker --unsafe=trustcommit (a
# commit whose wait for the synchronous standby was cancelled is trusted, as leasehold did
# before the indeterminate-outcome rule), under --pg-ha-sync strict and the standby-cut fault
# only (scenario failovers: no worker is paused or killed; a fault every 2 s while none is under
# way; cuts of 8 s with wal_sender_timeout 60 s), with a TTL of 15 s, holds of 10-30 s and 12
# workers on 8 keys: a holder granted by an unconfirmed commit still holds when the promoted
# standby, which never had that commit, grants the key again. --pg-ha-standby-cut-setup runs
# the same without the control.
PG_HA_NEGATIVE_CONTROL = [
    ("trustcommit", "trustcommit", "failovers", ("overlaps",)),
]
PG_HA_CONTROL_TTL_MS = 15000
PG_HA_CONTROL_HOLD_MS = (10000, 30000)
# Several standby-cuts (8 s of cut, ~10 s of failover, ~10 s of rejoin each): a cut bites only
# if a grant falls into it.
PG_HA_CONTROL_QUICK_S = 120
PG_HA_CONTROL_FAULT_GAP_MS = 2000
PG_HA_CONTROL_WORKERS = 12  # on the 8 keys of scenario failovers
PG_HA_CONTROL_CUT_S = 8
PG_HA_CONTROL_WAL_SENDER_TIMEOUT = "60s"  # the replica stays in Patroni's /sync key in the cut


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help="path to chaos_worker")
    ap.add_argument("--cli", metavar="LEASEHOLD",
                    help="CLI mode: test `leasehold run`'s process-tree supervision with this "
                         "leasehold binary (instead of chaos_worker)")
    ap.add_argument("--cli-arg", action="append", default=[], metavar="ARG",
                    help="CLI mode: one more argument for `leasehold run`, before KEY "
                         "(repeatable), e.g. --cli-arg=--kill-grace=100ms")
    ap.add_argument("--store", default="sqlite", choices=sorted(STORES))
    ap.add_argument("--scenario", action="append",
                    choices=sorted(SCENARIOS) + sorted(CLI_SCENARIOS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--duration", type=float, help="seconds per scenario")
    ap.add_argument("--workers", type=int, default=None,
                    help="default 4; with --limit N > 1: N + 2")
    ap.add_argument("--limit", type=int, default=1, metavar="N",
                    help="workers acquire with LeaseOptions::limit = N (a semaphore when N > 1): "
                         "the checker verifies at most N valid windows per key, distinct slots "
                         "and unique tokens (see the header)")
    ap.add_argument("--sentinel-min-replicas", type=int, default=1, metavar="N",
                    help="--store redis-sentinel: the workers' min_replicas (default 1; 0 shows "
                         "what asynchronous replication can lose in a failover)")
    ap.add_argument("--sentinel-replicas", type=int, default=1, metavar="N",
                    help="--store redis-sentinel: the master's replicas (default 1), each of "
                         "replica-priority 100")
    ap.add_argument("--cluster-min-replicas", type=int, default=1, metavar="N",
                    help="--store redis-cluster: the workers' min_replicas (default 1; 0 shows "
                         "what asynchronous replication can lose in a failover)")
    ap.add_argument("--control", action="append", metavar="NAME",
                    help="--negative-control: only these controls (repeatable; default all)")
    ap.add_argument("--ttl-ms", type=int, default=None,
                    help="lease TTL (default: 500, or the store's minimum: etcd 2000; "
                         f"--cli: {CLI_DEFAULT_TTL_MS})")
    ap.add_argument("--hold-min-ms", type=int, default=None,
                    help=f"default 30 (--cli: {CLI_DEFAULT_HOLD_MS[0]})")
    ap.add_argument("--hold-max-ms", type=int, default=None,
                    help=f"default 300 (--cli: {CLI_DEFAULT_HOLD_MS[1]})")
    ap.add_argument("--write-gap-ms", type=int, default=15)
    ap.add_argument("--idle-max-ms", type=int, default=40,
                    help="a worker rests 0..this long between leases (spreads handoffs)")
    ap.add_argument("--fault-gap-ms", type=int, default=None,
                    help="mean time between faults (default: 2 x TTL)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--workdir", default=None, help="parent of the run directories")
    ap.add_argument("--keep", action="store_true", help="keep run directories of clean runs")
    ap.add_argument("--guard", choices=("register", "native"), default="register",
                    help="where the workers write: the fenced register (default) or, native, "
                         "the store's own data through Lease::Write")
    ap.add_argument("--negative-control", action="store_true")
    ap.add_argument("--ignore-sigpipe", action="store_true",
                    help="workers ignore SIGPIPE (a workaround; off by default: the library "
                         "must not need it)")
    ap.add_argument("--pg-session-faults", action="store_true",
                    help="--store postgres: also store-restart and proxy-reset, which end the "
                         "holder's session (the documented window: expect overlaps)")
    ap.add_argument("--pg-ha-sync", choices=("on", "strict", "off"), default="on",
                    help="--store postgres-ha[-table]: Patroni's replication: on "
                         "(synchronous_mode, the default), strict (plus "
                         "synchronous_mode_strict) or off (asynchronous)")
    ap.add_argument("--pg-ha-faults", metavar="KIND,...",
                    help="--store postgres-ha[-table]: the server faults to take in turn "
                         "(default switchover,primary-kill,primary-partition)")
    ap.add_argument("--pg-ha-standby-cut-setup", action="store_true",
                    help="--store postgres-ha[-table]: the PostgreSQL HA negative control's "
                         "setup without the control (the library's side of it): sync strict, "
                         "standby-cut faults of 8 s (wal_sender_timeout 60s), scenario "
                         "failovers, TTL 15 s, holds of 10-30 s, 12 workers")
    ap.add_argument("--redis-maxmemory-policy", default="noeviction",
                    choices=("noeviction", "volatile-ttl", "volatile-lru", "volatile-lfu",
                             "volatile-random", "allkeys-lru", "allkeys-lfu", "allkeys-random"),
                    help="--store redis-evict: the server's maxmemory-policy (maxmemory 8mb); "
                         "with --negative-control, an evicting one whose evictions must be "
                         "caught")
    ap.add_argument("--check-only", metavar="DIR")
    args = ap.parse_args()
    RedisSentinelStore.min_replicas = args.sentinel_min_replicas
    RedisSentinelStore.replicas = args.sentinel_replicas
    PostgresHaStore.sync = args.pg_ha_sync
    if args.pg_ha_faults:
        kinds = tuple(k for k in args.pg_ha_faults.split(",") if k)
        known = PostgresHaStore.server_faults + PostgresHaStore.extra_faults
        bad = [k for k in kinds if k not in known]
        if bad or not kinds:
            ap.error(f"--pg-ha-faults: one or more of {','.join(known)}, not "
                     f"{args.pg_ha_faults}")
        PostgresHaStore.faults = kinds
    if args.negative_control and issubclass(STORES[args.store], PostgresHaStore):
        if args.store != "postgres-ha-table" or args.guard != "register" or args.limit != 1:
            ap.error("the PostgreSQL HA negative control is --store postgres-ha-table with the "
                     "fenced register and --limit 1 (advisory locks are not replicated: "
                     "advisory mode's failover overlaps are the documented window)")
        args.pg_ha_standby_cut_setup = True
    if args.pg_ha_standby_cut_setup:
        if not issubclass(STORES[args.store], PostgresHaStore):
            ap.error("--pg-ha-standby-cut-setup is for --store postgres-ha[-table]")
        # PG_HA_NEGATIVE_CONTROL: the issue's scenario under Patroni, with holders that outlive
        # the failover (a TTL longer than it and holds longer than that), and cuts long enough
        # that grants fall into them while the replica stays the synchronous one.
        PostgresHaStore.sync = "strict"
        PostgresHaStore.faults = ("standby-cut",)
        PostgresHaStore.CUT_S = PG_HA_CONTROL_CUT_S
        PostgresHaStore.WAL_SENDER_TIMEOUT = PG_HA_CONTROL_WAL_SENDER_TIMEOUT
        args.scenario = args.scenario or ["failovers"]
        args.ttl_ms = args.ttl_ms or PG_HA_CONTROL_TTL_MS
        args.hold_min_ms = args.hold_min_ms or PG_HA_CONTROL_HOLD_MS[0]
        args.hold_max_ms = args.hold_max_ms or PG_HA_CONTROL_HOLD_MS[1]
        args.fault_gap_ms = args.fault_gap_ms or PG_HA_CONTROL_FAULT_GAP_MS
        args.workers = args.workers or PG_HA_CONTROL_WORKERS
        PostgresHaStore.quick_s = dict(PostgresHaStore.quick_s, failovers=PG_HA_CONTROL_QUICK_S)
    RedisClusterStore.min_replicas = args.cluster_min_replicas
    RedisEvictStore.policy = args.redis_maxmemory_policy
    if args.store == "redis-evict":
        if args.negative_control == (args.redis_maxmemory_policy == "noeviction"):
            ap.error("--store redis-evict: --negative-control goes with an evicting "
                     "--redis-maxmemory-policy (the evictions must be caught), and noeviction "
                     "without it")
        # 4 leases held and contended: two workers a key.
        args.workers = args.workers or 8
    if not 1 <= args.limit <= 1024:
        ap.error("--limit must be 1..1024 (kMaxLeaseLimit)")
    if args.workers is None:
        args.workers = 4 if args.limit == 1 else args.limit + 2
    store_ttl_ms = getattr(STORES[args.store], "default_ttl_ms", 500)
    if args.ttl_ms is None:
        args.ttl_ms = max(store_ttl_ms, CLI_DEFAULT_TTL_MS) if args.cli else store_ttl_ms
    hold = CLI_DEFAULT_HOLD_MS if args.cli else (30, 300)
    if args.hold_min_ms is None:
        args.hold_min_ms = hold[0]
    if args.hold_max_ms is None:
        args.hold_max_ms = max(hold[1], args.hold_min_ms)
    if args.fault_gap_ms is None:
        args.fault_gap_ms = 2 * args.ttl_ms

    if args.check_only:
        sc = "?"
        cli_mode = False
        with open(os.path.join(args.check_only, "orch.log")) as f:
            for line in f:
                e = parse_line(line)
                if e and e[2] == "run-start":
                    sc, args.ttl_ms, store = e[3]["scenario"], int(e[3]["ttl_ms"]), e[3]["store"]
                    cli_mode = e[3].get("mode") == "cli"
                    args.guard = e[3].get("guard", "register")
                    args.limit = int(e[3].get("limit", "1"))
                    break
        if cli_mode:
            r = check_cli(args.check_only, args.ttl_ms, store, sc,
                          bool(CLI_SCENARIOS.get(sc, {}).get("faults")))
            return 1 if r["violations"] else (2 if r["ineffective"] else 0)
        r = check(args.check_only, args.ttl_ms, store, sc, SCENARIOS.get(sc, {}).get(
            "needs_stale", False), args.guard, args.limit,
            needs_store_faults=getattr(STORES.get(store), "needs_store_faults", False) and
            bool(SCENARIOS.get(sc, {}).get("server")))
        return 1 if r["violations"] else (2 if r["ineffective"] else 0)

    if args.cli:
        if args.guard != "register":
            ap.error("--guard is for chaos_worker runs, not --cli")
        if args.limit != 1:
            ap.error("--limit is for chaos_worker runs, not --cli")
        if not os.access(args.cli, os.X_OK):
            ap.error("--cli must name the leasehold executable")
        return main_cli(args, ap)
    if not args.worker or not os.access(args.worker, os.X_OK):
        ap.error("--worker must name the chaos_worker executable")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"chaos: seed={seed} (rerun with --seed {seed})", flush=True)
    rng = random.Random(seed)
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)

    if args.limit > 1 and args.guard == "native":
        ap.error("--limit N > 1 is checked with the fenced register only (see the header)")
    guard_flags = ["--guard=native"] if args.guard == "native" else []
    if args.negative_control and issubclass(STORES[args.store], PostgresHaStore):
        plan = [(n, [f"--unsafe={u}"], sc, must) for n, u, sc, must in PG_HA_NEGATIVE_CONTROL]
    elif args.negative_control and args.store == "redis-evict":
        # The library itself, on a server whose evictions the URL accepts.
        plan = [(f"evict-{args.redis_maxmemory_policy}", [], "eviction",
                 ("overlaps", "foreign", "token_regressions"))]
    elif args.negative_control and args.guard == "native":
        plan = [(n, guard_flags + [f"--unsafe={u}"], sc, must)
                for n, u, sc, must in NATIVE_NEGATIVE_CONTROLS]
    elif args.negative_control:
        plan = [(n, [f"--unsafe={u}"], sc, must)
                for n, u, sc, must in (LIMIT_NEGATIVE_CONTROLS if args.limit > 1 else [])]
        plan += [(n, ["--mode=unsafe", f"--unsafe={u}"], sc, must)
                 for n, u, sc, must in NEGATIVE_CONTROLS]
    else:
        has_server = bool(STORES[args.store].server_faults)

        def injectable(sc):
            """A scenario with faults none of which this store can inject (eviction's
            cache-fill off redis-evict) is not one of its defaults."""
            faults = SCENARIOS[sc]["faults"]
            return not faults or any(k in ("pause", "pause-check", "kill") or
                                     k in STORES[args.store].server_faults for k in faults)
        chosen = args.scenario or list(getattr(STORES[args.store], "default_scenarios", ())) or \
            [sc for sc in SCENARIOS
             if (has_server or not SCENARIOS[sc].get("server")) and injectable(sc)]
        for sc in chosen:
            if sc in CLI_SCENARIOS:
                ap.error(f"scenario {sc} is for --cli")
            if SCENARIOS[sc].get("server") and not has_server:
                ap.error(f"scenario {sc} needs a store with a server, not {args.store}")
            if not injectable(sc):
                ap.error(f"scenario {sc}: {args.store} has none of its faults "
                         f"({', '.join(SCENARIOS[sc]['faults'])})")
        plan = [(None, guard_flags, sc, None) for sc in chosen]
    if args.negative_control and args.control:
        unknown = set(args.control) - {p[0] for p in plan}
        if unknown:
            ap.error(f"--control: no such control here: {', '.join(sorted(unknown))} (one of "
                     f"{', '.join(p[0] for p in plan)})")
        plan = [p for p in plan if p[0] in args.control]

    status = 0
    # A quick run whose faults happened not to bite (no stale write attempted: the random
    # pauses all hit a worker between grants) tested nothing: it is run once more with the
    # next faults of the same seed before it counts as ineffective. Violations always count.
    attempts = [(control, flags, scenario, must, 1) for control, flags, scenario, must in plan]
    while attempts:
        control, flags, scenario, must, attempt = attempts.pop(0)
        if args.duration:
            duration = args.duration
        elif args.quick:
            duration = SCENARIOS[scenario]["quick_s"] * STORES[args.store].quick_scale
            duration = getattr(STORES[args.store], "quick_s", {}).get(scenario, duration)
            if control == "trustcommit":
                pass  # the store's quick_s: several failovers
            elif control and control.startswith("evict-"):
                duration = min(duration, 8)  # two or three fills: each evicts grants at once
            elif control:
                duration = min(duration, LIMIT_CONTROL_QUICK_S if control == "overlimit" else 10)
        else:
            duration = 60
        run_dir = tempfile.mkdtemp(prefix=f"chaos-{args.store}-{scenario}-", dir=args.workdir)
        store = STORES[args.store]()
        if args.pg_session_faults and isinstance(store, PostgresStore):
            store.server_faults = tuple(dict.fromkeys(store.server_faults + store.session_faults))
        try:
            store.start(run_dir)
        except StoreSkip as e:
            print(f"chaos: SKIP: store {args.store}: {e}", flush=True)
            shutil.rmtree(run_dir, ignore_errors=True)
            return 77
        args.scenario_name = scenario
        orch = Orchestrator(args, store, scenario, run_dir, rng, flags)
        try:
            orch.run(duration)
            if args.guard == "native":
                audit_native(store, SCENARIOS[scenario]["keys"], run_dir)
        finally:
            store.stop()
        name = scenario if control is None else f"{scenario}/unsafe-{control}"
        if args.limit > 1:
            name += f"/limit-{args.limit}"
        r = check(run_dir, args.ttl_ms, store.scheme, name,
                  SCENARIOS[scenario]["needs_stale"] and control is None, args.guard, args.limit,
                  needs_store_faults=getattr(store, "needs_store_faults", False) and
                  bool(SCENARIOS[scenario].get("server")),
                  needs_oom=isinstance(store, RedisEvictStore) and control is None)
        sys.stdout.flush()
        if control is None:
            rc = 1 if r["violations"] else (2 if r["ineffective"] else 0)
            if rc == 2 and args.quick and attempt == 1:
                print(f"chaos: scenario {scenario} was ineffective; running it once more",
                      flush=True)
                attempts.insert(0, (control, flags, scenario, must, 2))
                if not args.keep:
                    shutil.rmtree(run_dir, ignore_errors=True)
                continue
            status = max(status, rc)
            if rc == 0 and not args.keep:
                shutil.rmtree(run_dir, ignore_errors=True)
        else:
            caught = any(r[m] > 0 for m in must)
            if (not caught and must == ("stale_accepted",) and r["stale_attempted"] == 0
                    and args.quick and attempt == 1):
                # No stale write was even attempted (the pauses missed the holders): this run
                # could not have caught the control; once more with the next faults.
                print(f"chaos: control {control} saw no stale write; running it once more",
                      flush=True)
                attempts.insert(0, (control, flags, scenario, must, 2))
                if not args.keep:
                    shutil.rmtree(run_dir, ignore_errors=True)
                continue
            print(f"negative-control: unsafe={control} {'CAUGHT' if caught else 'NOT CAUGHT'} "
                  f"(must flag one of {', '.join(must)})", flush=True)
            if not caught:
                status = 1
            elif not args.keep:
                shutil.rmtree(run_dir, ignore_errors=True)
    return status


def main_cli(args, ap):
    """CLI mode: the scenarios of CLI_SCENARIOS, or the negative control (cli-hot with the
    workers' environment carrying CLI_UNSAFE_ENV=1): exit 0 there only if it is caught."""
    for sc in args.scenario or []:
        if sc not in CLI_SCENARIOS:
            ap.error(f"scenario {sc} is not a CLI scenario (--cli): one of "
                     f"{', '.join(CLI_SCENARIOS)}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"chaos: seed={seed} (rerun with --seed {seed})", flush=True)
    rng = random.Random(seed)
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    if args.negative_control:
        plan = [(True, sc) for sc in (args.scenario or ["cli-hot"])]
    else:
        plan = [(False, sc) for sc in (args.scenario or list(CLI_SCENARIOS))]
    status = 0
    for unsafe, scenario in plan:
        if args.duration:
            duration = args.duration
        elif args.quick:
            duration = CLI_SCENARIOS[scenario]["quick_s"]
            if unsafe:
                duration = min(duration, 10)
        else:
            duration = 60
        run_dir = tempfile.mkdtemp(prefix=f"chaos-cli-{args.store}-{scenario}-",
                                   dir=args.workdir)
        store = STORES[args.store]()
        store.start(run_dir)
        orch = CliOrchestrator(args, store, scenario, run_dir, rng, unsafe)
        try:
            orch.run(duration)
        finally:
            store.stop()
        name = scenario if not unsafe else f"{scenario}/unsafe-direct-child-only"
        r = check_cli(run_dir, args.ttl_ms, store.scheme, name,
                      bool(CLI_SCENARIOS[scenario]["faults"]))
        sys.stdout.flush()
        if not unsafe:
            rc = 1 if r["violations"] else (2 if r["ineffective"] else 0)
            status = max(status, rc)
            if rc == 0 and not args.keep:
                shutil.rmtree(run_dir, ignore_errors=True)
        else:
            caught = r["stale_attempted"] > 0 or r["orphans"] > 0
            print(f"negative-control: {CLI_UNSAFE_ENV}=1 {'CAUGHT' if caught else 'NOT CAUGHT'} "
                  f"(must flag stale_attempted or orphans)", flush=True)
            if not caught:
                status = 1
            elif not args.keep:
                shutil.rmtree(run_dir, ignore_errors=True)
    return status


if __name__ == "__main__":
    # SIGTERM (ctest --timeout, an operator) unwinds like an exception, so that every store's
    # stop() runs: its servers are killed and PostgresHaStore's nftables table is deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
