#!/usr/bin/env python3
# File: tests/cli/slots_test.py
#
# End-to-end tests of `leasehold run --once-per` (schedule slots) and `--hold-at-least` on one
# store, with real processes and, for the fleet, hosts whose clocks disagree:
#
#   python3 tests/cli/slots_test.py --store sqlite|redis|postgres|postgres-table|etcd|zk \
#       --leasehold build/tools/cli/leasehold [--require-faketime] [--slots N] [-v] [SlotsTest.test_x]
#
# The fleet (test_fleet_*): 5 "hosts" per slot over --slots (default 20; CTest: 6) consecutive
# slots of --once-per 2s. Each
# host is `leasehold run --quiet --once-per 2s KEY -- JOB` under libfaketime (FAKETIME=-0.6,
# -0.3, +0, +0.3, +0.6 s, FAKETIME_DONT_FAKE_MONOTONIC=1), launched when ITS clock reads the
# boundary, i.e. at real time boundary - offset (a host whose clock is ahead fires early). JOB
# appends "SLOT FENCING_TOKEN HOST ok|fail" to a shared file and sleeps 100 ms. The checks:
# exactly one successful run per slot, no slot run twice, none missed, exit codes only
# 0/75/80 (and the job's own 3 in the failing variant), nothing on stderr for 75/80 with
# --quiet, fencing tokens rising slot after slot, and every run in a slot its host could have
# named (its clock, or the store's, between its start and its end, plus the tolerance).
# On a busy machine a host can start late: a slot counts as missed only if one of its hosts
# started within P/4 of its plan (it then named that slot before any host could name the next);
# a slot none of whose hosts started in time is reported as untested, not failed (and more than
# a few of those fail the run: the machine was too busy for the test to mean anything).
# A double run is always a failure, whatever the lateness. The negative control (sqlite only)
# puts every host on a store of its own for 3 slots: the checker must report 5 runs per slot.
#
# Also: --keep-history 1h keeps a 2 s grid's run in status past two periods; --hold-at-least 5s
# with a 1 s job (refused 75 at 2 s, free from 5 s, taken at 6 s), the
# bad --once-per arguments (one stderr line, exit 64), and a done slot (80, silent with --quiet;
# status and status --json show the run).
#
# The stores: sqlite (a file in the test's temp dir; its clock is each host's own, faked one)
# and, through the store classes of tests/chaos/chaos.py, a throwaway redis-server, PostgreSQL
# 15 (advisory or ?mode=table), etcd or ZooKeeper on free loopback ports, reached directly (the
# chaos fault proxy is closed: no faults here). Redis, PostgreSQL and ZooKeeper name the slot
# by the server's clock (this host's real one), etcd and sqlite by the (faked) local clock.
#
# faketime: without libfaketime the fleet tests fail with --require-faketime (CTest passes it:
# scripts/install-deps.sh installs the package) and are skipped, with a message, without it.
#
# Every loop is bounded in count and time; the figures are printed as cli_harness's figure().

import calendar
import collections
import heapq
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import cli_harness
from cli_harness import CliHarness, figure

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "chaos"))
import chaos  # noqa: E402  (the store starters: RedisStore, PostgresStore, EtcdStore, ZkStore)

EXIT_USAGE = 64
EXIT_HELD = 75
EXIT_DONE = 80
JOB_FAIL = 3

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
PERIOD = 2.0  # --once-per 2s
SLOTS = 20  # --slots (CTest passes 6: CI time; the figures in RESULTS.md are from 20)
OFFSETS_MS = (-600, -300, 0, 300, 600)  # the hosts' clock skews
TOLERANCE = min(PERIOD / 4, 300.0)  # leasehold's default --slot-tolerance: min(P/4, 5m)
JOB_SLEEP = 0.1
RETRY_AFTER = 0.3  # the failing variant: a host whose command failed tries once more
ON_TIME = PERIOD / 4  # a host that started within this of its plan certainly named its slot
MAX_UNTESTED = 3  # slots none of whose hosts started in time, before the run is refused

