#!/usr/bin/env python3
# File: tests/cli/cgroup_test.py
#
# A holder under a CPU quota (the CFS bandwidth controller a container's CPU limit sets):
#
#   python3 tests/cli/cgroup_test.py --leasehold build/tools/cli/leasehold [--seconds 120]
#
# `leasehold run --ttl 1s` and its job (a busy loop) run in a cgroup of their own with a quota of
# 10 ms per 100 ms (cgroup v2 cpu.max "10000 100000", or v1 cpu.cfs_quota_us/cfs_period_us on
# a hybrid host): every period the job spends the quota and the holder's heartbeat is stopped
# for up to 90 ms with it. For --seconds (CI: 8; by hand: 120) a contender outside the cgroup
# asks for the key every 200 ms: each ask is refused (exit 75: the holder never lost the key),
# and the holder's run ends 0 (no loss). The holder's /metrics shows the throttling
# (leasehold_cgroup_cpu_throttled_periods_total > 0, leasehold_cgroup_cpu_limit_cores 0.1).
# `leasehold check` in the cgroup names the quota (area cpu): a warning for --ttl 500ms (a stop
# of 90 ms is more than a tenth of it), a pass for --ttl 1s; outside it, no quota. `leasehold
# run` judges the same at its grant: one cpu_quota warning for --ttl 500ms, none for 1s (the
# run's own outcome is not judged there: a 500 ms lease may be lost under this quota).
#
# Needs root and a writable CPU controller; skipped otherwise, saying why.

import json
import os
import re
import subprocess
import sys
import time
import unittest
import urllib.request

import cli_harness
from cli_harness import CliHarness, free_port

EXIT_HELD = 75
SECONDS = 8
KEY = "cgroup-key"


