#!/usr/bin/env python3
# File: tests/package/docs_test.py
#
# The man page (docs/leasehold.1) and the bash completion (tools/cli/completion/leasehold.bash)
# are written by hand; this test keeps them in step with the command's own `--help`:
#   - every subcommand of `leasehold --help` has a section in the man page, and every flag of
#     `leasehold SUBCOMMAND --help` appears in that section (the common ones in COMMON OPTIONS);
#   - every exit code of the help footer is in EXIT STATUS, with the same meaning;
#   - `groff -man -ww -z` renders the page without a warning;
#   - the completion offers every subcommand, and every flag of each after `SUBCOMMAND --`.
#
#   python3 tests/package/docs_test.py LEASEHOLD SOURCE_DIR

import re
import subprocess
import sys
import unittest

LEASEHOLD = None
SOURCE = None
COMMON = {"--store", "--quiet", "--verbose", "--help"}


def helptext(*args):
    r = subprocess.run([LEASEHOLD, *args, "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def subcommands():
    text = helptext()
    block = text.split("Subcommands:", 1)[1].split("Exit codes:", 1)[0]
    return [m.group(1) for m in re.finditer(r"^  (\w+)\s", block, re.M)]


def flags_of(sub):
    text = helptext(sub).split("Exit codes:", 1)[0]
    return sorted(set(re.findall(r"^\s+(?:-\w,)?(--[a-z][a-z-]*)", text, re.M)))


def exit_codes():
    text = helptext().split("Exit codes:", 1)[1]
    return [(m.group(1), m.group(2).strip())
            for m in re.finditer(r"^  (\S+)\s+(.+)$", text, re.M)]


def man_plain():
    """The man page as text: escapes and font changes removed, one section per key."""
    with open(f"{SOURCE}/docs/leasehold.1") as f:
        src = f.read()
    src = re.sub(r"\\f[BIRP]", "", src).replace("\\-", "-").replace("\\(lq", '"') \
        .replace("\\(rq", '"')
    sections, name = {}, None
    for line in src.splitlines():
        m = re.match(r'^\.(SH|SS) "?([^"]+)"?$', line)
        if m:
            name = m.group(2).strip()
            sections[name] = ""
            continue
        if name is not None and not line.startswith('.\\"'):
            text = re.sub(r"^\.(B|I|BR|RB|IR|RI|BI|IB)\s+", "", line)
            sections[name] += text.replace('"', "") + "\n"
    return sections


class ManPageTest(unittest.TestCase):
    def test_every_subcommand_has_a_section_with_all_its_flags(self):
        sections = man_plain()
        for sub in subcommands():
            with self.subTest(sub=sub):
                self.assertIn(sub, sections, f"no .SS {sub} in docs/leasehold.1")
                for flag in flags_of(sub):
                    where = sections["COMMON OPTIONS"] if flag in COMMON else sections[sub]
                    self.assertIn(flag, where, f"{sub} {flag} is not in the man page")

    def test_every_exit_code_is_in_exit_status_with_its_meaning(self):
        status = re.sub(r"\s+", " ", man_plain()["EXIT STATUS"]).lower()
        for code, meaning in exit_codes():
            with self.subTest(code=code):
                self.assertIn(code.lower(), status)
                # The meaning's first words, as the help footer says them.
                head = " ".join(meaning.lower().replace("(", "").split()[:3])
                self.assertIn(head, status.replace("(", ""), f"exit {code}: {meaning}")

    def test_environment_and_files_are_documented(self):
        sections = man_plain()
        for var in ("LEASEHOLD_STORE", "LEASEHOLD_KEY", "LEASEHOLD_FENCING_TOKEN",
                    "LEASEHOLD_STORE_KEY",
                    "LEASEHOLD_TERM", "LEASEHOLD_CONFIG", "LEASEHOLD_STATE_DIR"):
            self.assertIn(var, sections["ENVIRONMENT"])
        self.assertIn("/var/lib/leasehold/leases.db", sections["FILES"])
        self.assertIn("/etc/leasehold/leasehold.conf", sections["FILES"])

    def test_groff_renders_it_without_a_warning(self):
        r = subprocess.run(["groff", "-man", "-ww", "-z", f"{SOURCE}/docs/leasehold.1"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")


class CompletionTest(unittest.TestCase):
    def complete(self, *words):
        script = (f"source {SOURCE}/tools/cli/completion/leasehold.bash; "
                  f"COMP_WORDS=(leasehold {' '.join(words)}); COMP_CWORD={len(words)}; "
                  "_leasehold; printf '%s\\n' \"${COMPREPLY[@]}\"")
        r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        return set(r.stdout.split())

    def test_offers_every_subcommand(self):
        self.assertEqual(set(subcommands()) - self.complete(""), set())

    def test_offers_every_flag_of_every_subcommand(self):
        for sub in subcommands():
            with self.subTest(sub=sub):
                self.assertEqual(set(flags_of(sub)) - self.complete(sub, "--"), set())

    def test_offers_the_values_of_contain(self):
        self.assertEqual(self.complete("run", "--contain", ""),
                         {"auto", "cgroup", "pidns", "group"})


if __name__ == "__main__":
    LEASEHOLD, SOURCE = sys.argv[1], sys.argv[2]
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:])
