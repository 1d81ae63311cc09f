#!/usr/bin/env python3
"""A fenced writer for the chaos harness's CLI mode (chaos.py --cli): the leftover grandchild.

Started in the background by the command that `leasehold run` supervises, with the lease's key
and fencing token. Loops forever: one fenced write into the register every --gap-ms, exactly as
tests/chaos/fenced_register.cc does it (same schema, same semantics: one BEGIN IMMEDIATE
transaction that reads the key's max_token, applies the conditional UPSERT -- accepted only if
token >= max_token -- reads CLOCK_BOOTTIME just before COMMIT, and logs the attempt in `writes`
with max_before and accepted; busy timeout 60 s).

It never checks whether the lease is still valid, and it never exits on its own: not when its
parent exits, not on a register error (it rolls back and tries again at the next gap). It dies
only by a signal, so whether it outlives its lease is up to leasehold's supervision of the
process tree, which is what the harness tests. It prints nothing in normal operation (a closed
stderr must not end it either).

  fenced_writer.py --register PATH --key KEY --token N --writer ID [--gap-ms 15]
"""

import argparse
import signal
import sqlite3
import sys
import time

# The same as fenced_register.cc's kSchema.
SCHEMA = """
PRAGMA journal_mode=WAL;
PRAGMA synchronous=NORMAL;
CREATE TABLE IF NOT EXISTS reg(key TEXT PRIMARY KEY, max_token INTEGER NOT NULL,
  value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS writes(id INTEGER PRIMARY KEY, key TEXT NOT NULL,
  token INTEGER NOT NULL, writer TEXT NOT NULL, max_before INTEGER NOT NULL,
  accepted INTEGER NOT NULL, t_commit_ns INTEGER NOT NULL);
"""

# fenced_register.cc's kFencedUpsert.
FENCED_UPSERT = (
    "INSERT INTO reg(key, max_token, value) VALUES(?1, ?2, ?3) "
    "ON CONFLICT(key) DO UPDATE SET max_token = excluded.max_token, value = excluded.value "
    "WHERE excluded.max_token >= reg.max_token")

BUSY_TIMEOUT_S = 60.0  # fenced_register.cc's kBusyTimeoutMs


def complain(msg):
    try:
        print(f"fenced_writer: {msg}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def open_register(path):
    while True:
        try:
            # isolation_level=None: no implicit transactions; BEGIN IMMEDIATE is ours.
            db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            db.executescript(SCHEMA)
            return db
        except sqlite3.Error as e:
            complain(f"open {path}: {e}; retrying")
            time.sleep(0.05)


def write(db, key, token, writer):
    """One fenced write (fenced_register.cc's FencedRegister::Write). Returns the outcome."""
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.Error:
        return "error"
    try:
        row = db.execute("SELECT max_token FROM reg WHERE key = ?1", (key,)).fetchone()
        max_before = row[0] if row else 0
        db.execute(FENCED_UPSERT, (key, token, writer))
        accepted = db.execute("SELECT changes()").fetchone()[0] == 1
        t_commit_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        db.execute("INSERT INTO writes(key, token, writer, max_before, accepted, t_commit_ns) "
                   "VALUES(?1, ?2, ?3, ?4, ?5, ?6)",
                   (key, token, writer, max_before, 1 if accepted else 0, t_commit_ns))
        db.execute("COMMIT")
        return "accepted" if accepted else "rejected"
    except sqlite3.Error:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        return "error"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--register", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--token", required=True, type=int)
    ap.add_argument("--writer", required=True)
    ap.add_argument("--gap-ms", type=float, default=15)
    args = ap.parse_args()
    # Python turns SIGINT into KeyboardInterrupt; let it be a plain death by signal instead.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    db = open_register(args.register)
    errors = 0
    while True:
        if write(db, args.key, args.token, args.writer) == "error":
            errors += 1
            if errors in (1, 10, 100) or errors % 1000 == 0:
                complain(f"register write failed ({errors} so far); going on")
        time.sleep(args.gap_ms / 1000.0)


if __name__ == "__main__":
    main()
