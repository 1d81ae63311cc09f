#!/usr/bin/env python3
# File: tests/cli/silence_test.py
#
# Silent on success, one rule on conflict (issue 35, point 4): by default a run that takes its
# lease, runs its command and releases prints nothing (cron mails whatever a job prints); -v
# prints the lifecycle; another holder (75) and a slot already done (80) print one line by
# default and nothing with -q, in every mode; errors print always. JSON lines are structured:
# level info and an event name for the normal outcomes, millisecond timestamps.
#
#   python3 tests/cli/silence_test.py --leasehold build/tools/cli/leasehold [-v]

import json
import re
import signal
import unittest

import cli_harness
from cli_harness import CliHarness

EXIT_USAGE = 64
EXIT_HELD = 75
EXIT_DONE = 80


class SilenceTest(CliHarness, unittest.TestCase):
    TMP_PREFIX = "leasehold-silence-"
    key = "job:quiet"

    def hold(self, key=None):
        """A run holding `key` until the test ends."""
        p = self.start("run", "--ttl", "10s", "--holder", "other-host", key or self.key, "--",
                       "sleep", "60")
        self.wait_until("held", lambda: self.status_json(key or self.key)["held"])
        return p

    def test_a_run_that_succeeds_prints_nothing(self):
        for args in (["run", self.key, "--", "true"],
                     ["run", "--once-per", "1h", "job:slot", "--", "true"],
                     ["run", "--limit", "2", "job:pool", "--", "true"],
                     ["elect", "svc", "--", "true"]):
            r = self.cli(*args, verbose=False)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stderr, "", f"{args}: a success prints nothing on stderr")

    def test_verbose_prints_the_lifecycle(self):
        r = self.cli("run", self.key, "--", "true")  # the harness gives -v
        self.assertEqual(r.returncode, 0, r.stderr)
        for line in ("acquired key=" + self.key, "store sqlite://", "containment: ",
                     "started the command", "the command exited with code 0",
                     "released key=" + self.key):
            self.assertIn(line, r.stderr)

    def test_another_holder_is_one_line_by_default_and_none_with_quiet_in_every_mode(self):
        self.hold()
        r = self.cli("run", self.key, "--", "true", verbose=False)
        self.assertEqual(r.returncode, EXIT_HELD, r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertIn(f"{self.key} is held by another: held by other-host", r.stderr)
        for args in (["run", "-q", self.key, "--", "true"],
                     ["run", "-q", "--once-per", "1h", self.key, "--", "true"],
                     ["run", "-q", "--wait", "100ms", self.key, "--", "true"]):
            r = self.cli(*args, verbose=False)
            self.assertEqual(r.returncode, EXIT_HELD, r.stderr)
            self.assertEqual(r.stderr, "", f"{args}: held by another is silent with -q")

    def test_a_slot_done_is_one_line_by_default_and_none_with_quiet(self):
        r = self.cli("run", "--once-per", "1h", self.key, "--", "true", verbose=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.cli("run", "--once-per", "1h", self.key, "--", "true", verbose=False)
        self.assertEqual(r.returncode, EXIT_DONE, r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertIn("is done", r.stderr)
        r = self.cli("run", "-q", "--once-per", "1h", self.key, "--", "true", verbose=False)
        self.assertEqual(r.returncode, EXIT_DONE, r.stderr)
        self.assertEqual(r.stderr, "")

    def test_errors_print_even_with_quiet(self):
        r = self.cli("run", "-q", "--ttl", "1ms", self.key, "--", "true", verbose=False)
        self.assertEqual(r.returncode, EXIT_USAGE, r.stderr)
        self.assertIn("--ttl", r.stderr)

    def test_json_lines_are_structured_with_millisecond_timestamps(self):
        self.hold()
        r = self.cli("run", "--log-format", "json", self.key, "--", "true", verbose=False)
        self.assertEqual(r.returncode, EXIT_HELD, r.stderr)
        lines = [json.loads(line) for line in r.stderr.splitlines()]
        self.assertEqual(len(lines), 1, r.stderr)
        j = lines[0]
        self.assertEqual(j["level"], "info", j)
        self.assertEqual(j["event"], "held_by_another", j)
        self.assertIn("other-host", j["msg"])
        self.assertRegex(j["ts"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        # -v: the library's events carry their fields, every line a millisecond timestamp.
        r = self.cli("run", "--log-format", "json", "job:other", "--", "true")
        self.assertEqual(r.returncode, 0, r.stderr)
        events = [json.loads(line) for line in r.stderr.splitlines()]
        acquired = next(e for e in events if e["event"] == "acquired")
        self.assertEqual(acquired["key"], "job:other")
        self.assertIsInstance(acquired["fencing_token"], int)
        for e in events:
            self.assertRegex(e["ts"], r"\.\d{3}Z$", e)


if __name__ == "__main__":
    cli_harness.main("silence_test")
