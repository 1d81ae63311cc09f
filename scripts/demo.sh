#!/usr/bin/env bash
# Sets up leasehold and runs the main job on the embedded default store: two `leasehold run`
# on the same key. The first holds it for 3 s; the second waits politely (--wait), starts as
# soon as the first is done, and sees a higher fencing token. Installs only what building the
# command needs (scripts/install-deps.sh --build) and builds only the `leasehold` command
# (tests, examples and benchmarks off; scripts/test.sh turns them back on in the same build/).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/install-deps.sh --build
BUILD_DIR="$root/build" TARGET=leasehold_cli scripts/build.sh -DLEASEHOLD_BUILD_TESTS=OFF \
  -DLEASEHOLD_BUILD_EXAMPLES=OFF -DLEASEHOLD_BUILD_BENCH=OFF >/dev/null
leasehold="$root/build/tools/cli/leasehold"
key="demo:nightly-report"

echo "store: ${LEASEHOLD_STORE:-the host-wide embedded default (/var/lib/leasehold/leases.db)}"
# -v: leasehold's own lines (acquired, released...); without it a run that succeeds is silent.
"$leasehold" run -v --ttl 5s "$key" -- sh -c \
  'echo "[first]  running with fencing token $LEASEHOLD_FENCING_TOKEN; working for 3 s"; sleep 3; echo "[first]  done"' &
first=$!
sleep 0.5
"$leasehold" status "$key"
echo "[second] starting; the key is held, so it waits..."
"$leasehold" run -v --ttl 5s --wait 30s "$key" -- sh -c \
  'echo "[second] running with fencing token $LEASEHOLD_FENCING_TOKEN (higher: the first grant is over)"'
wait "$first"
"$leasehold" status "$key" || echo "(status exits 1: the key is free)"
