#!/usr/bin/env bash
# Model-checks leasehold's safety rule (tests/model/lease.pml) with spin, and checks that the
# model can fail: every negative control (a -D switch that breaks the rule the way a plausible
# bug would) must produce a counterexample trail. Exits non-zero if the real model has an
# error or an incomplete search, or if any control verifies.
#
#   tests/model/run.sh           the CI set: the model at TTL=4 ticks, 2 holders, 1 key, and
#                                every control (about a minute and a half on 2 cores)
#   tests/model/run.sh --long    also the batched renewal checked directly (2 leases of one
#                                holder in one round): long, see the note at its check
#   KEEP_TRAILS=DIR run.sh ...   copies each control's trail to DIR (replay it with
#                                `spin -t -p -D<switches> lease.pml` next to a copy of the model)
#
# Everything spin and the C compiler write (pan.*, the trails) goes to a temporary directory
# that is removed on exit.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
model="$here/lease.pml"
cc="${CC:-cc}"
long=0
case "${1:-}" in
  --long) long=1 ;;
  "") ;;
  *) echo "usage: $0 [--long]" >&2; exit 64 ;;
esac

for tool in spin "$cc"; do
  if ! command -v "$tool" >/dev/null; then
    echo "model: $tool not found (scripts/install-deps.sh installs spin and gcc)" >&2
    exit 1
  fi
done

work="$(mktemp -d "${TMPDIR:-/tmp}/leasehold-model.XXXXXX")"
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# The DFS stack must be deeper than any path: the search then covers every reachable state
# (checked below: pan says "max search depth too small" otherwise). pan reserves stack memory
# for all of it (about 65 bytes a level), so each set asks for what it needs.
depth=10000000
panflags=""
failures=0

# check NAME EXPECT DEFINES...: EXPECT is "verified" (no error, complete search) or
# "counterexample" (an error with a trail that spin replays).
check() {
  local name="$1" expect="$2"
  shift 2
  local dir="$work/$name"
  mkdir -p "$dir"
  cp "$model" "$dir/lease.pml"
  local start end verdict
  start=$(date +%s.%N)
  # -w: pan.c trips gcc's -Wstringop-overflow on its own bounds-checked array indexing.
  if ! (cd "$dir" && spin "$@" -a lease.pml >spin.log 2>&1 &&
        "$cc" -O2 -w -DSAFETY $panflags -o pan pan.c >>spin.log 2>&1 &&
        { ./pan -m"$depth" >pan.log 2>&1 || true; }); then
    echo "model: $name: spin or $cc failed:" >&2
    cat "$dir/spin.log" >&2
    failures=$((failures + 1))
    return
  fi
  end=$(date +%s.%N)
  local log="$dir/pan.log"
  local errors states transitions reached memory secs
  errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$log")
  states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' "$log")
  transitions=$(sed -n 's/^ *\([0-9.e+]*\) transitions.*/\1/p' "$log")
  reached=$(sed -n 's/.*depth reached \([0-9]*\),.*/\1/p' "$log")
  memory=$(sed -n 's/^ *\([0-9.]*\).total actual memory usage.*/\1/p' "$log")
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  if [ -z "$errors" ]; then
    verdict="FAIL (pan did not finish)"
  elif [ "$expect" = verified ]; then
    if [ "$errors" != 0 ]; then
      verdict="FAIL (error found: see below)"
    elif grep -qiE "depth too small|out of memory|search not completed|memory limit" "$log"; then
      verdict="FAIL (search incomplete)"
    else
      verdict="ok: verified, exhaustive"
    fi
  else
    if [ "$errors" = 0 ] || [ ! -s "$dir/lease.pml.trail" ]; then
      verdict="FAIL (no counterexample: the model cannot see this bug)"
    elif ! (cd "$dir" && spin -t "$@" lease.pml >replay.log 2>&1) ||
         ! grep -q "violated" "$dir/replay.log"; then
      verdict="FAIL (trail does not replay)"
    else
      verdict="ok: counterexample, trail of $(sed -n 's/.*trail ends after \([0-9]*\) steps.*/\1/p' \
        "$dir/replay.log") steps"
      if [ -n "${KEEP_TRAILS:-}" ]; then
        mkdir -p "$KEEP_TRAILS"
        cp "$dir/lease.pml.trail" "$KEEP_TRAILS/$name.trail"
      fi
    fi
  fi
  printf 'model: %-22s %-8s states=%s transitions=%s depth=%s memory_mb=%s time_s=%s  %s\n' \
    "$name" "[$*]" "$states" "$transitions" "$reached" "$memory" "$secs" "$verdict"
  case "$verdict" in
    ok*) ;;
    *) failures=$((failures + 1)); grep -E "violated|error|depth|pan:" "$log" | head -5 >&2 || true ;;
  esac
  rm -rf "$dir"
}

spin -V

# The model: 2 holders, 1 key, TTL 4 ticks, clock error 1 tick each, drift allowance 2.
check model verified -DTTL=4
# Negative controls, each a plausible bug in the rule; each must be caught.
check ctl-arrival counterexample -DTTL=4 -DARRIVAL
check ctl-no-drift counterexample -DTTL=4 -DNODRIFT
check ctl-renew-from-reply counterexample -DTTL=4 -DRENEW_FROM_REPLY
check ctl-no-late-guard counterexample -DTTL=4 -DNO_LATE_GUARD
check ctl-drift-short counterexample -DTTL=4 -DDRIFT=1
check ctl-release-by-key counterexample -DTTL=4 -DRELEASE_BY_KEY

if [ "$long" = 1 ]; then
  # The batched renewal: holder 0 renews leases on keys 0 and 1 in one round with one t_send,
  # holder 1 contends for key 0 (-DBATCH_ONE), without the lost-request path (-DNO_TRANSIENT).
  # Tens of millions of states and a DFS deeper than 34 million steps: -DCOLLAPSE (lossless
  # state compression); pan preallocates its stack, about 65 bytes a level (6.5 GB here), so
  # this needs a machine with 16 GB free. Not seen to finish here in 7 minutes
  # (tests/chaos/RESULTS.md, "Model"); no time limit: the verdict is pan's.
  depth=100000000
  panflags="-DCOLLAPSE"
  check batch verified -DNK=2 -DBATCH_ONE -DTTL=3 -DNO_TRANSIENT
fi

if [ "$failures" != 0 ]; then
  echo "model: $failures check(s) failed" >&2
  exit 1
fi
echo "model: all checks passed"
