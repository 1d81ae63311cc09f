#!/usr/bin/env python3
# File: tests/backends/postgres/pg_ha_test.py
#
# leasehold on a PostgreSQL whose history is not a straight line: three scenarios, each judged
# through `leasehold run` on postgres:// (mode=table and mode=advisory):
#
#   failover     a lease granted by a commit that the synchronous standby never confirmed, then
#                a failover to that standby: does `leasehold run` start its command on a grant
#                the promoted standby has never seen, so that a second run on the promoted
#                server takes the same key while the first command still runs (two holders, and
#                a fencing token that goes backwards)?
#   restore      a point-in-time restore to an earlier point: the grants made after the base
#                backup are lost; is every token handed out after the restore above every
#                token seen before it (else the run must be refused: exit 69, "history went
#                backwards")?
#   split-brain  the old primary is not demoted: two primaries (timelines 1 and 2), a holder on
#                each; does a fenced register (outside PostgreSQL) refuse every write of the
#                old primary's holder once the new one's holder has written?
#
#   python3 tests/backends/postgres/pg_ha_test.py --leasehold build/tools/cli/leasehold
#       [--scenarios failover,restore,split-brain] [--iterations N] [--modes table,advisory]
#       [--grants N | --long] [--no-handle] [--restore-kind pitr|same-timeline]
#       [--writes N] [--write-gap S]
#       [--keep] [--fixture-only] [-v]
#
# The default (CTest's pg_ha_failover) runs every scenario once per mode, quickly: 38 s on a
# 2-core machine with a C++ build running beside it (load average 3), 60 s at load average 7
# (each `leasehold run` takes about 0.2 s). --iterations applies to every scenario selected;
# --long makes restore 200 + 200 grants (default 10 + 10): about 70 s per mode.
#
# --- failover ---------------------------------------------------------------------------------
#
# Real components: a PostgreSQL 15 primary (synchronous_standby_names='*') and a standby made by
# `pg_basebackup -R`, streaming synchronously, both as the `postgres` OS user in a temporary
# directory of their own on free 127.0.0.1 ports (never 5432; the system's instances are never
# touched), the binaries of /usr/lib/postgresql/15/bin. Each iteration of each mode, on a fresh
# pair (the initdb is done once per run and copied):
#
#   0. warm-up: `leasehold run --store PRIMARY hot -- true` (exit 0), so that the schema and the
#      key's first grant exist on both servers, as in production where the store is in use;
#   1. the standby's WAL stream is cut: an nftables table of this test's own
#      (inet leasehold_pgha_<pid>), a chain on the output hook dropping both directions of the
#      replication connection (its ports from pg_stat_replication) and `meta skuid <postgres
#      uid> tcp dport PRIMARY_PORT` (a reconnecting walreceiver); leasehold runs as root, so its
#      own connections pass. The cut is verified: a write on the primary waits in SyncRep (pg_stat_activity) until cancelled;
#   2. `leasehold run --store PRIMARY?mode=M&command_timeout=1s hot -- sh -c 'touch A; sleep 20'`
#      (no --wait). Expected: exit 69 within seconds, one stderr line naming the cancelled
#      synchronous commit ("may have applied"), and A never exists. The bug: it logs
#      `acquired key=hot fencing_token=N` and starts the command;
#   3. kill -9 of the primary's process group, the nftables table deleted, `pg_ctl promote` of the
#      standby, until `SELECT pg_is_in_recovery()` says f;
#   4. `leasehold run --store PROMOTED hot -- sh -c 'touch B; sleep 1'`: exit 0, B exists;
#   5. verdict: "two holders" if the first command started (A) and still ran when B appeared (its
#      processes are found by their cwd, the iteration's run-a directory: under --contain=pidns
#      `$$` would be a namespace PID); "token regression" if both runs printed a fencing token
#      and B's is not above A's.
#
# One line per iteration, a summary per mode (pg_ha: mode=table iterations=1 two_holders=0
# token_regressions=0 first_run_refused=1 ...). Exit 1 on any two holders, token regression,
# first run not refused (exit != 69, or its command started), second run failed, or fixture
# failure; 0 otherwise; 77 (CTest's SKIP_RETURN_CODE) when this machine cannot run it (not root,
# no nft, no PostgreSQL 15, no `postgres` user), with the reason. Every wait is bounded; one
# iteration takes about 5-8 s per mode. Every process started is killed
# at the end of its iteration; the temporary directory is removed on success, kept and named on
# failure (or with --keep).
#
# --fixture-only runs the failover's server part alone (pair, sync state, cut verified, kill,
# promote) and prints its timings: no leasehold binary needed.
#
# --- restore ----------------------------------------------------------------------------------
#
# One server, no standby: a primary with archive_mode=on, its archive_command copying into the
# iteration's own archive directory. Per iteration of each mode:
#
#   0. warm-up: `leasehold run --store PRIMARY hot -- ...` (token 1), so the key is in the backup;
#   1. point P: `pg_basebackup -X stream -c fast` (no -R) into the iteration's backup directory;
#   2. the long-lived handle (not with --no-handle): `leasehold elect --again --store PRIMARY hot
#      -- sh -c 'echo $LEASEHOLD_FENCING_TOKEN >> tokens; exec sleep 3600'`, one process and one
#      store handle for all its terms; its first term is granted after P (so the restore loses
#      it) and spans the kill and the restore;
#   3. N grants of hot (--grants, default 10; --long: 200), each `leasehold run --store PRIMARY
#      hot -- sh -c 'echo $LEASEHOLD_FENCING_TOKEN >> tokens'`, one after another;
#   4. kill -9 of the primary; the base backup started as the new server on the same port, with
#      recovery.signal, restore_command (cp from the archive), recovery_target='immediate' and
#      recovery_target_action='promote': recovery ends at the backup's end, the N grants are lost
#      (checked: the restored server's fence of hot is the warm-up token) and the server is
#      promoted onto a new timeline (2: the archive has no history file);
#   5. N more grants of hot on the restored server; then until the handle has a term on the
#      restored server (its first term's renewal finds the grant gone, --again campaigns again),
#      or has exited (refused), 25 s at most.
#
# Verdict: every token granted after the restore is above every token seen before it (warm-up
# and the lost grants), or its run was refused with exit 69 and "history went backwards"; the
# handle's tokens only grow (or it was refused by name); each child's LEASEHOLD_FENCING_TOKEN is
# the token its run logged. The line prints the counts, first/last tokens before and after, the
# timelines (token >> 40, plus one) and the server's timeline and fence of hot across the restore.
#
# Pitfalls: PostgreSQL refuses recovery.signal without a restore_command (FATAL "must specify
# restore_command when standby mode is not enabled"), hence the archive although -X stream puts
# the backup's own WAL in it. The new timeline is the newest history file the archive has, plus
# one: a second restore from the same backup, after a restored server that did not archive its
# 00000002.history (this test's does not), is on timeline 2 again and hands out the first
# restore's tokens again (seen by hand: 1099511627777.. twice; only a long-lived handle refused);
# with archive_mode=on into the same archive it goes to timeline 3. The restored server takes
# the dead primary's port (SO_REUSEADDR: no wait), so the long-lived handle reconnects to it.
#
# --restore-kind same-timeline (not in the default run; it fails by design) starts the base
# backup without recovery.signal nor recovery settings: crash recovery from its backup_label,
# the server stays on timeline 1 (a file-system snapshot rolled back looks the same). The fresh
# runs after it then repeat the lost grants' tokens (nothing in the store remembers them); only
# a handle that saw them, the long-lived one, refuses ("history went backwards").
#
# --- split-brain ------------------------------------------------------------------------------
#
# An asynchronous pair (synchronous_standby_names=''): warm-up grant on the primary, replayed by
# the standby; the two cut apart with the failover's nftables cut (both directions of the
# replication connection; proven: a write made on the primary after the cut never reaches the
# standby); `pg_ctl promote` of the standby with the old primary left running: two primaries,
# on timelines 1 (OLD) and 2 (NEW). The guarded resource is a fenced register kept by this test
# outside PostgreSQL, in FencedDirectory's layout and rule (include/leasehold/fencing.h; the CLI
# exposes no FencedDirectory): record, .record.fence (highest accepted token), .record.lock
# (flock); a write with token t is accepted iff t >= the highest accepted. Worker B:
# `leasehold run --store NEW hot -- python3 writer.py B ...` (--writes 20 writes, --write-gap
# 0.05 s apart, each journaled under the flock); once B's first write is in, worker A:
# `leasehold run --store OLD hot -- python3 writer.py A ...`. Both granted is the split brain
# itself (reported: both_held_at_once). Verdict: 0 writes of A accepted after B's first write;
# B granted and writing; A granted or refused by name.
#
# Every scenario's output: one line per iteration, a summary per scenario and mode; exit 1 on
# any failure, kept directory named.

