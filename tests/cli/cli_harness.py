# File: tests/cli/cli_harness.py
#
# The harness shared by the end-to-end tests of the `leasehold` command (cli_test.py,
# tree_test.py; both import it from their own folder): the --leasehold argument, the printed
# figures, /proc/PID/stat, a free loopback port, and CliHarness, the fixture mixin of their
# test classes.
#
# CliHarness gives every test a fresh temp dir (the cwd of everything it starts), its own store
# (store_url(): a sqlite file in the temp dir unless a subclass names another) and its own
# LEASEHOLD_STATE_DIR, LEASEHOLD_CONFIG and HOME, so nothing touches the host's own store or
# configuration; tearDown kills every process group the test started, then whatever kill_leftovers() (a subclass's hook) finds, then removes the
# temp dir.

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

LEASEHOLD = None  # the executable under test: set by use_leasehold()


def arg_parser():
    """The parser of a test script's own arguments: --leasehold PATH; the rest go to unittest."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--leasehold", required=True, help="path to the leasehold executable")
    return parser


def use_leasehold(path, prog):
    """Makes path (absolute) the executable the harness runs, or exits naming prog if it cannot
    be run. Returns it."""
    global LEASEHOLD
    LEASEHOLD = os.path.abspath(path)
    if not os.access(LEASEHOLD, os.X_OK):
        sys.exit(f"{prog}: {LEASEHOLD} is not an executable")
    return LEASEHOLD


def main(prog):
    """A test script's main: --leasehold PATH (use_leasehold), the rest to unittest."""
    import unittest
    args, rest = arg_parser().parse_known_args()
    use_leasehold(args.leasehold, prog)
    unittest.main(argv=[sys.argv[0]] + rest)


def figure(name, value, bound):
    print(f"\n  [figure] {name}: {value:.3f}s (bound {bound:.3f}s)", file=sys.stderr, flush=True)


# --- /proc -------------------------------------------------------------------------------------


class Stat:
    """The fields of /proc/PID/stat these tests use."""

    def __init__(self, pid, text):
        rest = text[text.rindex(")") + 2:].split()  # after the parenthesised command name
        self.pid = pid
        self.state = rest[0]
        self.ppid = int(rest[1])
        self.pgid = int(rest[2])
        self.sid = int(rest[3])
        self.start = int(rest[19])  # field 22: start time in clock ticks since boot


def proc_stat(pid):
    """pid's Stat, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return Stat(pid, f.read())
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None


def process_gone(pid, start=None):
    """True if pid no longer runs: absent, a zombie waiting for a reaper, or (start given) a new
    process on the pid."""
    st = proc_stat(pid)
    return st is None or st.state in "ZX" or (start is not None and st.start != start)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the fixture -------------------------------------------------------------------------------


# A process tree that ticks: a background ticker and a foreground one (os.fork), both appending
# "<CLOCK_REALTIME ns>\n" every TICK_S to the file named by their argument. Run as
# `python3 -c TICKER PATH` under `leasehold run`.
TICK_S = 0.02
TICKER = ("import os, sys, time\n"
          "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)\n"
          "os.fork()\n"
          "while True:\n"
          "    os.write(fd, b'%d\\n' % time.time_ns())\n"
          f"    time.sleep({TICK_S})\n")


def read_ticks(path):
    """The ticks TICKER wrote to path (none if it does not exist yet)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [int(line) for line in f.read().split("\n")[:-1] if line]


def p99(values):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def store_main(prog, start):
    """The main of a test script that runs on one store: --leasehold PATH, --store NAME (the
    store classes of tests/chaos/chaos.py, or sqlite); calls start(NAME) before the tests."""
    import unittest
    parser = arg_parser()
    parser.add_argument("--store", default="sqlite", choices=sorted(chaos_module().STORES),
                        help="the store to test on (servers are started here, throwaway)")
    args, rest = parser.parse_known_args()
    use_leasehold(args.leasehold, prog)
    start(args.store)
    unittest.main(argv=[sys.argv[0]] + rest)


class StoreServer:
    """A throwaway server of store NAME for a test module that runs on one store (--store NAME):
    the store classes of tests/chaos/chaos.py, started on free loopback ports in a temporary
    directory and reached directly (no fault proxy in between). url is None for sqlite, whose
    file each test makes in its own temp dir."""

    def __init__(self, name, prog):
        self.name = name
        self.url = None
        self._store = None
        self._run_dir = None
        if name == "sqlite":
            return
        chaos = chaos_module()
        self._run_dir = tempfile.mkdtemp(prefix=f"leasehold-{prog}-server-")
        store = chaos.STORES[name]()
        t = time.monotonic()
        try:
            store.start(self._run_dir)
        except SystemExit as e:  # chaos's starters exit with a message
            raise AssertionError(f"{name} server did not start: {e}") from None
        self.url = store.url().replace(f":{store.proxy.port}", f":{store.port}")
        store.proxy.close()
        self._store = store
        figure(f"{name} server start", time.monotonic() - t, 60.0)
        print(f"  {prog}: store {self.url}", file=sys.stderr, flush=True)

    def stop(self):
        if self._store is not None:
            self._store.stop()
            self._store = None
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None