def make_cgroup(name):
    """Creates a cgroup with a quota of 10 ms per 100 ms; returns (its cgroup.procs, a cleanup)
    or (None, why)."""
    v2 = "/sys/fs/cgroup"
    try:
        with open(os.path.join(v2, "cgroup.controllers")) as f:
            has_cpu = "cpu" in f.read().split()
    except OSError:
        has_cpu = False
    try:
        if has_cpu:
            with open(os.path.join(v2, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu")
            d = os.path.join(v2, name)
            os.mkdir(d)
            with open(os.path.join(d, "cpu.max"), "w") as f:
                f.write("10000 100000")
        else:
            d = os.path.join("/sys/fs/cgroup/cpu", name)
            os.mkdir(d)
            with open(os.path.join(d, "cpu.cfs_period_us"), "w") as f:
                f.write("100000")
            with open(os.path.join(d, "cpu.cfs_quota_us"), "w") as f:
                f.write("10000")
    except OSError as e:
        return None, f"no writable CPU controller: {e}"
    return os.path.join(d, "cgroup.procs"), lambda: remove_cgroup(d)


def remove_cgroup(d):
    """Kills what is left in the cgroup, then removes it (rmdir is refused while a process,
    even a dying one, is in it)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            os.rmdir(d)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
        with open(os.path.join(d, "cgroup.procs")) as f:
            for pid in f.read().split():
                try:
                    os.kill(int(pid), 9)
                except OSError:
                    pass
        time.sleep(0.05)


def metric(text, name):
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


class CpuQuotaTest(CliHarness, unittest.TestCase):
    TMP_PREFIX = "leasehold-cgroup-"

    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("needs root")
        procs, cleanup = make_cgroup(f"leasehold-test-{os.getpid()}")
        if procs is None:
            self.skipTest(cleanup)
        self.cgroup_procs = procs
        self.addCleanup(cleanup)
        super().setUp()

    def test_a_throttled_holder_keeps_its_key_and_reports_the_throttling(self):
        port = free_port()
        busy = f"timeout {SECONDS + 1} sh -c 'while :; do :; done'; true"
        holder = subprocess.Popen(
            ["sh", "-c", f'echo $$ > {self.cgroup_procs} && exec "$@"', "sh"] + self.argv(
                # --wait: a probe below may take the key first while the holder starts.
                ["run", "--ttl", "1s", "--wait", "60s", "--metrics-addr", f"127.0.0.1:{port}",
                 KEY, "--", "sh", "-c", busy], True),
            env=self.env, cwd=self.tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)
        try:
            def held():
                return self.cli("run", KEY, "--", "true").returncode == EXIT_HELD
            # The holder starts under the quota (a tenth of a CPU, less on a busy machine):
            # its start may take seconds.
            self.wait_until("the holder's grant", held, timeout=60)
            asks, refused, metrics = 0, 0, ""
            end = time.monotonic() + SECONDS
            while time.monotonic() < end and holder.poll() is None:
                asks += 1
                r = self.cli("run", KEY, "--", "true")
                refused += r.returncode == EXIT_HELD
                if asks % 10 == 5:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                    timeout=5) as resp:
                            metrics = resp.read().decode()
                    except OSError:
                        pass
                time.sleep(0.2)
            rc = holder.wait(timeout=SECONDS + 30)
        finally:
            if holder.poll() is None:
                os.killpg(holder.pid, 9)
            _, err = holder.communicate(timeout=20)
        throttled = metric(metrics, "leasehold_cgroup_cpu_throttled_periods_total")
        seconds = metric(metrics, "leasehold_cgroup_cpu_throttled_seconds_total")
        periods = metric(metrics, "leasehold_cgroup_cpu_periods_total")
        print(f"\n  [figure] cpu quota 10ms/100ms ttl=1s: asks={asks} refused={refused} "
              f"holder_exit={rc} periods={periods} throttled_periods={throttled} "
              f"throttled_seconds={seconds} renewed_late="
              f"{err.decode().count('renewed_late')} at_risk={err.decode().count('at_risk')}",
              file=sys.stderr)
        self.assertEqual(rc, 0, f"the holder lost its key: {err.decode()[-2000:]}")
        self.assertEqual(refused, asks, "the contender got the key while it was held")
        self.assertIsNotNone(throttled, f"no throttling metrics in:\n{metrics}")
        self.assertGreater(throttled, 0)
        self.assertEqual(metric(metrics, "leasehold_cgroup_cpu_limit_cores"), 0.1)

    def check_items(self, ttl, inside):
        prefix = ["sh", "-c", f'echo $$ > {self.cgroup_procs} && exec "$@"', "sh"] if inside \
            else []
        r = subprocess.run(prefix + self.argv(["check", "--json", "--ttl", ttl], True),
                           env=self.env, cwd=self.tmp, capture_output=True, text=True,
                           timeout=60)
        doc = json.loads(r.stdout)
        return [i for i in doc["items"] if i["area"] == "cpu"]

    def test_check_judges_the_quota_against_the_ttl(self):
        items = self.check_items("500ms", True)
        self.assertEqual(len(items), 1, items)
        self.assertEqual(items[0]["verdict"], "warn", items)
        self.assertIn("10ms per 100ms", items[0]["found"])
        self.assertIn("up to 90ms", items[0]["found"])
        self.assertIn("--ttl 900ms", items[0]["fix"])
        self.assertIn("at least 50ms per 100ms", items[0]["fix"])
        items = self.check_items("1s", True)
        self.assertEqual([i["verdict"] for i in items], ["pass"], items)
        for item in self.check_items("500ms", False):
            self.assertNotIn("10ms per 100ms", item["found"])

    def test_run_warns_once_of_a_quota_that_endangers_its_ttl(self):
        def run_inside(ttl):
            return subprocess.run(
                ["sh", "-c", f'echo $$ > {self.cgroup_procs} && exec "$@"', "sh"] +
                self.argv(["run", "--ttl", ttl, "cgroup-run", "--", "true"], True),
                env=self.env, cwd=self.tmp, capture_output=True, text=True, timeout=60)
        # Only the warning is judged: the 500 ms lease may well be lost under this quota (exit
        # 79: what the warning says), and the 1 s one on a busy machine.
        short = run_inside("500ms")
        self.assertIn(short.returncode, (0, 79), short.stderr)
        warnings = [l for l in short.stderr.splitlines() if "cpu_quota" in l]
        self.assertEqual(len(warnings), 1, short.stderr)
        self.assertIn("stall_seconds=0.09", warnings[0])
        self.assertIn("10ms per 100ms", warnings[0])
        self.assertIn("the TTL to 900ms or more", warnings[0])
        long = run_inside("1s")
        self.assertIn(long.returncode, (0, 79), long.stderr)
        self.assertNotIn("cpu_quota", long.stderr)


if __name__ == "__main__":
    parser = cli_harness.arg_parser()
    parser.add_argument("--seconds", type=int, default=SECONDS)
    args, rest = parser.parse_known_args()
    cli_harness.use_leasehold(args.leasehold, parser.prog)
    SECONDS = args.seconds
    unittest.main(argv=[sys.argv[0]] + rest)
