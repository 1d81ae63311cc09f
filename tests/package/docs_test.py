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
import shutil
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
        # The variables a flag reads (CLI11's "(Env:NAME)" in --help), and the others.
        from_help = {v for sub in subcommands() for v in re.findall(r"Env:(\w+)", helptext(sub))}
        self.assertIn("LEASEHOLD_TTL", from_help)
        for var in sorted(from_help) + ["LEASEHOLD_STORE", "LEASEHOLD_KEY",
                                        "LEASEHOLD_FENCING_TOKEN", "LEASEHOLD_STORE_KEY",
                                        "LEASEHOLD_TERM", "LEASEHOLD_CONFIG",
                                        "LEASEHOLD_STATE_DIR"]:
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


def zsh_flags(text, name):
    """The flags of the zsh array `name=( ... )` (its specs' option names)."""
    block = text.split(f"  {name}=(", 1)[1].split("\n  )", 1)[0]
    return set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)(?=[\[}',])", block))


class ZshFishCompletionTest(unittest.TestCase):
    """The zsh and fish completions offer what `--help` lists, as the bash one does (read, not
    run: a completion needs an interactive shell); each passes its shell's syntax check where the
    shell is installed."""

    def read(self, name):
        with open(f"{SOURCE}/tools/cli/completion/{name}") as f:
            return f.read()

    def fish_offers(self):
        """{subcommand or "": flags} and the subcommands offered before one is given."""
        offers, subs = {}, set()
        for line in self.read("leasehold.fish").splitlines():
            if not line.startswith("complete -c leasehold"):
                continue
            cond = re.search(r"-n [\"']([^\"']*)[\"']", line)
            cond = cond.group(1) if cond else ""
            flags = {"--" + f for f in re.findall(r" -l (\S+)", line)}
            flags |= {"-" + f for f in re.findall(r" -s (\S)", line)}
            if cond.startswith("not __fish_seen_subcommand_from"):
                where = [""]
                subs |= set(re.findall(r" -a (\w+)", line))
            elif cond.startswith("__fish_seen_subcommand_from"):
                where = cond.split()[1:]
            else:
                where = [""] + subcommands()
            for w in where:
                offers.setdefault(w, set()).update(flags)
        return offers, subs

    def test_fish_offers_every_subcommand_and_flag(self):
        offers, subs = self.fish_offers()
        self.assertEqual(set(subcommands()) - subs, set())
        for sub in subcommands():
            with self.subTest(sub=sub):
                self.assertEqual(set(flags_of(sub)) - offers.get(sub, set()), set())

    def test_zsh_offers_every_subcommand_and_flag(self):
        text = self.read("_leasehold")
        subs = set(re.findall(r"^\s+'(\w+):", text.split("subcommands=(", 1)[1].split("\n      )", 1)[0],
                              re.M))
        self.assertEqual(set(subcommands()) - subs, set())
        common, tree = zsh_flags(text, "common"), zsh_flags(text, "tree")
        for sub in subcommands():
            with self.subTest(sub=sub):
                block = text.split(f"({sub})", 1)[1].split(";;", 1)[0]
                offered = set(re.findall(r"'\*?(--[a-z][a-z-]*)\[", block))
                offered |= common if "$common" in block else set()
                offered |= tree if "$tree" in block else set()
                self.assertEqual(set(flags_of(sub)) - offered, set())

    def test_each_passes_its_shells_syntax_check(self):
        for shell, name in (("zsh", "_leasehold"), ("fish", "leasehold.fish")):
            with self.subTest(shell=shell):
                if shutil.which(shell) is None:
                    self.skipTest(f"{shell} is not installed")
                r = subprocess.run([shell, "-n", f"{SOURCE}/tools/cli/completion/{name}"],
                                   capture_output=True, text=True, timeout=30)
                self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    LEASEHOLD, SOURCE = sys.argv[1], sys.argv[2]
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:])
