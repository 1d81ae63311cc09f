#!/usr/bin/env python3
# File: tests/cli/timens_test.py
#
# One SQLite file shared by processes in different time namespaces (time_namespaces(7): CRIU
# restores, `unshare --time`, OCI timeOffsets shift CLOCK_BOOTTIME and CLOCK_MONOTONIC per
# process). The sqlite store records grants on the host's CLOCK_BOOTTIME (the process's minus
# its namespace's offset), so a process whose clocks run an hour ahead must not find a held
# grant expired, and one an hour behind must not find an expired grant live:
#
#   python3 tests/cli/timens_test.py --leasehold build/tools/cli/leasehold [--handoffs 200]
#
# - A holder in each of the namespaces -3600 s, 0 and +3600 s (`unshare --time --boottime OFF
#   --monotonic OFF`; -3600 s becomes less when the host has been up for less than an hour, as
#   the kernel refuses a clock before boot): a `run` from each other namespace is refused (exit
#   75), `status --json` there shows it held, and so does a `run` after the holder's TTL (its
#   renewals counted); once the holder is gone, the key is free at once in every namespace.
# - --handoffs N (CI: 40; by hand: 200) runs of `leasehold run --wait` on one key by three
#   workers, one per namespace: each job appends "start T" / "end T" (CLOCK_REALTIME, which time
#   namespaces do not shift: one clock for all) around a hold of 20 ms, every 10th of 1.3 s past
#   its TTL of 1 s (renewed). The check: no two jobs overlap, every run exits 0 (no lease lost).
#
# Needs root (or CAP_SYS_ADMIN) and a kernel with CONFIG_TIME_NS: without them the test is
# skipped, saying why.

import os
import subprocess
import sys
import threading
import time
import unittest

import cli_harness
from cli_harness import CliHarness

EXIT_HELD = 75
HANDOFFS = 40
KEY = "timens-key"


def namespace_offsets():
    """The three namespaces' CLOCK_BOOTTIME/MONOTONIC offsets in seconds: -3600 (or what the
    host's uptime allows, less a minute), 0 and +3600."""
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    behind = min(3600, int(uptime) - 60)
    return (-behind, 0, 3600)


def in_namespace(offset, argv):
    return ["unshare", "--time", "--boottime", str(offset), "--monotonic", str(offset)] + argv


def time_namespaces_work():
    """None if `unshare --time` runs here, else why not."""
    try:
        r = subprocess.run(in_namespace(60, ["cat", "/proc/self/timens_offsets"]),
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if r.returncode != 0:
        return r.stderr.strip()
    return None


class TimeNamespaceTest(CliHarness, unittest.TestCase):
    TMP_PREFIX = "leasehold-timens-"

    def setUp(self):
        why = time_namespaces_work()
        if why:
            self.skipTest(f"time namespaces unavailable: {why}")
        super().setUp()
        self.offsets = namespace_offsets()

    def run_in(self, offset, *args, timeout=30):
        return subprocess.run(in_namespace(offset, self.argv(args, True)), env=self.env,
                              cwd=self.tmp, capture_output=True, text=True, timeout=timeout)

    def test_a_held_key_is_held_in_every_namespace_and_free_in_all_once_released(self):
        for holder_offset in self.offsets:
            with self.subTest(holder=holder_offset):
                marker = self.path(f"holding-{holder_offset}")
                holder = subprocess.Popen(
                    in_namespace(holder_offset, self.argv(
                        ["run", "--ttl", "1s", KEY, "--", "sh", "-c",
                         f"touch {marker}; exec sleep 60"], True)),
                    env=self.env, cwd=self.tmp, stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE, start_new_session=True)
                try:
                    self.wait_until("the holder's job started", lambda: os.path.exists(marker))
                    for other in self.offsets:
                        if other == holder_offset:
                            continue
                        r = self.run_in(other, "run", KEY, "--", "true")
                        self.assertEqual(r.returncode, EXIT_HELD,
                                         f"from {other} s while held from {holder_offset} s: "
                                         f"{r.stderr}")
                        s = self.run_in(other, "status", KEY, "--json")
                        self.assertEqual(s.returncode, 0, s.stderr)
                        self.assertIn('"held": true', s.stdout.replace('":true', '": true'),
                                      s.stdout)
                    # Held past its TTL: the renewals work across the shift too. Tried from
                    # the far side (-3600 s is not always possible: namespace_offsets).
                    time.sleep(1.5)
                    far = self.offsets[0] if holder_offset > 0 else self.offsets[2]
                    r = self.run_in(far, "run", KEY, "--", "true")
                    self.assertEqual(r.returncode, EXIT_HELD, r.stderr)
                finally:
                    os.killpg(holder.pid, 15)
                    _, err = holder.communicate(timeout=20)
                # A released key is free at once, from every namespace.
                for other in self.offsets:
                    r = self.run_in(other, "run", KEY, "--", "true")
                    self.assertEqual(r.returncode, 0, f"from {other} s: {r.stderr}")
                os.unlink(marker)

    def test_handoffs_between_namespaces_never_overlap_and_lose_nothing(self):
        log = self.path("runs.log")
        job_short = f'echo "start $(date +%s%N)" >> {log}; sleep 0.02; echo "end $(date +%s%N)" >> {log}'
        job_long = job_short.replace("sleep 0.02", "sleep 1.3")
        runs = []  # (offset, exit code, stderr)
        lock = threading.Lock()
        started = [0]
        deadline = time.monotonic() + 30 + HANDOFFS * 0.5

        def worker(offset):
            while time.monotonic() < deadline:
                with lock:
                    if started[0] >= HANDOFFS:
                        return
                    started[0] += 1
                    n = started[0]
                job = job_long if n % 10 == 0 else job_short
                r = self.run_in(offset, "run", "--wait", "30s", "--ttl", "1s", KEY, "--", "sh",
                                "-c", job, timeout=60)
                with lock:
                    runs.append((offset, r.returncode, r.stderr))

        threads = [threading.Thread(target=worker, args=(o,)) for o in self.offsets]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        failed = [r for r in runs if r[1] != 0]
        self.assertEqual(failed, [], "runs that did not exit 0 (a lost lease, or no grant)")
        self.assertEqual(len(runs), HANDOFFS, "the workers ran out of time")
        intervals = []
        with open(log) as f:
            starts = []
            for line in f:
                kind, t = line.split()
                if kind == "start":
                    starts.append(int(t))
                else:
                    intervals.append((starts.pop(), int(t)))
        self.assertEqual(starts, [], "a job started and never ended")
        self.assertEqual(len(intervals), HANDOFFS)
        intervals.sort()
        overlaps = [(a, b) for a, b in zip(intervals, intervals[1:]) if b[0] < a[1]]
        per_ns = {o: sum(1 for r in runs if r[0] == o) for o in self.offsets}
        print(f"\n  [figure] timens handoffs={len(intervals)} overlaps={len(overlaps)} "
              f"lost=0 per_namespace={per_ns} elapsed={elapsed:.1f}s", file=sys.stderr)
        self.assertEqual(overlaps, [], "two jobs ran at once")
        self.assertTrue(all(per_ns.values()), f"a namespace never got the key: {per_ns}")


if __name__ == "__main__":
    parser = cli_harness.arg_parser()
    parser.add_argument("--handoffs", type=int, default=HANDOFFS)
    args, rest = parser.parse_known_args()
    cli_harness.use_leasehold(args.leasehold, parser.prog)
    HANDOFFS = args.handoffs
    unittest.main(argv=[sys.argv[0]] + rest)