def chaos_module():
    """tests/chaos/chaos.py, whose store classes start the servers."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "chaos"))
    import chaos
    return chaos


class CliHarness:
    """setUp/tearDown and the helpers of a test class of the command (a mixin: the classes add
    unittest.TestCase). Parameters: TMP_PREFIX, store_url(), kill_leftovers(), diagnostics();
    status_json() without a key reads self.key, which a subclass sets."""

    TMP_PREFIX = "leasehold-cli-"

    def store_url(self):
        """The --store of every command (called once the temp dir exists)."""
        return "sqlite://" + os.path.join(self.tmp, "leases.db")

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix=self.TMP_PREFIX)
        self.store = self.store_url()
        self.env = dict(os.environ)
        self.env.pop("LEASEHOLD_STORE", None)
        self.env.pop("LEASEHOLD_DEBUG", None)
        # The host-wide default store and the host's configuration file, under the temp dir.
        self.env["LEASEHOLD_STATE_DIR"] = os.path.join(self.tmp, "state", "leasehold")
        self.env["LEASEHOLD_CONFIG"] = os.path.join(self.tmp, "leasehold.conf")
        with open(self.env["LEASEHOLD_CONFIG"], "w") as f:
            f.write("# none: the tests give --store, or test the defaults\n")
        self.env["HOME"] = self.tmp
        self.procs = []
        # Create the store once up front (the sqlite file; a server store must answer): the tests
        # are about the command, and a fresh file opened by several processes at once is covered
        # by its own test (cli_test).
        try:
            r = self.cli("list")
            self.assertEqual(r.returncode, 0, r.stderr)
        except BaseException:
            self.tearDown()  # unittest skips tearDown when setUp fails
            raise

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)
            # Children of a run killed with -9 live in the same (new) process group.
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.stderr_file.close()
        self.kill_leftovers()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def kill_leftovers(self):
        """tearDown's hook, after the process groups and before the temp dir: kills whatever else
        a test may have left running. Nothing here."""

    # --- helpers -------------------------------------------------------------------------------

    def path(self, name):
        return os.path.join(self.tmp, name)

    def argv(self, args, store, verbose=True):
        """leasehold ARGS, with --store after the subcommand name if `store`, and -v (the
        lifecycle lines the tests read; a run that succeeds prints nothing without it) first if
        `verbose`."""
        argv = [LEASEHOLD] + list(args)
        if store:
            argv[2:2] = ["--store", self.store]  # after the subcommand name
        if verbose:
            argv[1:1] = ["-v"]
        return argv

    def cli(self, *args, env=None, timeout=30, store=True, verbose=True):
        return subprocess.run(self.argv(args, store, verbose), env=env or self.env, cwd=self.tmp,
                              capture_output=True, text=True, timeout=timeout)

    def start(self, *args, env=None, store=True, stdout=subprocess.DEVNULL, verbose=True):
        """Starts `leasehold ARGS` in its own session (its pid is its process group); stderr
        goes to a file."""
        err = tempfile.NamedTemporaryFile(mode="w+", dir=self.tmp, prefix="stderr-", delete=False)
        p = subprocess.Popen(self.argv(args, store, verbose), env=env or self.env, cwd=self.tmp,
                             stdout=stdout, stderr=err, start_new_session=True)
        p.stderr_file = err
        self.procs.append(p)
        return p

    def stderr_of(self, p):
        with open(p.stderr_file.name) as f:
            return f.read()

    def diagnostics(self):
        """What a failed wait shows: every started process, its exit code and stderr."""
        return "\n".join(f"{p.args[1:8]} rc={p.poll()}: {self.stderr_of(p)}" for p in self.procs)

    def wait_until(self, what, pred, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = pred()
            if value:
                return value
            time.sleep(0.01)
        self.fail(f"{what}: not within {timeout}s; started processes:\n" + self.diagnostics())

    def wait_for_file(self, name, timeout=10):
        """The stripped text of the file name of the temp dir once it ends with a newline."""
        def complete():
            if os.path.exists(self.path(name)):
                with open(self.path(name)) as f:
                    text = f.read()
                if text.endswith("\n"):
                    return text.strip()
            return None
        return self.wait_until(f"{name} appears", complete, timeout)

    def wait_exit(self, p, timeout):
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"leasehold {p.args[1:]} still running after {timeout}s; stderr:\n"
                      + self.stderr_of(p))

    def status_json(self, key=None, env=None, store=True):
        """`status --json`, whose exit code says held (0) or free (1)."""
        r = self.cli("status", key or self.key, "--json", env=env, store=store)
        self.assertIn(r.returncode, (0, 1), r.stderr)
        j = json.loads(r.stdout)
        self.assertEqual(r.returncode, 0 if j["held"] else 1, r.stdout)
        return j

    def assert_one_error_line(self, r, code):
        lines = r.stderr.splitlines()
        self.assertGreaterEqual(r.returncode, 0, f"killed by signal: {r.stderr}")
        self.assertEqual(r.returncode, code, f"stderr: {r.stderr}")
        self.assertEqual(len(lines), 1, f"expected one stderr line, got: {lines}")
        self.assertTrue(lines[0].startswith("leasehold: "), lines[0])
