#!/usr/bin/env python3
# File: tests/cli/exitcode_test.py
#
# Exit codes that compose (issue 35, point 2): `run`/`elect --exit-code OUTCOME=N` moves one of
# leasehold's own codes and never the command's. Under a cron-style line (`--exit-code held=0`,
# no `|| [ $? -eq 75 ]` wrapper) and a systemd-style SuccessExitStatus= set of moved codes, a
# job that itself exits 75 or 80 is reported as the failure it is, while "another host holds
# it" and "this slot is done" are successes; leasehold's other outcomes (not found, lost) move
# too; a bad spec is one line and 64. And the escalation of a second SIGINT/SIGTERM (issue 35,
# point 10): the first goes to the command's process group, the second kills its whole tree.
#
#   python3 tests/cli/exitcode_test.py --leasehold build/tools/cli/leasehold [-v]

import os
import signal
import subprocess
import time
import unittest

import cli_harness
from cli_harness import CliHarness

EXIT_USAGE = 64


class ExitCodeTest(CliHarness, unittest.TestCase):
    TMP_PREFIX = "leasehold-exitcode-"

    def line(self, *flags, job="true", key="job"):
        """A crontab-style line, run by sh as cron runs it: its exit status."""
        cmd = " ".join([cli_harness.LEASEHOLD, "run", "--quiet", "--store", self.store,
                        *flags, key, "--", "sh", "-c", f"'echo ran >> ran; {job}'"])
        r = self.shell(cmd)
        return r.returncode, r.stderr

    def shell(self, cmd):
        return subprocess.run(["sh", "-c", cmd], env=self.env, cwd=self.tmp, capture_output=True,
                              text=True, timeout=30)

    def runs(self):
        try:
            with open(self.path("ran")) as f:
                return len(f.read().splitlines())
        except FileNotFoundError:
            return 0

    def hold(self, key):
        p = self.start("run", "--ttl", "10s", key, "--", "sleep", "30")
        self.wait_until("held", lambda: self.status_json(key)["held"])
        return p

    def test_cron_style_line_never_mistakes_a_jobs_75_for_held_elsewhere(self):
        flags = ["--wait", "0", "--exit-code", "held=0"]
        self.assertEqual(self.line(*flags)[0], 0)
        self.assertEqual(self.line(*flags, job="exit 75")[0], 75, "the job's own 75 fails")
        self.assertEqual(self.line(*flags, job="exit 80")[0], 80, "the job's own 80 fails")
        self.assertEqual(self.line(*flags, job="exit 3")[0], 3)
        self.assertEqual(self.runs(), 4)
        holder = self.hold("job")
        rc, err = self.line(*flags)
        self.assertEqual(rc, 0, "another host holds it: a success " + err)
        self.assertEqual(self.runs(), 4, "and the job did not run")
        holder.terminate()  # run forwards it, the child ends, the lease is released
        holder.wait()

    def test_once_per_line_moves_held_and_done_but_not_the_jobs_codes(self):
        flags = ["--once-per", "1h", "--exit-code", "held=0", "--exit-code", "done=0"]
        self.assertEqual(self.line(*flags, job="exit 80")[0], 80, "the job's 80 is a failure")
        self.assertEqual(self.line(*flags)[0], 0, "the failed run left the slot open")
        self.assertEqual(self.runs(), 2)
        self.assertEqual(self.line(*flags)[0], 0, "the slot is done: moved to 0")
        self.assertEqual(self.runs(), 2, "and nothing ran")
        self.assertEqual(self.line("--once-per", "1h")[0], 80, "unmoved, done is still 80")

    def test_systemd_style_success_set_of_moved_codes(self):
        # SuccessExitStatus=200 201 with held and done moved there: a unit succeeds exactly when
        # the code is 0 or in that set.
        success = {0, 200, 201}
        flags = ["--wait", "0", "--exit-code", "held=200", "--exit-code", "done=201"]
        holder = self.hold("svc")
        rc, _ = self.line(*flags, key="svc")
        self.assertEqual(rc, 200)
        holder.terminate()  # run forwards it, the child ends, the lease is released
        holder.wait()
        for job, code in (("exit 75", 75), ("exit 80", 80), ("true", 0)):
            with self.subTest(job=job):
                rc, _ = self.line(*flags, job=job, key="svc")
                self.assertEqual(rc, code)
                self.assertEqual(rc in success, code == 0)

    def test_leaseholds_other_outcomes_move_too(self):
        r = self.cli("run", "--exit-code", "not-found=200", "job", "--", "no-such-command-xyz")
        self.assertEqual(r.returncode, 200, r.stderr)
        p = self.start("run", "--ttl", "2s", "--exit-code", "lost=201", "lost", "--", "sleep",
                       "30")
        self.wait_until("held", lambda: self.status_json("lost")["held"])
        r = self.cli("release", "--force", "lost")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.wait_exit(p, 30), 201, self.stderr_of(p))
        r = self.cli("elect", "--wait", "0", "--exit-code", "not-found=202", "e", "--",
                     "no-such-command-xyz")
        self.assertEqual(r.returncode, 202, r.stderr)

    def test_a_bad_spec_is_one_line_and_64(self):
        for spec in ("held", "held=", "held=256", "held=-1", "held=7x", "nosuch=3", "=3"):
            with self.subTest(spec=spec):
                r = self.cli("run", "--exit-code", spec, "job", "--", "touch", "ran")
                self.assert_one_error_line(r, EXIT_USAGE)
                self.assertIn("OUTCOME=N", r.stderr)
        self.assertEqual(self.runs(), 0)

    def test_a_second_sigterm_kills_the_whole_tree_at_once(self):
        # The command and its background child ignore SIGTERM (an ignored signal is inherited).
        p = self.start("run", "--ttl", "5s", "esc", "--", "sh", "-c",
                       "trap '' TERM; (while :; do sleep 0.05; done) & echo $$ > cmd.pid; "
                       "while :; do sleep 0.05; done")
        pid = int(self.wait_for_file("cmd.pid"))
        os.kill(p.pid, signal.SIGTERM)
        time.sleep(0.5)
        self.assertIsNone(p.poll(), "the first SIGTERM went to the command, which ignores it")
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGTERM)
        rc = self.wait_exit(p, 10)
        took = time.monotonic() - t0
        cli_harness.figure("second SIGTERM to the end of leasehold run", took, 2.0)
        self.assertEqual(rc, 128 + signal.SIGKILL, self.stderr_of(p))
        self.assertLess(took, 2.0, "not the kill grace: at once")
        self.assertIn("SIGTERM again: SIGKILL to the command's whole tree", self.stderr_of(p))
        self.assertTrue(cli_harness.process_gone(pid))
        self.assertFalse(self.status_json("esc")["held"])


if __name__ == "__main__":
    cli_harness.main("exitcode_test")