import argparse
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

PG_BIN = "/usr/lib/postgresql/15/bin"
EXIT_UNAVAILABLE = 69
SKIP_RC = 77
KEY = "hot"
DEFAULT_LEASEHOLD = os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "build", "tools", "cli",
    "leasehold"))
VERBOSE = False


def log(msg):
    if VERBOSE:
        print(f"  . {msg}", file=sys.stderr, flush=True)


class Skip(Exception):
    pass


class FixtureError(Exception):
    pass


def free_port():
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in (5432, 6432):
            return port


def wait_for(what, cond, timeout, step=0.05):
    """Polls cond() until it returns something true; returns that, or raises FixtureError."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise FixtureError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(step)


def check_machine(need_leasehold):
    if os.geteuid() != 0:
        raise Skip("needs root (nftables rules; initdb as the postgres user)")
    if shutil.which("nft") is None:
        raise Skip("no `nft` on PATH (nftables)")
    for tool in ("initdb", "postgres", "pg_ctl", "pg_basebackup", "pg_isready", "psql"):
        if not os.access(os.path.join(PG_BIN, tool), os.X_OK):
            raise Skip(f"no {PG_BIN}/{tool} (PostgreSQL 15)")
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise Skip("no `postgres` OS user (the postgresql package)")
    r = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        raise Skip(f"nft cannot list tables here: {r.stderr.strip()}")
    if need_leasehold and not os.access(need_leasehold, os.X_OK):
        raise FixtureError(f"{need_leasehold} is not an executable (build the CLI first)")


# --- the servers -------------------------------------------------------------------------------


class PgServer:
    """One postgres process (postmaster) as the postgres OS user, in its own process group, on a
    free loopback port, its Unix socket in the run's directory."""

    def __init__(self, name, datadir, sockdir, extra):
        self.name = name
        self.datadir = datadir
        self.sockdir = sockdir
        self.extra = extra
        self.port = free_port()
        self.proc = None
        self.log_path = os.path.join(sockdir, f"{name}.log")

    def start(self):
        log_f = open(self.log_path, "ab")
        argv = [f"{PG_BIN}/postgres", "-D", self.datadir, "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.sockdir}",
                "-c", "fsync=off", "-c", "max_connections=50", "-c", "shared_buffers=16MB"]
        for kv in self.extra:
            argv += ["-c", kv]
        self.proc = subprocess.Popen(argv, stdout=log_f, stderr=log_f, stdin=subprocess.DEVNULL,
                                     user="postgres", cwd=self.sockdir, start_new_session=True)
        log_f.close()

        def ready():
            if self.proc.poll() is not None:
                raise FixtureError(f"{self.name} exited (rc {self.proc.returncode}), see "
                                   f"{self.log_path}")
            return subprocess.run([f"{PG_BIN}/pg_isready", "-q", "-h", "127.0.0.1", "-p",
                                   str(self.port), "-t", "1"]).returncode == 0
        wait_for(f"{self.name} to accept connections", ready, 30)

    def psql(self, sql, timeout=10, check=True):
        r = subprocess.run([f"{PG_BIN}/psql", "-h", "127.0.0.1", "-p", str(self.port), "-U",
                            "postgres", "-d", "postgres", "-X", "-q", "-A", "-t",
                            "-v", "ON_ERROR_STOP=1", "-c", sql],
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise FixtureError(f"psql on {self.name} failed: {r.stderr.strip()}")
        return r.stdout.strip()

    def kill9(self):
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        # Backends of a killed postmaster end at once (same group); give them a moment.
        pgid = self.proc.pid
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and pids_in_group(pgid):
            time.sleep(0.02)

    def url(self, mode):
        return (f"postgres://postgres@127.0.0.1:{self.port}/postgres"
                f"?mode={mode}&command_timeout=1s")


def pids_in_group(pgid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                text = f.read()
            rest = text[text.rindex(")") + 2:].split()
            if int(rest[2]) == pgid and rest[0] not in "ZX":
                out.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return out


def procs_with_cwd(path):
    """Live processes (not zombies) whose cwd is path."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            if os.readlink(f"/proc/{d}/cwd") != path:
                continue
            with open(f"/proc/{d}/stat") as f:
                text = f.read()
            if text[text.rindex(")") + 2:].split()[0] in "ZX":
                continue
            out.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return out


def command_running(path):
    """True if the command of a run started in path (sh, or its sleep) still runs: processes
    whose cwd is path, leasehold itself and its keeper left out."""
    for pid in procs_with_cwd(path):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() in ("sh", "dash", "sleep"):
                    return True
        except OSError:
            pass
    return False


def run_as_postgres(argv, log_path, timeout, cwd):
    with open(log_path, "ab") as log_f:
        r = subprocess.run(argv, stdout=log_f, stderr=log_f, stdin=subprocess.DEVNULL,
                           user="postgres", cwd=cwd, timeout=timeout)
    if r.returncode != 0:
        raise FixtureError(f"{os.path.basename(argv[0])} failed (rc {r.returncode}), see "
                           f"{log_path}")


class Cut:
    """The nftables table that cuts the standby's WAL stream both ways, on the output hook:
    the walsender's packets to the walreceiver's port (sport PRIMARY dport WALRECEIVER), the
    walreceiver's to the primary, and any new connection the postgres user's sockets open to the
    primary's port (a walreceiver reconnecting: `meta skuid`); root's connections (leasehold,
    psql) pass. Dropping only the walreceiver's side is not a cut: the walsender still sends up
    to a TCP window (64 KiB) of WAL, which the standby writes and replays without being able to
    confirm it, so a small unconfirmed commit survives the failover."""

    def __init__(self, primary_port, receiver_port):
        self.table = f"leasehold_pgha_{os.getpid()}"
        self.port = primary_port
        self.receiver_port = receiver_port
        self.uid = pwd.getpwnam("postgres").pw_uid
        self.active = False

    def add(self):
        p, c = self.port, self.receiver_port
        rules = (f"table inet {self.table} {{\n"
                 f"  chain out {{\n"
                 f"    type filter hook output priority 0; policy accept;\n"
                 f"    tcp sport {p} tcp dport {c} drop\n"
                 f"    tcp sport {c} tcp dport {p} drop\n"
                 f"    meta skuid {self.uid} tcp dport {p} drop\n"
                 f"  }}\n"
                 f"}}\n")
        r = subprocess.run(["nft", "-f", "-"], input=rules, capture_output=True, text=True,
                           timeout=10)
        if r.returncode != 0:
            raise FixtureError(f"nft refused the cut: {r.stderr.strip()}")
        self.active = True

    def delete(self):
        if not self.active:
            return
        r = subprocess.run(["nft", "delete", "table", "inet", self.table], capture_output=True,
                           text=True, timeout=10)
        if r.returncode != 0 and "No such file" not in r.stderr:
            print(f"pg_ha: WARNING: could not delete nft table inet {self.table}: "
                  f"{r.stderr.strip()}", file=sys.stderr, flush=True)
        else:
            self.active = False


class Pair:
    """A primary and a standby in dir (owned by postgres), from the run's initdb template;
    synchronous (failover), or asynchronous (split-brain: the old primary must keep committing
    once the standby is cut off and promoted)."""

    def __init__(self, dir, template, sync=True):
        self.dir = dir
        self.template = template
        self.sync = sync
        self.primary = None
        self.standby = None
        self.cut = None
        self.t = {}  # timings (s)

    def start(self):
        t0 = time.monotonic()
        pdata = os.path.join(self.dir, "primary")
        run_as_postgres(["cp", "-a", self.template, pdata], os.path.join(self.dir, "setup.log"),
                        30, self.dir)
        with open(os.path.join(pdata, "pg_hba.conf"), "a") as f:
            f.write("host replication all 127.0.0.1/32 trust\n")
        # synchronous_standby_names on the primary's command line only: in postgresql.conf the
        # base backup would copy it, and the promoted standby, with no standby of its own,
        # would make every commit wait.
        self.primary = PgServer("primary", pdata, self.dir, [
            "wal_level=replica", "max_wal_senders=5",
            "synchronous_standby_names=" + ("*" if self.sync else ""),
            "synchronous_commit=on", "wal_sender_timeout=60s"])
        self.primary.start()
        t1 = time.monotonic()
        sdata = os.path.join(self.dir, "standby")
        run_as_postgres([f"{PG_BIN}/pg_basebackup", "-h", "127.0.0.1", "-p",
                         str(self.primary.port), "-U", "postgres", "-D", sdata, "-R",
                         "-X", "stream", "-c", "fast", "--no-sync"],
                        os.path.join(self.dir, "basebackup.log"), 60, self.dir)
        t2 = time.monotonic()
        self.standby = PgServer("standby", sdata, self.dir, [
            "hot_standby=on", "wal_receiver_status_interval=1s"])
        self.standby.start()
        want = "sync" if self.sync else "async"
        wait_for(f"sync_state={want} in pg_stat_replication",
                 lambda: self.primary.psql(
                     "SELECT sync_state FROM pg_stat_replication "
                     "WHERE state = 'streaming'") == want, 30)
        self.primary.psql("CREATE TABLE pgha_probe(x int)")  # on both: the probe is one row
        if not self.sync:
            self.wait_replayed()
        t3 = time.monotonic()
        self.t.update(primary=t1 - t0, basebackup=t2 - t1, standby_sync=t3 - t2)

    def cut_stream(self):
        """Cuts the standby's stream and proves it: a small write on the primary (root over TCP,
        so not dropped) must wait in SyncRep; it is then cancelled (it stays committed on the
        primary) and the standby must not have received it. fail_over() checks that the promoted
        standby lacks it."""
        t0 = time.monotonic()
        receiver = self.primary.psql("SELECT client_port FROM pg_stat_replication")
        if not receiver.isdigit():
            raise FixtureError(f"no walreceiver port in pg_stat_replication: {receiver!r}")
        self.cut = Cut(self.primary.port, int(receiver))
        self.cut.add()
        probe = subprocess.Popen(
            [f"{PG_BIN}/psql", "-h", "127.0.0.1", "-p", str(self.primary.port), "-U",
             "postgres", "-d", "postgres", "-X", "-q", "-c",
             "INSERT INTO pgha_probe VALUES (1)"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            def waiting():
                if probe.poll() is not None:
                    raise FixtureError("the cut did not take: a write on the primary committed "
                                       "without waiting for the standby")
                return self.primary.psql(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
            pids = wait_for("a write on the primary to wait in SyncRep", waiting, 10)
            time.sleep(0.3)  # still waiting a moment later: the reply is not coming
            if probe.poll() is not None:
                raise FixtureError("the probe write ended by itself: the cut is leaky")
            for pid in pids.split():
                self.primary.psql(f"SELECT pg_cancel_backend({int(pid)})")
            _, err = probe.communicate(timeout=10)
            if "synchronous replication" not in err:
                raise FixtureError(f"probe write ended without the sync-rep warning: {err!r}")
        finally:
            if probe.poll() is None:
                probe.kill()
                probe.wait()
        lsn = self.primary.psql("SELECT pg_current_wal_lsn()")
        behind = self.standby.psql(f"SELECT pg_last_wal_receive_lsn() < '{lsn}'")
        if behind != "t":
            raise FixtureError("the standby received the probe write: the cut is leaky")
        self.t["cut_verified"] = time.monotonic() - t0

    def wait_replayed(self, timeout=10):
        """Until the standby has replayed everything the primary wrote so far (async)."""
        lsn = self.primary.psql("SELECT pg_current_wal_lsn()")
        wait_for("the standby to replay the primary's WAL",
                 lambda: self.standby.psql(
                     f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'") == "t", timeout)

    def cut_apart(self):
        """split-brain: the same cut as cut_stream (both directions of the replication
        connection, and the postgres user's new connections to the primary), proven on an
        asynchronous pair: a write on the primary commits at once, and half a second later the
        standby has still not received it."""
        t0 = time.monotonic()
        receiver = self.primary.psql("SELECT client_port FROM pg_stat_replication")
        if not receiver.isdigit():
            raise FixtureError(f"no walreceiver port in pg_stat_replication: {receiver!r}")
        self.cut = Cut(self.primary.port, int(receiver))
        self.cut.add()
        self.primary.psql("INSERT INTO pgha_probe VALUES (2)")
        lsn = self.primary.psql("SELECT pg_current_wal_lsn()")
        time.sleep(0.5)
        if self.standby.psql(f"SELECT pg_last_wal_receive_lsn() < '{lsn}'") != "t":
            raise FixtureError("the standby received a write made after the cut: it is leaky")
        self.t["cut_verified"] = time.monotonic() - t0

    def promote_standby(self):
        """`pg_ctl promote` of the standby, the primary left running (split-brain), the cut
        kept: two servers that each accept writes, on timelines 1 and 2."""
        t0 = time.monotonic()
        run_as_postgres([f"{PG_BIN}/pg_ctl", "promote", "-D", self.standby.datadir, "-w",
                         "-t", "30"], os.path.join(self.dir, "promote.log"), 40, self.dir)
        wait_for("pg_is_in_recovery() = f on the standby",
                 lambda: self.standby.psql("SELECT pg_is_in_recovery()") == "f", 30)
        self.t["promote"] = time.monotonic() - t0
        if self.primary.psql("SELECT pg_is_in_recovery()") != "f":
            raise FixtureError("the old primary is in recovery: not a split brain")
        if self.standby.psql("SELECT count(*) FROM pgha_probe WHERE x = 2") != "0":
            raise FixtureError("the promoted standby has the write made after the cut")

    def fail_over(self):
        """kill -9 of the primary, the standby promoted and writable, then the cut removed; the
        promoted standby must lack the probe write. The cut stays until the promotion is done:
        the dead walsender's socket lives on in the kernel as an orphan that retransmits its
        unsent WAL, and with the cut gone first the standby receives and replays it before
        promoting (seen here: the cancelled probe write on the promoted standby, once in three
        runs); a primary that really died sends nothing more."""
        t0 = time.monotonic()
        self.primary.kill9()
        t1 = time.monotonic()
        run_as_postgres([f"{PG_BIN}/pg_ctl", "promote", "-D", self.standby.datadir, "-w",
                         "-t", "30"], os.path.join(self.dir, "promote.log"), 40, self.dir)
        wait_for("pg_is_in_recovery() = f on the standby",
                 lambda: self.standby.psql("SELECT pg_is_in_recovery()") == "f", 30)
        t2 = time.monotonic()
        self.cut.delete()
        self.t.update(kill=t1 - t0, promote=t2 - t1)
        if self.standby.psql("SELECT count(*) FROM pgha_probe") != "0":
            raise FixtureError("the promoted standby has the probe write: the cut was leaky")

    def stop(self):
        if self.cut is not None:
            self.cut.delete()
        for s in (self.primary, self.standby):
            if s is not None:
                s.kill9()


def make_template(root):
    tdir = os.path.join(root, "template")
    run_as_postgres([f"{PG_BIN}/initdb", "-D", tdir, "-U", "postgres", "-A", "trust",
                     "--no-sync", "--no-instructions"], os.path.join(root, "initdb.log"), 60, root)
    return tdir


# --- leasehold ---------------------------------------------------------------------------------


TOKEN_RE = re.compile(r"\bacquired\b.*\bfencing_token=(\d+)")


def token_of(stderr):
    m = TOKEN_RE.search(stderr or "")
    return int(m.group(1)) if m else None


def leasehold_env(home):
    env = dict(os.environ)
    env["HOME"] = home
    env["LEASEHOLD_STATE_DIR"] = os.path.join(home, "state")
    return env


def run_iteration(mode, it, root, template, leasehold, fixture_only):
    """One iteration; returns (result dict, dir)."""
    d = tempfile.mkdtemp(prefix=f"{mode}-{it}-", dir=root)
    pw = pwd.getpwnam("postgres")
    os.chown(d, pw.pw_uid, pw.pw_gid)
    res = {"mode": mode, "dir": d, "error": None, "rc_a": None, "marker_a": False,
           "token_a": None, "err_a": "", "rc_b": None, "marker_b": False, "token_b": None,
           "err_b": "", "a_alive_at_b": False, "t_a": None}
    pair = Pair(d, template)
    a_proc = None
    a_dir = os.path.join(d, "run-a")
    b_dir = os.path.join(d, "run-b")
    os.mkdir(a_dir)
    os.mkdir(b_dir)
    env = leasehold_env(d)
    try:
        pair.start()
        if not fixture_only:
            # 0. warm-up on the healthy pair: schema and the key's first grant on both servers.
            t0 = time.monotonic()
            r = subprocess.run([leasehold, "-v", "run", "--store", pair.primary.url(mode), KEY, "--",
                                "true"], capture_output=True, text=True, timeout=30, env=env,
                               cwd=d)
            if r.returncode != 0:
                raise FixtureError(f"warm-up run failed (rc {r.returncode}): {r.stderr.strip()}")
            res["token_warm"] = token_of(r.stderr)
            pair.t["warmup"] = time.monotonic() - t0
        # 1. the cut
        pair.cut_stream()
        if not fixture_only:
            # 2. the first run, against the cut primary
            marker_a = os.path.join(a_dir, "MARKER_A")
            t0 = time.monotonic()
            with open(os.path.join(d, "run-a.err"), "wb") as err_f:
                a_proc = subprocess.Popen(
                    [leasehold, "-v", "run", "--store", pair.primary.url(mode), KEY, "--", "sh", "-c",
                     f"touch {marker_a}; sleep 20"],
                    stdout=subprocess.DEVNULL, stderr=err_f, stdin=subprocess.DEVNULL, env=env,
                    cwd=a_dir, start_new_session=True)
            # Until it exits or starts its command (plus a moment for the acquired line).
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if a_proc.poll() is not None or os.path.exists(marker_a):
                    break
                time.sleep(0.02)
            res["t_a"] = time.monotonic() - t0
            if a_proc.poll() is None:
                time.sleep(0.2)
            res["rc_a"] = a_proc.poll()  # None: still running (holding, or stuck)
            res["marker_a"] = os.path.exists(marker_a)
            with open(os.path.join(d, "run-a.err"), errors="replace") as f:
                res["err_a"] = f.read()
            res["token_a"] = token_of(res["err_a"])
        # 3. failover
        pair.fail_over()
        if not fixture_only:
            # 4. the second run, on the promoted standby
            marker_b = os.path.join(b_dir, "MARKER_B")
            t0 = time.monotonic()
            b_proc = subprocess.Popen(
                [leasehold, "-v", "run", "--store", pair.standby.url(mode), KEY, "--", "sh", "-c",
                 f"touch {marker_b}; sleep 1"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                text=True, env=env, cwd=b_dir, start_new_session=True)
            deadline = time.monotonic() + 30
            # Watch for B's marker: A's command still running at that moment is two holders.
            while time.monotonic() < deadline and b_proc.poll() is None:
                if not res["marker_b"] and os.path.exists(marker_b):
                    res["marker_b"] = True
                    res["a_alive_at_b"] = command_running(a_dir)
                time.sleep(0.01)
            if b_proc.poll() is None:
                os.killpg(b_proc.pid, signal.SIGKILL)
            _, res["err_b"] = b_proc.communicate(timeout=10)
            res["rc_b"] = b_proc.returncode
            if not res["marker_b"] and os.path.exists(marker_b):
                res["marker_b"] = True  # appeared within the last poll: judge A now
                res["a_alive_at_b"] = command_running(a_dir)
            res["token_b"] = token_of(res["err_b"])
            res["t_b"] = time.monotonic() - t0
    except (FixtureError, subprocess.TimeoutExpired) as e:
        res["error"] = str(e)
    finally:
        if a_proc is not None:
            try:
                os.killpg(a_proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            a_proc.wait(timeout=10)
        for path in (a_dir, b_dir):
            for pid in procs_with_cwd(path):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        pair.stop()
        res["t"] = pair.t
    return res


def judge(res, fixture_only):
    """Fills in the verdict fields; returns the iteration's failures."""
    fails = []
    if res["error"]:
        fails.append(f"fixture error: {res['error']}")
        return fails
    if fixture_only:
        return fails
    res["two_holders"] = res["marker_a"] and res["a_alive_at_b"]
    ta, tb = res["token_a"], res["token_b"]
    res["regression"] = ta is not None and tb is not None and tb <= ta
    res["refused"] = res["rc_a"] == EXIT_UNAVAILABLE and not res["marker_a"]
    res["named"] = any(("synchronous" in line or "may have applied" in line)
                       for line in res["err_a"].splitlines())
    if res["two_holders"]:
        fails.append("two holders")
    if res["regression"]:
        fails.append(f"token regression ({tb} <= {ta})")
    if not res["refused"]:
        fails.append(f"first run not refused (rc {res['rc_a']}, command started: "
                     f"{res['marker_a']})")
    if res["rc_b"] != 0 or not res["marker_b"]:
        fails.append(f"second run failed (rc {res['rc_b']}, MARKER_B: {res['marker_b']})")
    return fails


# --- restore: a point-in-time restore to an earlier point -------------------------------------

HISTORY_BACKWARDS = "history went backwards"


def timeline_of(server):
    """The server's current timeline: the first 8 hex digits of its WAL insert position's file
    name (what the tokens' epoch is made of, LH_PG_EPOCH)."""
    return int(server.psql("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"), 16)


def token_timeline(token):
    return (token >> 40) + 1


def fence_of(server):
    return server.psql(f"SELECT fence FROM leasehold.leases WHERE key = '{KEY}'") or None


def grant_once(leasehold, url, cwd, env, tokens_file):
    """One `leasehold run --store URL hot -- sh -c 'echo $LEASEHOLD_FENCING_TOKEN >> FILE'`:
    returns {rc, token (from its stderr `acquired ... fencing_token=N` line, or None), err}."""
    r = subprocess.run([leasehold, "-v", "run", "--store", url, KEY, "--", "sh", "-c",
                        f'echo "$LEASEHOLD_FENCING_TOKEN" >> {tokens_file}'],
                       capture_output=True, text=True, timeout=30, env=env, cwd=cwd,
                       stdin=subprocess.DEVNULL)
    return {"rc": r.returncode, "token": token_of(r.stderr), "err": r.stderr}


def read_ints(path):
    try:
        with open(path) as f:
            return [int(x) for x in f.read().split() if x.isdigit()]
    except FileNotFoundError:
        return []


class ElectHandle:
    """The long-lived handle: one `leasehold elect --again` process (one store handle for all
    its terms) on election `hot` (lease key election:hot), started on the primary right after
    the base backup, so its first grant is one the restore loses. Each term's command appends
    LEASEHOLD_FENCING_TOKEN to a file and sleeps (an hour; stopped at the end): the first term
    spans the grants (a 30 s sleep ended during --long's 200, and the next campaign could have
    met the kill), the kill and the restore (its renewals fail while no server listens, then the
    restored server, on the same port, does not know the grant: lost, the command stopped), and
    --again campaigns at once on the restored server (a term of 1 s or more is not followed by a
    pause). A term that ended before the restored server listens would make the next campaign
    exit 69 (unavailable); the default --ttl of 10 s leaves that much time for the restore."""

    def __init__(self, leasehold, url, dir, env):
        self.dir = dir
        self.tokens_path = os.path.join(dir, "tokens")
        self.err_path = os.path.join(dir, "elect.err")
        self.argv = [leasehold, "elect", "--again", "--store", url, KEY, "--", "sh", "-c",
                     f'echo "$LEASEHOLD_FENCING_TOKEN" >> {self.tokens_path}; exec sleep 3600']
        self.env = env
        self.proc = None

    def start(self):
        with open(self.err_path, "wb") as err_f:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=err_f,
                                         stdin=subprocess.DEVNULL, env=self.env, cwd=self.dir,
                                         start_new_session=True)

    def tokens(self):
        return read_ints(self.tokens_path)

    def stderr(self):
        try:
            with open(self.err_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def stop(self):
        """SIGTERM (elect forwards it to the command and exits), then SIGKILL of the group and
        of anything left in its directory."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.proc.terminate()
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for pid in procs_with_cwd(self.dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_restore(mode, it, root, template, leasehold, n_grants, with_handle, kind="pitr"):
    """restore, one iteration: a primary archiving its WAL into the test's archive directory;
    a warm-up grant; a base backup (point P: `pg_basebackup -X stream`); n_grants grants of hot
    (each a `leasehold run`); kill -9 of the primary; the base backup started as the new server
    on the same port with recovery.signal, restore_command from the archive,
    recovery_target='immediate' and recovery_target_action='promote' (recovery ends at the
    backup's end: the n_grants grants are lost; promoted on a new timeline); n_grants more
    grants on it. Optionally the long-lived handle (ElectHandle) across all of it.
    kind "same-timeline": the base backup is started without recovery.signal nor recovery
    settings (crash recovery from its backup_label and the WAL it streamed, as a file-system
    snapshot rolled back would be): the server stays on timeline 1."""
    d = tempfile.mkdtemp(prefix=f"restore-{mode}-{it}-", dir=root)
    pw = pwd.getpwnam("postgres")
    os.chown(d, pw.pw_uid, pw.pw_gid)
    arch = os.path.join(d, "archive")
    os.mkdir(arch)
    os.chown(arch, pw.pw_uid, pw.pw_gid)
    gdir = os.path.join(d, "grants")
    hdir = os.path.join(d, "handle")
    os.mkdir(gdir)
    os.mkdir(hdir)
    env = leasehold_env(d)
    res = {"mode": mode, "dir": d, "error": None, "t": {}, "before": [], "after": [],
           "handle_tokens": [], "handle_err": "", "handle_rc": None}
    t = res["t"]
    primary = restored = handle = None
    try:
        t0 = time.monotonic()
        pdata = os.path.join(d, "primary")
        run_as_postgres(["cp", "-a", template, pdata], os.path.join(d, "setup.log"), 30, d)
        with open(os.path.join(pdata, "pg_hba.conf"), "a") as f:
            f.write("host replication all 127.0.0.1/32 trust\n")
        primary = PgServer("primary", pdata, d, [
            "wal_level=replica", "max_wal_senders=5", "archive_mode=on",
            f"archive_command=test ! -f {arch}/%f && cp %p {arch}/%f"])
        primary.start()
        url = primary.url(mode)
        t["primary"] = time.monotonic() - t0
        # The warm-up: schema and the key's first grant, in the base backup.
        w = grant_once(leasehold, url, gdir, env, os.path.join(gdir, "warmup"))
        if w["rc"] != 0:
            raise FixtureError(f"warm-up run failed (rc {w['rc']}): {one_line(w['err'])}")
        res["token_warm"] = w["token"]
        # P: the base backup.
        t0 = time.monotonic()
        run_as_postgres([f"{PG_BIN}/pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port),
                         "-U", "postgres", "-D", os.path.join(d, "backup"), "-X", "stream",
                         "-c", "fast", "--no-sync", "-v"],
                        os.path.join(d, "basebackup.log"), 60, d)
        t["basebackup"] = time.monotonic() - t0
        res["timeline_primary"] = timeline_of(primary)
        if with_handle:
            handle = ElectHandle(leasehold, url, hdir, env)
            handle.start()
            wait_for("the long-lived handle's first term",
                     lambda: handle.tokens() or handle.proc.poll() is not None, 15)
        # The grants after P, which the restore loses.
        t0 = time.monotonic()
        res["before"] = [grant_once(leasehold, url, gdir, env, os.path.join(gdir, "before"))
                         for _ in range(n_grants)]
        t["grants_before"] = time.monotonic() - t0
        res["fence_primary"] = fence_of(primary)
        handle_terms = len(handle.tokens()) if handle is not None else 0
        # The restore.
        t0 = time.monotonic()
        primary.kill9()
        bdata = os.path.join(d, "backup")
        recovery = []
        if kind == "pitr":
            with open(os.path.join(bdata, "recovery.signal"), "w"):
                pass
            os.chown(os.path.join(bdata, "recovery.signal"), pw.pw_uid, pw.pw_gid)
            recovery = [f"restore_command=cp {arch}/%f %p", "recovery_target=immediate",
                        "recovery_target_action=promote"]
        restored = PgServer("restored", bdata, d, ["wal_level=replica"] + recovery)
        restored.port = primary.port  # the same address: clients (and the handle) reconnect
        restored.start()
        wait_for("pg_is_in_recovery() = f on the restored server",
                 lambda: restored.psql("SELECT pg_is_in_recovery()") == "f", 30)
        t["restore"] = time.monotonic() - t0
        res["timeline_restored"] = timeline_of(restored)
        res["fence_restored"] = fence_of(restored)
        if res["fence_restored"] != str(res["token_warm"]):
            raise FixtureError(f"the restore did not go back to P: fence of {KEY} is "
                               f"{res['fence_restored']} on the restored server, the warm-up "
                               f"token was {res['token_warm']}")
        # The grants on the restored server.
        t0 = time.monotonic()
        res["after"] = [grant_once(leasehold, url, gdir, env, os.path.join(gdir, "after"))
                        for _ in range(n_grants)]
        t["grants_after"] = time.monotonic() - t0
        if handle is not None:
            # Until the handle has a term on the restored server (a token more than at the kill),
            # or it ended (refused).
            deadline = time.monotonic() + 25
            while time.monotonic() < deadline and handle.proc.poll() is None:
                if len(handle.tokens()) > handle_terms:
                    break
                time.sleep(0.05)
            t["handle_new_term"] = time.monotonic() - t0
    except (FixtureError, subprocess.TimeoutExpired) as e:
        res["error"] = str(e)
    finally:
        if handle is not None:
            res["handle_rc"] = handle.proc.poll()  # None: still running when stopped
            handle.stop()
            res["handle_tokens"] = handle.tokens()
            res["handle_err"] = handle.stderr()
        for pid in procs_with_cwd(gdir):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for s in (primary, restored):
            if s is not None:
                s.kill9()
    if not res["error"]:
        res["tokens_file_before"] = read_ints(os.path.join(gdir, "before"))
        res["tokens_file_after"] = read_ints(os.path.join(gdir, "after"))
    return res


def judge_restore(res):
    """Every grant after the restore must carry a token above every token seen before it (the
    warm-up's and the lost grants'), or be refused with exit 69 naming the history going
    backwards. Fills in the counts; returns the failures."""
    fails = []
    if res["error"]:
        return [f"fixture error: {res['error']}"]
    before = [res["token_warm"]] + [g["token"] for g in res["before"] if g["token"] is not None]
    bad_before = [g for g in res["before"] if g["rc"] != 0 or g["token"] is None]
    if bad_before:
        fails.append(f"{len(bad_before)} grant(s) before the restore failed (first: rc "
                     f"{bad_before[0]['rc']}: {one_line(bad_before[0]['err'])})")
    top = max(before)
    granted = [g for g in res["after"] if g["rc"] == 0 and g["token"] is not None]
    refused = [g for g in res["after"]
               if g["rc"] == EXIT_UNAVAILABLE and HISTORY_BACKWARDS in g["err"]]
    other = [g for g in res["after"] if g not in granted and g not in refused]
    regressions = [g["token"] for g in granted if g["token"] <= top]
    res.update(before_tokens=before, top_before=top, granted_after=granted,
               refused_after=refused, other_after=other, regressions=regressions)
    if regressions:
        fails.append(f"{len(regressions)} token regression(s) after the restore (first "
                     f"{regressions[0]} <= {top})")
    if other:
        fails.append(f"{len(other)} run(s) after the restore neither granted nor refused as "
                     f"'{HISTORY_BACKWARDS}' (first: rc {other[0]['rc']}: "
                     f"{one_line(other[0]['err'])})")
    # The command saw the token the run logged.
    if res["tokens_file_before"] != [g["token"] for g in res["before"] if g["rc"] == 0] or \
            res["tokens_file_after"] != [g["token"] for g in granted]:
        fails.append("LEASEHOLD_FENCING_TOKEN differs from the logged fencing_token")
    # The long-lived handle: its tokens only grow, or it was refused by name.
    h = res["handle_tokens"]
    res["handle_regressions"] = [x for i, x in enumerate(h) if i and x <= max(h[:i])]
    res["handle_refused"] = HISTORY_BACKWARDS in res["handle_err"]
    res["handle_crossed"] = bool(h) and token_timeline(h[0]) < res["timeline_restored"] <= \
        token_timeline(h[-1])
    if res["handle_regressions"]:
        fails.append(f"the long-lived handle's tokens went backwards: {h}")
    return fails


def timelines(tokens):
    return sorted({token_timeline(x) for x in tokens})


def restore_line(mode, it, res, fails):
    if res["error"]:
        return f"pg_ha: restore mode={mode} iter={it} fixture ERROR {res['error']} " \
               f"{fmt_t(res['t'])}"
    lost = [g["token"] for g in res["before"] if g["token"] is not None]
    after = [g["token"] for g in res["granted_after"]]
    verdict = ", ".join(fails) if fails else "ok"
    line = (f"pg_ha: restore mode={mode} iter={it} verdict={verdict!r} "
            f"before: warm-up={res['token_warm']} grants={len(lost)}/{len(res['before'])} "
            f"first={lost[0] if lost else None} last={lost[-1] if lost else None} "
            f"timelines={timelines(res['before_tokens'])}; "
            f"server timeline {res['timeline_primary']} -> {res['timeline_restored']}, "
            f"fence({KEY}) {res['fence_primary']} -> {res['fence_restored']}; "
            f"after: granted={len(after)}/{len(res['after'])} "
            f"refused_history={len(res['refused_after'])} "
            f"first={after[0] if after else None} last={after[-1] if after else None} "
            f"timelines={timelines(after)} regressions={len(res['regressions'])}")
    if res["handle_rc"] is not None or res["handle_tokens"] or res["handle_err"]:
        h = res["handle_tokens"]
        line += (f"; handle: tokens={h} timelines={timelines(h)} "
                 f"crossed={res['handle_crossed']} regressions={len(res['handle_regressions'])}"
                 f" refused_history={res['handle_refused']} "
                 f"rc={'running' if res['handle_rc'] is None else res['handle_rc']}")
    return line + f"; {fmt_t(res['t'])}"


# --- split-brain: the old primary is not demoted ----------------------------------------------

# The guarded resource, outside PostgreSQL: a fenced register with FencedDirectory's layout and
# rule (include/leasehold/fencing.h): record NAME, its highest accepted token in .NAME.fence,
# an flock on .NAME.lock for the compare-and-write; a write with token t is accepted iff
# t >= the highest accepted so far. The child command of `leasehold run`: N writes GAP seconds
# apart with $LEASEHOLD_FENCING_TOKEN, each journaled (under the flock, so the journal's order
# is the register's) as `<label> <token> <i> accepted|refused <highest before>`.
WRITER = r'''
import fcntl, os, sys, time
label, n, gap, reg, journal = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], \
    sys.argv[5]
token = int(os.environ["LEASEHOLD_FENCING_TOKEN"])
name = "resource"


def replace(path, data):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


accepted = refused = 0
for i in range(n):
    lock = os.open(os.path.join(reg, "." + name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(os.path.join(reg, "." + name + ".fence")) as f:
                highest = int(f.read().strip() or 0)
        except FileNotFoundError:
            highest = 0
        ok = token >= highest
        if ok:
            if token != highest:
                replace(os.path.join(reg, "." + name + ".fence"), "%d\n" % token)
            replace(os.path.join(reg, name), "%s %d %d\n" % (label, token, i))
        with open(journal, "a") as j:
            j.write("%s %d %d %s %d\n" % (label, token, i, "accepted" if ok else "refused",
                                           highest))
    finally:
        os.close(lock)
    accepted += ok
    refused += not ok
    if i + 1 < n:
        time.sleep(gap)
print("writer %s: token=%d accepted=%d refused=%d" % (label, token, accepted, refused),
      file=sys.stderr)
'''


def read_journal(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) == 5:
                    out.append({"label": p[0], "token": int(p[1]), "i": int(p[2]),
                                "ok": p[3] == "accepted", "highest": int(p[4])})
    except FileNotFoundError:
        pass
    return out


def run_split_brain(mode, it, root, template, leasehold, n_writes, gap):
    """split-brain, one iteration: an asynchronous pair; a warm-up grant on the primary,
    replayed by the standby; the two cut apart (Cut, as failover's); the standby promoted, the
    old primary left running: two primaries. Worker B: `leasehold run --store NEW hot --
    writer B`; once B's first write is in the register, worker A: `leasehold run --store OLD
    hot -- writer A`."""
    d = tempfile.mkdtemp(prefix=f"split-{mode}-{it}-", dir=root)
    pw = pwd.getpwnam("postgres")
    os.chown(d, pw.pw_uid, pw.pw_gid)
    reg = os.path.join(d, "register")
    journal = os.path.join(d, "journal")
    writer = os.path.join(d, "writer.py")
    a_dir, b_dir = os.path.join(d, "run-a"), os.path.join(d, "run-b")
    for p in (reg, a_dir, b_dir):
        os.mkdir(p)
    with open(writer, "w") as f:
        f.write(WRITER)
    env = leasehold_env(d)
    res = {"mode": mode, "dir": d, "error": None, "journal": []}
    pair = Pair(d, template, sync=False)
    procs = {}
    try:
        pair.start()
        r = subprocess.run([leasehold, "-v", "run", "--store", pair.primary.url(mode), KEY, "--",
                            "true"], capture_output=True, text=True, timeout=30, env=env, cwd=d)
        if r.returncode != 0:
            raise FixtureError(f"warm-up run failed (rc {r.returncode}): {r.stderr.strip()}")
        res["token_warm"] = token_of(r.stderr)
        pair.wait_replayed()
        pair.cut_apart()
        pair.promote_standby()
        res["timeline_old"] = timeline_of(pair.primary)
        res["timeline_new"] = timeline_of(pair.standby)

        def start(label, server, cwd):
            err = open(os.path.join(d, f"run-{label.lower()}.err"), "wb")
            try:
                procs[label] = subprocess.Popen(
                    [leasehold, "-v", "run", "--store", server.url(mode), KEY, "--", sys.executable,
                     writer, label, str(n_writes), str(gap), reg, journal],
                    stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, env=env,
                    cwd=cwd, start_new_session=True)
            finally:
                err.close()

        t0 = time.monotonic()
        start("B", pair.standby, b_dir)
        wait_for("B's first write in the register (or B's exit)",
                 lambda: procs["B"].poll() is not None or
                 any(j["label"] == "B" for j in read_journal(journal)), 15)
        res["t_b_first_write"] = time.monotonic() - t0
        start("A", pair.primary, a_dir)
        deadline = time.monotonic() + 30 + n_writes * gap
        while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
            time.sleep(0.02)
        pair.t["workers"] = time.monotonic() - t0
        for label, p in procs.items():
            if p.poll() is None:
                raise FixtureError(f"worker {label} still running after the deadline")
    except (FixtureError, subprocess.TimeoutExpired) as e:
        res["error"] = str(e)
    finally:
        for p in procs.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
        for path in (a_dir, b_dir):
            for pid in procs_with_cwd(path):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        pair.stop()
        res["t"] = pair.t
    for label, p in procs.items():
        res[f"rc_{label.lower()}"] = p.returncode
        with open(os.path.join(d, f"run-{label.lower()}.err"), errors="replace") as f:
            res[f"err_{label.lower()}"] = f.read()
        res[f"token_{label.lower()}"] = token_of(res[f"err_{label.lower()}"])
    res["journal"] = read_journal(journal)
    return res


def judge_split_brain(res):
    """0 stale writes: no write of A accepted after B's first accepted write. B must have been
    granted and have written; A granted too is the split brain itself (reported), A refused
    by leasehold is fine."""
    if res["error"]:
        return [f"fixture error: {res['error']}"]
    fails = []
    j = res["journal"]
    first_b = next((i for i, e in enumerate(j) if e["label"] == "B" and e["ok"]), None)
    res["a_accepted"] = sum(e["ok"] for e in j if e["label"] == "A")
    res["a_refused"] = sum(not e["ok"] for e in j if e["label"] == "A")
    res["b_accepted"] = sum(e["ok"] for e in j if e["label"] == "B")
    res["b_refused"] = sum(not e["ok"] for e in j if e["label"] == "B")
    res["stale"] = 0 if first_b is None else sum(
        1 for e in j[first_b + 1:] if e["label"] == "A" and e["ok"])
    # Both held at once: A's first register access came before B's last one.
    a_idx = [i for i, e in enumerate(j) if e["label"] == "A"]
    b_idx = [i for i, e in enumerate(j) if e["label"] == "B"]
    res["both_held"] = bool(a_idx and b_idx and a_idx[0] < b_idx[-1])
    if res.get("rc_b") != 0 or res.get("token_b") is None or first_b is None:
        fails.append(f"B was not granted on the promoted server or never wrote (rc "
                     f"{res.get('rc_b')}, token {res.get('token_b')}): "
                     f"{one_line(res.get('err_b'))}")
    if res["stale"]:
        fails.append(f"{res['stale']} stale write(s) of A accepted after B's first write")
    a_ok = res.get("rc_a") == 0 or (res.get("rc_a") == EXIT_UNAVAILABLE and
                                    HISTORY_BACKWARDS in res.get("err_a", ""))
    if not a_ok:
        fails.append(f"A neither granted nor refused by name (rc {res.get('rc_a')}): "
                     f"{one_line(res.get('err_a'))}")
    return fails


def split_line(mode, it, res, fails):
    if res["error"]:
        return f"pg_ha: split-brain mode={mode} iter={it} fixture ERROR {res['error']} " \
               f"{fmt_t(res['t'])}"
    verdict = ", ".join(fails) if fails else "ok"

    def tl(tok):
        return None if tok is None else token_timeline(tok)
    return (f"pg_ha: split-brain mode={mode} iter={it} verdict={verdict!r} "
            f"OLD (timeline {res['timeline_old']}) A: rc={res.get('rc_a')} "
            f"token={res.get('token_a')} (timeline {tl(res.get('token_a'))}) "
            f"writes accepted={res['a_accepted']} refused={res['a_refused']}; "
            f"NEW (timeline {res['timeline_new']}) B: rc={res.get('rc_b')} "
            f"token={res.get('token_b')} (timeline {tl(res.get('token_b'))}) "
            f"writes accepted={res['b_accepted']} refused={res['b_refused']}; "
            f"both_held_at_once={res['both_held']} stale_writes_after_B={res['stale']} "
            f"(warm-up token {res.get('token_warm')}); {fmt_t(res['t'])}")


def fmt_t(t):
    return " ".join(f"{k}={v:.2f}s" for k, v in t.items())


def one_line(s):
    return " | ".join(line.strip() for line in (s or "").strip().splitlines()) or "-"


SCENARIOS = ("failover", "restore", "split-brain")


def report_failover(mode, it, res, fails, fixture_only, counts):
    if fixture_only or res["error"]:
        line = (f"pg_ha: mode={mode} iter={it} fixture "
                f"{'ERROR ' + res['error'] if res['error'] else 'ok'} "
                f"{fmt_t(res['t'])}")
    else:
        verdict = ", ".join(fails) if fails else "ok"
        line = (f"pg_ha: mode={mode} iter={it} verdict={verdict!r} "
                f"A: rc={res['rc_a']} started={res['marker_a']} "
                f"token={res['token_a']} after={res['t_a']:.2f}s; "
                f"B: rc={res['rc_b']} started={res['marker_b']} "
                f"token={res['token_b']} A_running_at_B={res['a_alive_at_b']} "
                f"(warm-up token {res.get('token_warm')}); {fmt_t(res['t'])}")
    print(line, flush=True)
    if not fixture_only and not res["error"]:
        print(f"pg_ha:   A stderr: {one_line(res['err_a'])}", flush=True)
        if fails:
            print(f"pg_ha:   B stderr: {one_line(res['err_b'])}", flush=True)
    if res["error"]:
        counts["errors"] += 1
    elif not fixture_only:
        counts["two_holders"] += res["two_holders"]
        counts["token_regressions"] += res["regression"]
        counts["first_run_refused"] += res["refused"]
        counts["refusal_named"] += res["refused"] and res["named"]
        counts["second_run_failed"] += (res["rc_b"] != 0 or not res["marker_b"])
        if res["refused"]:
            counts["_refusal_s"].append(res["t_a"])


def report_restore(mode, it, res, fails, counts):
    print(restore_line(mode, it, res, fails), flush=True)
    if res["error"]:
        counts["errors"] += 1
        return
    counts["grants_before"] += len(res["before"])
    counts["grants_after"] += len(res["after"])
    counts["regressions"] += len(res["regressions"])
    counts["refused_history"] += len(res["refused_after"])
    counts["other_failures"] += len(res["other_after"])
    counts["handle_crossed"] += res["handle_crossed"]
    counts["handle_regressions"] += len(res["handle_regressions"])
    counts["handle_refused_history"] += res["handle_refused"]
    for g in res["refused_after"][:1]:
        print(f"pg_ha:   refused run stderr: {one_line(g['err'])}", flush=True)
    if res["handle_refused"] or fails:
        print(f"pg_ha:   handle stderr: {one_line(res['handle_err'])}", flush=True)


def report_split(mode, it, res, fails, counts):
    print(split_line(mode, it, res, fails), flush=True)
    if res["error"]:
        counts["errors"] += 1
        return
    counts["stale_writes"] += res["stale"]
    counts["both_held_at_once"] += res["both_held"]
    counts["a_granted"] += res.get("rc_a") == 0
    counts["a_writes_refused"] += res["a_refused"]
    counts["b_writes_accepted"] += res["b_accepted"]
    if fails:
        for label in ("A", "B"):
            print(f"pg_ha:   {label} stderr: {one_line(res.get('err_' + label.lower()))}",
                  flush=True)


def main():
    global VERBOSE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--scenarios", default="all",
                    help="comma-separated: failover, restore, split-brain (default: all)")
    ap.add_argument("--iterations", type=int, default=1, help="per scenario and mode")
    ap.add_argument("--modes", default="table,advisory")
    ap.add_argument("--leasehold", default=DEFAULT_LEASEHOLD)
    ap.add_argument("--long", action="store_true",
                    help="restore: 200 grants before and after the restore (else 10)")
    ap.add_argument("--grants", type=int, default=None,
                    help="restore: grants before the restore, and as many after (default 10, "
                         "200 with --long)")
    ap.add_argument("--restore-kind", choices=("pitr", "same-timeline"), default="pitr",
                    help="restore: pitr (recovery.signal, recovery_target='immediate', promote: "
                         "a new timeline), or same-timeline (the base backup started without "
                         "recovery.signal: crash recovery, timeline 1 again; fresh runs then "
                         "repeat the lost grants' tokens, a known limit: expect a failure)")
    ap.add_argument("--no-handle", action="store_true",
                    help="restore: without the long-lived handle (leasehold elect --again)")
    ap.add_argument("--writes", type=int, default=20, help="split-brain: writes per worker")
    ap.add_argument("--write-gap", type=float, default=0.05,
                    help="split-brain: seconds between a worker's writes")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directories")
    ap.add_argument("--fixture-only", action="store_true",
                    help="failover's servers only: pair, sync, cut verified, kill, promote; "
                         "timings")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    VERBOSE = args.verbose
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in ("table", "advisory"):
            ap.error(f"unknown mode {m!r} (table, advisory)")
    if args.scenarios == "all":
        scenarios = ["failover"] if args.fixture_only else list(SCENARIOS)
    else:
        scenarios = [s for s in args.scenarios.split(",") if s]
        for s in scenarios:
            if s not in SCENARIOS:
                ap.error(f"unknown scenario {s!r} ({', '.join(SCENARIOS)})")
        if args.fixture_only and scenarios != ["failover"]:
            ap.error("--fixture-only is failover's only")
    n_grants = args.grants if args.grants is not None else (200 if args.long else 10)
    if n_grants < 1 or args.writes < 1 or args.iterations < 1:
        ap.error("--grants, --writes and --iterations must be at least 1")
    leasehold = None if args.fixture_only else os.path.abspath(args.leasehold)
    try:
        check_machine(leasehold)
    except Skip as e:
        print(f"pg_ha: SKIP: {e}", flush=True)
        return SKIP_RC
    except FixtureError as e:
        print(f"pg_ha: ERROR: {e}", flush=True)
        return 2

    root = tempfile.mkdtemp(prefix="leasehold-pgha-")
    pw = pwd.getpwnam("postgres")
    os.chown(root, pw.pw_uid, pw.pw_gid)
    failed = False
    start = time.monotonic()
    try:
        t0 = time.monotonic()
        try:
            template = make_template(root)
        except FixtureError as e:
            print(f"pg_ha: ERROR: {e}; kept {root}", flush=True)
            return 1
        print(f"pg_ha: initdb template {time.monotonic() - t0:.2f}s", flush=True)
        for scenario in scenarios:
            for mode in modes:
                s0 = time.monotonic()
                if scenario == "failover":
                    counts = {"two_holders": 0, "token_regressions": 0, "first_run_refused": 0,
                              "refusal_named": 0, "second_run_failed": 0, "errors": 0,
                              "_refusal_s": []}
                elif scenario == "restore":
                    counts = {"grants_before": 0, "grants_after": 0, "regressions": 0,
                              "refused_history": 0, "other_failures": 0, "handle_crossed": 0,
                              "handle_regressions": 0, "handle_refused_history": 0, "errors": 0}
                else:
                    counts = {"stale_writes": 0, "both_held_at_once": 0, "a_granted": 0,
                              "a_writes_refused": 0, "b_writes_accepted": 0, "errors": 0}
                for it in range(1, args.iterations + 1):
                    if scenario == "failover":
                        res = run_iteration(mode, it, root, template, leasehold,
                                            args.fixture_only)
                        fails = judge(res, args.fixture_only)
                        report_failover(mode, it, res, fails, args.fixture_only, counts)
                    elif scenario == "restore":
                        res = run_restore(mode, it, root, template, leasehold, n_grants,
                                          not args.no_handle, args.restore_kind)
                        fails = judge_restore(res)
                        report_restore(mode, it, res, fails, counts)
                    else:
                        res = run_split_brain(mode, it, root, template, leasehold, args.writes,
                                              args.write_gap)
                        fails = judge_split_brain(res)
                        report_split(mode, it, res, fails, counts)
                    if fails:
                        failed = True
                        print(f"pg_ha:   kept {res['dir']}", flush=True)
                    elif not args.keep:
                        shutil.rmtree(res["dir"], ignore_errors=True)
                took = time.monotonic() - s0
                if scenario == "failover":
                    if args.fixture_only:
                        print(f"pg_ha: mode={mode} iterations={args.iterations} fixture_errors="
                              f"{counts['errors']} ({took:.1f}s)", flush=True)
                        continue
                    ts = sorted(counts.pop("_refusal_s"))
                    refusal = (f" refused_after_s=min {ts[0]:.2f} median "
                               f"{ts[len(ts) // 2]:.2f} max {ts[-1]:.2f}" if ts else "")
                    print(f"pg_ha: mode={mode} iterations={args.iterations} "
                          + " ".join(f"{k}={v}" for k, v in counts.items())
                          + f"{refusal} ({took:.1f}s)", flush=True)
                elif scenario == "restore":
                    print(f"pg_ha: restore mode={mode} iterations={args.iterations} "
                          f"kind={args.restore_kind} grants={n_grants}+{n_grants} "
                          + " ".join(f"{k}={v}" for k, v in counts.items())
                          + f" ({took:.1f}s)", flush=True)
                else:
                    print(f"pg_ha: split-brain mode={mode} iterations={args.iterations} "
                          f"writes={args.writes} "
                          + " ".join(f"{k}={v}" for k, v in counts.items())
                          + f" ({took:.1f}s)", flush=True)
    finally:
        print(f"pg_ha: total {time.monotonic() - start:.1f}s", flush=True)
        if failed or args.keep:
            shutil.rmtree(os.path.join(root, "template"), ignore_errors=True)
            print(f"pg_ha: kept {root}", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