STORE = "sqlite"  # --store
SERVER = None  # the chaos StoreControl of a server store, started once by setUpModule
SERVER_URL = None
REQUIRE_FAKETIME = False
STORE_CLOCK_IS_LOCAL = {"sqlite": True, "etcd": True}  # the others: the server's clock

# The job of every fleet host. FAIL_SLOTS (the failing variant): the first run of each of
# these slots creates its marker with O_EXCL (sh's noclobber) and exits 3.
JOB = r'''
line="$LEASEHOLD_SLOT $LEASEHOLD_FENCING_TOKEN $HOST_ID"
case " $FAIL_SLOTS " in
  *" $LEASEHOLD_SLOT "*)
    if (set -C; : > "$MARKS/$LEASEHOLD_SLOT") 2>/dev/null; then
      echo "$line fail" >> "$RUNS"; exit 3
    fi ;;
esac
echo "$line ok" >> "$RUNS"
sleep 0.1
'''


def count_figure(name, value, bound):
    """figure() for counts."""
    print(f"\n  [figure] {name}: {value} (bound {bound})", file=sys.stderr, flush=True)


def iso(t):
    """LEASEHOLD_SLOT's spelling of the epoch seconds t (whole milliseconds, UTC)."""
    ms = round(t * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def parse_iso(s):
    """Epoch seconds of LEASEHOLD_SLOT's 2026-12-01T17:00:00.000Z."""
    base, frac = s.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + int(frac) / 1000


def pct(values, q):
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def faketime_problem():
    """None if libfaketime is installed and shifts a child's clock, else why not."""
    if not os.path.exists(FAKETIME_LIB):
        return f"{FAKETIME_LIB} not found (Debian package faketime; scripts/install-deps.sh)"
    env = dict(os.environ, LD_PRELOAD=FAKETIME_LIB, FAKETIME="+100.5",
               FAKETIME_DONT_FAKE_MONOTONIC="1")
    before = time.time()
    r = subprocess.run(["date", "+%s.%N"], env=env, capture_output=True, text=True, timeout=10)
    try:
        shift = float(r.stdout) - before
    except ValueError:
        return f"date under libfaketime printed {r.stdout!r} {r.stderr!r}"
    if not 100.0 < shift < 102.0:
        return f"libfaketime with FAKETIME=+100.5 shifted date(1) by {shift:.3f}s"
    return None


class Attempt:
    """One `leasehold run` of a fleet host."""

    def __init__(self, slot, offset_ms, attempt, planned):
        self.slot = slot  # the slot index it was launched for
        self.offset_ms = offset_ms
        self.attempt = attempt
        self.planned = planned  # real epoch seconds
        self.host = f"h{offset_ms:+d}-s{slot}-a{attempt}"
        self.spawned = self.ended = None
        self.rc = None
        self.proc = None

    @property
    def lateness(self):
        return self.spawned - self.planned


class SlotsTest(CliHarness, unittest.TestCase):
    TMP_PREFIX = "leasehold-slots-"

    def store_url(self):
        if SERVER_URL:
            return SERVER_URL
        return "sqlite://" + os.path.join(self.tmp, "leases.db") + "?busy_timeout=10s"

    def setUp(self):
        super().setUp()
        # A server is shared by the tests: a key of their own.
        self.key = f"slots-{self._testMethodName[5:]}-{random.randrange(1 << 32):08x}"

    def need_faketime(self):
        problem = faketime_problem()
        if problem is None:
            return
        if REQUIRE_FAKETIME:
            self.fail(f"faketime is required (--require-faketime) for the skewed fleet: {problem}")
        print(f"\n  slots_test: SKIP the fleet: {problem}; install faketime to run it",
              file=sys.stderr, flush=True)
        self.skipTest(problem)

    # --- the fleet -----------------------------------------------------------------------------

    def host_env(self, a, runs, marks, fail_slots):
        env = dict(self.env, LD_PRELOAD=FAKETIME_LIB, FAKETIME=f"{a.offset_ms / 1000:+.3f}",
                   FAKETIME_DONT_FAKE_MONOTONIC="1", HOST_ID=a.host, RUNS=runs, MARKS=marks,
                   FAIL_SLOTS=" ".join(fail_slots))
        return env

    def run_fleet(self, fail_every=None, slots=None, own_store=False, plain=False):
        """Runs the fleet; returns (b0, attempts, runs lines, fail slot names). own_store (the
        negative control): every host on a sqlite file of its own, as if nothing were shared.
        plain (the other negative control): `leasehold run` without --once-per on the shared
        store, as the crontab lines before schedule slots were; the job is told the slot its
        host fired for in LEASEHOLD_SLOT (leasehold passes it through without --once-per)."""
        slots = SLOTS if slots is None else slots
        runs = self.path("runs.txt")
        marks = self.path("marks")
        os.makedirs(marks)
        now = time.time()
        # The first boundary: the earliest host fires at least 1 s from now.
        b0 = math.ceil((now + 1.0 + max(OFFSETS_MS) / 1000) / PERIOD) * PERIOD
        fail_slots = []
        if fail_every:
            fail_slots = [iso(b0 + i * PERIOD) for i in range(slots) if i % fail_every == 0]
        events = []  # (real time, seq, Attempt)
        for i in range(slots):
            for o in OFFSETS_MS:
                a = Attempt(i, o, 1, b0 + i * PERIOD - o / 1000)
                heapq.heappush(events, (a.planned, len(events), a))
        attempts, running = [], []
        seq = len(events)
        deadline = b0 + slots * PERIOD + 20
        while (events or running) and time.time() < deadline:
            t = time.time()
            while events and events[0][0] <= t:
                _, _, a = heapq.heappop(events)
                a.spawned = time.time()
                store = (["--store", "sqlite://" + self.path(f"own{a.offset_ms:+d}.db")]
                         if own_store else ["--store", self.store])
                env = self.host_env(a, runs, marks, fail_slots)
                slot_flags = ["--once-per", "2s"]
                if plain:
                    slot_flags = []
                    env["LEASEHOLD_SLOT"] = iso(b0 + a.slot * PERIOD)
                a.proc = self.start("run", *store, "--quiet", *slot_flags, "--holder",
                                    a.host, self.key, "--", "sh", "-c", JOB, store=False,
                                    env=env)
                attempts.append(a)
                running.append(a)
            for a in list(running):
                rc = a.proc.poll()
                if rc is None:
                    continue
                a.ended, a.rc = time.time(), rc
                running.remove(a)
                if fail_every and rc not in (0, EXIT_HELD, EXIT_DONE) and a.attempt == 1:
                    r = Attempt(a.slot, a.offset_ms, 2, a.ended + RETRY_AFTER)
                    heapq.heappush(events, (r.planned, seq, r))
                    seq += 1
            nxt = events[0][0] if events else t + 0.005
            time.sleep(max(0.0, min(0.005, nxt - time.time())))
        if events or running:
            self.fail(f"the fleet did not finish by {deadline - b0:.0f}s after the first "
                      f"boundary: {len(events)} not started, {len(running)} running\n"
                      + self.diagnostics())
        lines = []
        if os.path.exists(runs):
            with open(runs) as f:
                lines = [ln.split() for ln in f if ln.strip()]
        return b0, attempts, lines, fail_slots

    def named_slots(self, a, b0):
        """The slot indices attempt a could have named: the naming clock (the host's faked one,
        or the store's real one) anywhere between its start and its end, plus the tolerance."""
        skew = a.offset_ms / 1000 if STORE_CLOCK_IS_LOCAL.get(STORE, False) else 0.0
        lo = math.floor((a.spawned - 0.02 + skew + TOLERANCE - b0) / PERIOD)
        hi = math.floor((a.ended + 0.02 + skew + TOLERANCE - b0) / PERIOD)
        return range(lo, hi + 1)

    def check_fleet(self, b0, attempts, lines, fail_slots, slots=None):
        slots = SLOTS if slots is None else slots
        by_host = {a.host: a for a in attempts}
        problems = []
        # Exit codes, and the silence of --quiet for 75/80.
        allowed = {0, EXIT_HELD, EXIT_DONE} | ({JOB_FAIL} if fail_slots else set())
        for a in attempts:
            if a.rc not in allowed:
                problems.append(f"{a.host} exited {a.rc}: {self.stderr_of(a.proc).strip()}")
            elif a.rc in (EXIT_HELD, EXIT_DONE) and self.stderr_of(a.proc).strip():
                problems.append(f"{a.host} exited {a.rc} with --quiet but printed: "
                                f"{self.stderr_of(a.proc).strip()}")
        # The runs, by slot index.
        ok, failed = {}, {}
        for ln in lines:
            if len(ln) != 4 or ln[3] not in ("ok", "fail"):
                problems.append(f"garbled run line {ln}")
                continue
            slot, token, host, outcome = ln
            j = round((parse_iso(slot) - b0) / PERIOD)
            if abs(parse_iso(slot) - (b0 + j * PERIOD)) > 1e-6:
                problems.append(f"{host} ran slot {slot}, not on the 2s grid")
            (ok if outcome == "ok" else failed).setdefault(j, []).append((int(token), host, slot))
            a = by_host.get(host)
            if a is None:
                problems.append(f"run line from unknown host {ln}")
                continue
            want_rc = 0 if outcome == "ok" else JOB_FAIL
            if a.rc != want_rc:
                problems.append(f"{host} ran slot {slot} ({outcome}) but exited {a.rc}")
            if j not in self.named_slots(a, b0):
                problems.append(f"{host} (clock {a.offset_ms:+d} ms, started {a.lateness:+.3f}s "
                                f"late, ran {a.ended - a.spawned:.3f}s) ran slot {slot}, which "
                                f"it could not have named (slots {list(self.named_slots(a, b0))})")
        runs_of_zero = sum(1 for a in attempts if a.rc == 0)
        if runs_of_zero != sum(len(v) for v in ok.values()):
            problems.append(f"{runs_of_zero} exits 0 but {sum(len(v) for v in ok.values())} "
                            "successful run lines")
        # Exactly one success per slot; double runs always count.
        double = {j: v for j, v in ok.items() if len(v) > 1}
        for j, v in sorted(double.items()):
            problems.append(f"slot {j} ({iso(b0 + j * PERIOD)}) ran successfully {len(v)} times: "
                            + ", ".join(f"{h} token {t}" for t, h, _ in v))
        untested = []
        for i in range(slots):
            if i in ok:
                continue
            group = [a for a in attempts if a.slot == i]
            if any(a.lateness <= ON_TIME for a in group):
                problems.append(f"slot {i} ({iso(b0 + i * PERIOD)}) was missed; its hosts: "
                                + ", ".join(f"{a.host} rc={a.rc} late {a.lateness:+.3f}s"
                                            for a in group))
            else:
                untested.append(i)
        extra = sorted(j for j in ok if not 0 <= j < slots)
        # A success outside the 20 slots is legitimate only as the slot before the first, named
        # by the store's clock for a host that fired more than the tolerance early (checked by
        # named_slots above), or one after the last by a host that started very late.
        for j in extra:
            if j not in (-1, slots):
                problems.append(f"a run of slot {j}, outside the fleet's slots")
        # Fencing tokens rise slot after slot (every claim takes a new one).
        tokens = [t for j in sorted(ok) for t, _, _ in sorted(ok[j])]
        if tokens != sorted(set(tokens)):
            problems.append(f"fencing tokens of successive slots do not rise: {tokens}")
        if fail_slots:
            for name in fail_slots:
                j = round((parse_iso(name) - b0) / PERIOD)
                if j in untested:
                    continue
                f = failed.get(j, [])
                if len(f) != 1:
                    problems.append(f"failing slot {j} has {len(f)} failed runs, want 1: {f}")
                elif j in ok and len(ok[j]) == 1 and ok[j][0][0] <= f[0][0]:
                    problems.append(f"slot {j}: the success (token {ok[j][0][0]}) does not "
                                    f"come after the failure (token {f[0][0]})")
            for j, f in failed.items():
                if iso(b0 + j * PERIOD) not in fail_slots:
                    problems.append(f"slot {j} failed but was not meant to: {f}")
        self.report_figures(b0, attempts, ok, failed, untested, extra, slots)
        if len(untested) > MAX_UNTESTED:
            problems.append(f"{len(untested)} slots untested (every host started more than "
                            f"{ON_TIME}s late): the machine was too busy; slots {untested}")
        self.assertEqual(problems, [], "the fleet:\n  " + "\n  ".join(problems))
        return ok, failed

    def report_figures(self, b0, attempts, ok, failed, untested, extra, slots):
        first = [a for a in attempts if a.attempt == 1]
        late = [a.lateness for a in first]
        figure("host start lateness p50 (vs its clock's boundary)", pct(late, 0.5), ON_TIME)
        figure("host start lateness max", max(late), ON_TIME)
        spreads = []
        for i in range(slots):
            g = [a.spawned for a in first if a.slot == i]
            spreads.append(max(g) - min(g))
        figure("firing spread per slot (real time, max)", max(spreads),
               (max(OFFSETS_MS) - min(OFFSETS_MS)) / 1000 + ON_TIME)
        per_slot = [len(ok.get(i, [])) for i in range(slots) if i not in untested]
        count_figure("successful runs per slot (min..max)",
                     f"{min(per_slot, default=0)}..{max(per_slot, default=0)}", "1..1")
        count_figure("slots run twice", sum(1 for n in per_slot if n > 1), 0)
        count_figure("slots missed", sum(1 for n in per_slot if n == 0), 0)
        count_figure("slots untested (every host late)", len(untested), MAX_UNTESTED)
        count_figure(f"runs outside the {slots} slots (lead-in/tail)", len(extra), "<= 2")
        codes = {}
        for a in attempts:
            codes[a.rc] = codes.get(a.rc, 0) + 1
        count_figure("exit codes", " ".join(f"{k}:{v}" for k, v in sorted(codes.items())),
                     "only 0/3/75/80")
        winners = {}
        by_host = {a.host: a for a in attempts}
        for v in ok.values():
            for _, h, _ in v:
                o = by_host[h].offset_ms
                winners[o] = winners.get(o, 0) + 1
        count_figure("winner's clock offset (ms:slots)",
                     " ".join(f"{k:+d}:{v}" for k, v in sorted(winners.items())), "any")
        for rc, name in ((EXIT_DONE, "80 (slot done)"), (EXIT_HELD, "75 (running elsewhere)")):
            took = [a.ended - a.spawned for a in attempts if a.rc == rc]
            if took:
                figure(f"losers {name}: time to exit p50", pct(took, 0.5), 1.0)
                figure(f"losers {name}: time to exit max", max(took), 2.0)
        won = [a.ended - a.spawned for a in attempts if a.rc == 0]
        figure("winners: leasehold run wall time p50 (job 0.1s)", pct(won, 0.5), 1.0)
        if failed:
            reruns = []
            for j, f in failed.items():
                if j in ok:
                    fa, sa = by_host[f[0][1]], by_host[ok[j][0][1]]
                    reruns.append(sa.spawned - fa.ended)
            if reruns:
                figure("failed slot: from the failure to the rerun's start (max)", max(reruns),
                       PERIOD)

    def test_fleet_one_run_per_slot_with_skewed_clocks(self):
        self.need_faketime()
        t0 = time.monotonic()
        b0, attempts, lines, _ = self.run_fleet()
        self.check_fleet(b0, attempts, lines, [])
        figure("fleet test duration", time.monotonic() - t0, 45.0)

    def test_fleet_failed_run_is_run_again_once_by_another(self):
        self.need_faketime()
        t0 = time.monotonic()
        b0, attempts, lines, fail_slots = self.run_fleet(fail_every=3)
        ok, failed = self.check_fleet(b0, attempts, lines, fail_slots)
        # Who ran a failed slot again: another host, or the one that failed, on its retry.
        by_host = {a.host: a for a in attempts}
        other = same = 0
        for j, f in failed.items():
            if j in ok:
                fa, sa = by_host[f[0][1]], by_host[ok[j][0][1]]
                if fa.offset_ms == sa.offset_ms:
                    same += 1
                else:
                    other += 1
        count_figure("failed slots run again by another host / by the failed host's retry",
                     f"{other} / {same}", f"{len(fail_slots)} in all")
        # status --json: the newest 8 runs (the record's depth), each matching a run line.
        s = self.status_json()
        runs = s.get("slot_runs")
        self.assertIsInstance(runs, list, s)
        self.assertGreater(len(runs), 0, s)
        known = {(ln[0], int(ln[1]), ln[2]): ln[3] for ln in lines}
        seen_failed = 0
        for r in runs:
            k = (r["slot"], r["fencing_token"], r["holder"])
            self.assertIn(k, known, f"slot_runs entry {r} is not a run of the fleet")
            if known[k] == "ok":
                self.assertEqual((r["outcome"], r["exit_code"]), ("done", 0), r)
            else:
                # README: outcome is done, failed or failed_retryable (status's text line says
                # "failed (retry allowed)").
                self.assertEqual((r["outcome"], r["exit_code"]),
                                 ("failed_retryable", JOB_FAIL), r)
                seen_failed += 1
                done = [x for x in runs if x["slot"] == r["slot"] and x["outcome"] == "done"]
                self.assertEqual(len(done), 1, f"failed slot {r['slot']} in slot_runs: {runs}")
            for field in ("started", "ended"):
                self.assertRegex(r[field], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", r)
        text = self.cli("status", self.key)
        self.assertEqual(text.returncode, 1, text.stderr)  # free: the runs ended
        self.assertEqual(text.stdout.count("failed (retry allowed)"), seen_failed, text.stdout)
        self.assertEqual(text.stdout.count(" done by "), len(runs) - seen_failed, text.stdout)
        last = max(ok)
        self.assertEqual(runs[0]["slot"], iso(b0 + last * PERIOD), f"newest first: {runs}")
        self.assertGreater(seen_failed, 0, f"no failed run among the newest: {runs}")
        count_figure("slot_runs entries in status --json (failed ones)",
                     f"{len(runs)} ({seen_failed})", 8)
        figure("fleet test duration", time.monotonic() - t0, 45.0)

    def test_negative_control_unshared_stores_are_caught_as_double_runs(self):
        # The checker must see double runs: 3 slots with every host on a store of its own.
        if STORE != "sqlite":
            self.skipTest("store-independent: run with --store sqlite")
        self.need_faketime()
        b0, attempts, lines, _ = self.run_fleet(slots=3, own_store=True)
        with self.assertRaises(AssertionError) as caught:
            self.check_fleet(b0, attempts, lines, [], slots=3)
        self.assertIn(f"ran successfully {len(OFFSETS_MS)} times", str(caught.exception))
        caught_lines = [ln.strip() for ln in str(caught.exception).splitlines()
                        if "ran successfully" in ln]
        print(f"\n  slots_test: negative control caught: {caught_lines[-1]}", file=sys.stderr,
              flush=True)

    def test_negative_control_without_once_per_every_host_runs_the_slot(self):
        # What a crontab line on every host did before schedule slots: a lease alone. The
        # 100 ms job is over long before the later hosts fire, so each of them takes the free
        # lease and runs the slot again. The checker must see it, on every store.
        self.need_faketime()
        b0, attempts, lines, _ = self.run_fleet(slots=3, plain=True)
        with self.assertRaises(AssertionError) as caught:
            self.check_fleet(b0, attempts, lines, [], slots=3)
        self.assertIn("ran successfully", str(caught.exception))
        per_slot = collections.Counter(ln[0] for ln in lines if ln[-1] == "ok")
        count_figure("without --once-per: successful runs per slot (min..max)",
                     f"{min(per_slot.values())}..{max(per_slot.values())}", f"> 1")

    # --- --hold-at-least -----------------------------------------------------------------------

    def test_hold_at_least_outlives_the_command_and_leasehold(self):
        t0 = time.time()
        first = self.cli("run", "--hold-at-least", "5s", "--holder", "first", self.key, "--",
                         "sleep", "1")
        t_first = time.time() - t0
        self.assertEqual(first.returncode, 0, first.stderr)
        time.sleep(max(0.0, t0 + 2 - time.time()))
        second = self.cli("run", "--holder", "second", self.key, "--", "true")
        self.assertEqual(second.returncode, EXIT_HELD,
                         f"2 s after taking it with --hold-at-least 5s: {second.stderr}")
        self.assertIn("first", second.stderr)
        self.assertIn("released, kept for", second.stderr)
        s = self.status_json()
        self.assertTrue(s["held"], s)
        # Shown kept: the holder released it, nothing runs under it (issue 35, point 9).
        self.assertTrue(s["kept"], s)
        self.assertIn("kept_until", s)
        r = self.cli("status", self.key)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("state:         kept until ", r.stdout)
        # Poll until it is free: never before 5 s after the first run started.
        freed = None
        for _ in range(400):
            if time.time() > t0 + 8:
                break
            s = self.status_json()
            if not s["held"]:
                freed = time.time() - t0
                break
            time.sleep(0.05)
        self.assertIsNotNone(freed, "still held 8 s after a --hold-at-least 5s grant")
        self.assertGreaterEqual(freed, 5.0 - 0.05, f"free at {freed:.3f}s, before 5 s")
        time.sleep(max(0.0, t0 + 6 - time.time()))
        # --wait 2s: a store may keep the grant to its own granularity (etcd: whole seconds).
        t = time.time()
        third = self.cli("run", "--wait", "2s", "--holder", "third", self.key, "--", "true")
        self.assertEqual(third.returncode, 0, f"6 s after: {third.stderr}")
        figure("hold-at-least 5s: the run at 6 s waited", time.time() - t, 2.0)
        figure("hold-at-least 5s, job 1s: first run's wall time", t_first, 2.0)
        figure("hold-at-least 5s: free after (from the first run's start)", freed, 6.0)

    # --- bad input -----------------------------------------------------------------------------

    def test_bad_slot_arguments_are_one_line_and_exit_64(self):
        cases = [
            (["--once-per", "0"], "0"),
            (["--once-per", "500ms"], "500ms"),
            (["--once-per", "400d"], "400d"),
            (["--once-per", "1h", "--slot-tolerance", "30m"], "tolerance"),
            (["--once-per", "1d", "--slot-zone", "Mars/Olympus"], "Mars/Olympus"),
            (["--once-per", "1h", "--keep-history", "400d"], "400d"),
            (["--keep-history", "1h"], "--once-per"),
        ]
        for args, word in cases:
            with self.subTest(args=args):
                r = self.cli("run", *args, self.key, "--", "touch", "ran")
                self.assert_one_error_line(r, EXIT_USAGE)
                self.assertIn(word, r.stderr)
                self.assertFalse(os.path.exists(self.path("ran")), "the command ran")

    # --- --keep-history ------------------------------------------------------------------------

    def test_keep_history_keeps_the_runs_past_two_periods(self):
        # 2 s slots: by default the record lives two periods and the tolerance (4.5 s) after the
        # run (etcd: rounded up to whole seconds). With --keep-history 1h it is still there at 7 s.
        r = self.cli("run", "--once-per", "2s", "--keep-history", "1h", "--holder", "kept",
                     self.key, "--", "true")
        self.assertEqual(r.returncode, 0, r.stderr)
        t = time.monotonic()
        self.assertEqual(len(self.status_json()["slot_runs"]), 1)
        time.sleep(max(0.0, t + 7 - time.monotonic()))
        runs = self.status_json()["slot_runs"]
        self.assertEqual([(x["holder"], x["outcome"]) for x in runs], [("kept", "done")], runs)

    # --- a done slot ---------------------------------------------------------------------------

    def test_done_slot_is_refused_with_80_quietly_and_status_shows_the_run(self):
        # --once-per 1h with the offset that puts now in the middle of a slot, so the two runs
        # cannot straddle a boundary.
        now = time.time()
        offset = int(now - 1800) % 3600
        start = now - ((now - offset) % 3600)
        slot = iso(math.floor(start))
        flags = ["--once-per", "1h", "--slot-offset", f"{offset}s"]
        r = self.cli("run", "--quiet", *flags, "--holder", "one", self.key, "--", "sh", "-c",
                     'echo "$LEASEHOLD_SLOT $LEASEHOLD_KEY $LEASEHOLD_FENCING_TOKEN" > ran')
        self.assertEqual(r.returncode, 0, r.stderr)
        got_slot, got_key, token = self.wait_for_file("ran").split()
        self.assertEqual((got_slot, got_key), (slot, self.key))
        t = time.monotonic()
        again = self.cli("run", "--quiet", *flags, "--holder", "two", self.key, "--",
                         "touch", "ran2")
        figure("done slot: the refused run's wall time", time.monotonic() - t, 1.0)
        self.assertEqual(again.returncode, EXIT_DONE, again.stderr)
        self.assertEqual((again.stdout, again.stderr), ("", ""), "--quiet must print nothing")
        self.assertFalse(os.path.exists(self.path("ran2")))
        loud = self.cli("run", *flags, self.key, "--", "touch", "ran2")
        self.assertEqual(loud.returncode, EXIT_DONE, loud.stderr)
        self.assertIn(slot, loud.stderr)
        self.assertFalse(os.path.exists(self.path("ran2")))
        text = self.cli("status", self.key)
        self.assertEqual(text.returncode, 1, text.stderr)  # free: the runs ended
        lines = [ln for ln in text.stdout.splitlines() if ln.startswith("slot runs:")]
        self.assertEqual(len(lines), 1, text.stdout)
        self.assertIn(slot, lines[0])
        self.assertIn("done", lines[0])
        self.assertIn(f"fencing token {token}", lines[0])
        s = self.status_json()
        self.assertEqual(len(s["slot_runs"]), 1, s)
        run = s["slot_runs"][0]
        self.assertEqual((run["slot"], run["outcome"], run["exit_code"], run["holder"],
                          run["fencing_token"]), (slot, "done", 0, "one", int(token)), run)
        self.assertLessEqual(run["started"], run["ended"])


def setUpModule():
    global SERVER, SERVER_URL
    if STORE == "sqlite":
        return
    run_dir = tempfile.mkdtemp(prefix="leasehold-slots-server-")
    store = chaos.STORES[STORE]()
    t = time.monotonic()
    try:
        store.start(run_dir)
    except SystemExit as e:  # chaos's starters exit with a message
        raise AssertionError(f"{STORE} server did not start: {e}") from None
    # Straight to the server: no fault proxy in between.
    SERVER_URL = store.url().replace(f":{store.proxy.port}", f":{store.port}")
    store.proxy.close()
    store.run_dir_ = run_dir
    SERVER = store
    figure(f"{STORE} server start", time.monotonic() - t, 60.0)
    print(f"  slots_test: store {SERVER_URL}", file=sys.stderr, flush=True)


def tearDownModule():
    if SERVER is not None:
        SERVER.stop()
        shutil.rmtree(SERVER.run_dir_, ignore_errors=True)


def main():
    global STORE, REQUIRE_FAKETIME, SLOTS
    parser = cli_harness.arg_parser()
    parser.add_argument("--store", default="sqlite", choices=sorted(chaos.STORES),
                        help="the store to test on (servers are started here, throwaway)")
    parser.add_argument("--slots", type=int, default=SLOTS,
                        help="consecutive slots per fleet test (default %(default)s)")
    parser.add_argument("--require-faketime", action="store_true",
                        help="fail, not skip, the fleet tests without libfaketime (CTest)")
    args, rest = parser.parse_known_args()
    cli_harness.use_leasehold(args.leasehold, "slots_test")
    STORE = args.store
    REQUIRE_FAKETIME = args.require_faketime
    SLOTS = args.slots
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
