#!/usr/bin/env python3
# File: tests/cli/input_test.py
#
# What the command takes in and gives out (issue 35, points 6, 7 and 8): a --ttl shorter than
# the kill schedule needs is refused naming the smallest that is not, one above an hour needs
# --long-ttl; the command is resolved before anything is taken (a mistyped path under
# `--once-per --retry-failed no` neither takes the lease nor closes the slot, and `elect` never
# leads with it); keys and holder ids with
# control characters are refused with one line naming the character and its byte; a key that
# starts with '-' is given with --key; and `status`, `list` and `leader` escape what they print,
# so a holder id written into the store by hand cannot forge a line of their output.
#
#   python3 tests/cli/input_test.py --leasehold build/tools/cli/leasehold [-v]

import os
import re
import sqlite3
import stat
import unittest

import cli_harness
from cli_harness import CliHarness

EXIT_USAGE = 64
EXIT_SLOT_DONE = 80
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127


class InputTest(CliHarness, unittest.TestCase):
    TMP_PREFIX = "leasehold-input-"

    def db_path(self):
        return self.store[len("sqlite://"):]

    def test_a_command_that_cannot_run_takes_nothing(self):
        script = self.path("job.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\necho ran >> ran\n")
        cases = [
            (EXIT_NOT_FOUND, "command not found in $PATH", ["no-such-command-xyz"]),
            (EXIT_NOT_FOUND, "command not found", [self.path("jbo.sh")]),
            (EXIT_CANNOT_EXECUTE, "is not an executable file", [script]),  # no x bit yet
            (EXIT_CANNOT_EXECUTE, "is not an executable file", [self.tmp]),  # a directory
        ]
        for code, words, command in cases:
            with self.subTest(command=command):
                r = self.cli("run", "--once-per", "1h", "--retry-failed", "no", "job", "--",
                             *command)
                self.assert_one_error_line(r, code)
                self.assertIn(words, r.stderr)
                self.assertIn("nothing was taken", r.stderr)
                self.assertFalse(self.status_json("job")["held"])
                self.assertEqual(self.status_json("job")["slot_runs"], [], "no slot was closed")
        # The corrected command runs in the very slot the mistakes did not close.
        os.chmod(script, os.stat(script).st_mode | stat.S_IXUSR)
        r = self.cli("run", "--once-per", "1h", "--retry-failed", "no", "job", "--", script)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.path("ran")) as f:
            self.assertEqual(f.read(), "ran\n")
        r = self.cli("run", "--once-per", "1h", "job", "--", script)
        self.assertEqual(r.returncode, EXIT_SLOT_DONE, r.stderr)

        # elect: never campaigns with a command that cannot run.
        r = self.cli("elect", "--wait", "0", "e", "--", "no-such-command-xyz")
        self.assert_one_error_line(r, EXIT_NOT_FOUND)
        r = self.cli("leader", "e")
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "e: no leader"), r.stderr)

    def test_control_characters_are_refused_naming_the_byte(self):
        cases = [
            (["run", "a\nb", "--", "true"], "key must not contain control characters: U+000A at byte 1"),
            (["run", "tab\tkey", "--", "true"], "U+0009 at byte 3"),
            (["run", "esc\x1b[2J", "--", "true"], "U+001B at byte 3"),
            (["run", "c1\u009bx", "--", "true"], "U+009B at byte 2"),
            (["status", "a\rb"], "U+000D at byte 1"),
            (["release", "--force", "a\x7fb"], "U+007F at byte 1"),
            (["run", "--holder", "evil\nleasehold: released key=k", "k", "--", "true"],
             "holder identity must not contain control characters: U+000A at byte 4"),
        ]
        for args, words in cases:
            with self.subTest(args=args):
                r = self.cli(*args)
                self.assert_one_error_line(r, EXIT_USAGE)
                self.assertIn(words, r.stderr)
                self.assertEqual(r.stdout, "")

    def test_ttls_are_checked_at_the_door(self):
        # Too short for the kill schedule: one line naming --ttl and the smallest that is not.
        for ttl in ("100ms", "1us"):
            with self.subTest(ttl=ttl):
                r = self.cli("run", "--ttl", ttl, "job", "--", "touch", "ran")
                self.assert_one_error_line(r, EXIT_USAGE)
                self.assertIn(f"--ttl {ttl} is too short for the kill schedule", r.stderr)
                self.assertNotIn("--kill-grace", r.stderr, "a flag never given is not blamed")
        smallest = re.search(r"the smallest --ttl is (\d+)ms", r.stderr)
        self.assertIsNotNone(smallest, r.stderr)
        below = f"{int(smallest.group(1)) - 1}ms"
        r = self.cli("run", "--ttl", below, "job", "--", "touch", "ran")
        self.assert_one_error_line(r, EXIT_USAGE)
        r = self.cli("run", "--ttl", smallest.group(1) + "ms", "job", "--", "touch", "ran")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotRegex(r.stderr, r"(in|after|by) -[0-9]", "no negative duration in a log line")
        os.remove(self.path("ran"))
        # With flags given: names them and the --ttl that would do with them.
        r = self.cli("run", "--ttl", "400ms", "--kill-grace", "200ms", "job", "--", "true")
        self.assert_one_error_line(r, EXIT_USAGE)
        self.assertRegex(r.stderr, r"use --ttl \d+ms or more with these flags")
        # Absurdly long: only with --long-ttl.
        r = self.cli("run", "--ttl", "400d", "job", "--", "touch", "ran")
        self.assert_one_error_line(r, EXIT_USAGE)
        self.assertIn("--long-ttl", r.stderr)
        self.assertFalse(os.path.exists(self.path("ran")))
        r = self.cli("run", "--ttl", "2h", "--long-ttl", "job", "--", "touch", "ran")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.cli("elect", "--wait", "0", "--ttl", "100ms", "e", "--", "true")
        self.assert_one_error_line(r, EXIT_USAGE)

    def test_a_key_that_starts_with_a_dash_is_given_with_key(self):
        r = self.cli("run", "--key", "-nightly", "--", "sh", "-c", "echo \"$LEASEHOLD_KEY\" > key")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.wait_for_file("key"), "-nightly")
        p = self.start("run", "--ttl", "5s", "--key", "-nightly", "--", "sleep", "30")
        self.wait_until("held", lambda: self.cli("status", "--key", "-nightly", "--json")
                        .stdout.find('"held":true') >= 0)
        r = self.cli("release", "--force", "--key", "-nightly")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.wait_exit(p, 30)

    def test_status_list_and_leader_escape_what_the_store_holds(self):
        p = self.start("run", "--ttl", "10s", "--holder", "honest", "k", "--", "sleep", "30")
        self.wait_until("held", lambda: self.status_json("k")["held"])
        forged = "evil\nleasehold: released key=k fencing_token=1\x1b[2J"
        with sqlite3.connect(self.db_path(), timeout=10) as db:
            db.execute("UPDATE grants SET holder = ? WHERE key = 'k'", (forged,))
        for args in (["status", "k"], ["list"]):
            with self.subTest(args=args):
                r = self.cli(*args)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("evil\\x0aleasehold: released key=k fencing_token=1\\x1b[2J",
                              r.stdout)
                self.assertNotIn("\x1b", r.stdout)
                self.assertFalse(any(line.startswith("leasehold: released")
                                     for line in r.stdout.splitlines()), r.stdout)
        # JSON carries the text as it is, escaped by JSON itself.
        self.assertEqual(self.status_json("k")["holder"], forged)
        p.kill()
        p.wait()

    def test_parse_errors_are_one_line_in_our_words_and_help_is_wrapped(self):
        cases = [
            (["runn", "job", "--", "true"], "unknown subcommand 'runn' (did you mean 'run'?)"),
            ([], "no subcommand: give one of run, elect"),
            (["run", "--limit", "0", "k", "--", "true"],
             "run: --limit takes a whole number from 1 to 1024, not '0'"),
            (["run", "--ttl"], "run: --ttl needs a value (DURATION)"),
            (["run"], "run: missing KEY"),
            (["run", "--bogus", "k", "--", "true"], "run: unknown option --bogus"),
            (["status", "a", "b"], "status: unexpected argument b"),
            (["run", "--log-format", "xml", "k", "--", "true"],
             "run: --log-format takes one of text|json, not 'xml'"),
        ]
        for args, want in cases:
            with self.subTest(args=args):
                r = self.cli(*args, store=False, verbose=False)
                self.assertEqual(r.returncode, EXIT_USAGE, r.stderr)
                self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
                self.assertIn(want, r.stderr)
                for parser_words in ("A subcommand is required", "not expected", "required",
                                     "not in range", "Value "):
                    self.assertNotIn(parser_words, r.stderr)
        for sub in ([], ["run"], ["elect"], ["status"], ["check"]):
            with self.subTest(help=sub):
                r = self.cli(*sub, "--help", store=False, verbose=False)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertLessEqual(max(len(line) for line in r.stdout.splitlines()), 100)
                # The exit-code table once: under the top-level --help only.
                self.assertEqual("  75      held by another" in r.stdout, sub == [], r.stdout)


if __name__ == "__main__":
    cli_harness.main("input_test")
