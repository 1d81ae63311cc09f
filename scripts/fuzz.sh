#!/usr/bin/env bash
# Runs every libFuzzer target of a LEASEHOLD_BUILD_FUZZ=ON build for a bounded time each, one
# after the other, and fails if any of them finds a crash, a leak, a timeout or a broken
# invariant. Prints, per target: executions, execs/s, corpus size (inputs, bytes) and time.
#
#   scripts/fuzz.sh [--build-dir DIR] [--seconds N] [TARGET...]
#
#   --build-dir  the build with LEASEHOLD_BUILD_FUZZ=ON (default: build-fuzz/)
#   --seconds    time per target (default: 15; $FUZZ_SECONDS)
#   --seed N     libFuzzer's -seed (default: $FUZZ_SEED, else a random one): with a fixed seed a
#                run repeats the same inputs in the same order (a slower machine runs a prefix
#                of them), so a CI finding reproduces; exploring is the job of by-hand runs
#   TARGET       names as in tests/fuzz/CMakeLists.txt (url, duration, ...); default: all built
#
# Each run starts from tests/fuzz/corpus/<target>/ (seeds and past findings) in a scratch
# directory, so the repository's corpus is never rewritten; what a run finds is kept in
# <build>/fuzz-artifacts/<target>/ (crash-*, leak-*, timeout-*), to add to the corpus as a
# regression once fixed. Set FUZZ_KEEP_CORPUS=DIR to keep the grown corpora in DIR/<target>/.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build_dir="$root/build-fuzz"
seconds="${FUZZ_SECONDS:-15}"
seed="${FUZZ_SEED:-}"
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir="$(cd "$2" && pwd)"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 64 ;;
    *) targets+=("$1"); shift ;;
  esac
done
case "$seconds" in ''|*[!0-9]*|0) echo "fuzz.sh: --seconds wants a whole number > 0" >&2; exit 64 ;; esac
seed_flag=()
if [ -n "$seed" ]; then
  case "$seed" in *[!0-9]*|0) echo "fuzz.sh: --seed wants a whole number > 0" >&2; exit 64 ;; esac
  seed_flag=(-seed="$seed")
fi
list="$build_dir/tests/fuzz/targets.txt"
if [ ! -f "$list" ]; then
  echo "fuzz.sh: no $list: configure with CXX=clang++-14 -DLEASEHOLD_BUILD_FUZZ=ON and build leasehold_fuzz_all" >&2
  exit 64
fi
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(grep -v '^$' "$list")
fi

scratch="$(mktemp -d "${TMPDIR:-/tmp}/leasehold-fuzz.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
artifacts="$build_dir/fuzz-artifacts"
failed=()
printf '%-18s %10s %10s %8s %10s %6s  %s\n' target execs execs/s inputs bytes secs result
for t in "${targets[@]}"; do
  bin="$build_dir/tests/fuzz/leasehold_fuzz_$t"
  seeds="$root/tests/fuzz/corpus/$t"
  if [ ! -x "$bin" ] || [ ! -d "$seeds" ]; then
    echo "fuzz.sh: no target $t ($bin, $seeds)" >&2
    failed+=("$t")
    continue
  fi
  work="$scratch/corpus/$t"
  mkdir -p "$work" "$artifacts/$t"
  cp "$seeds"/* "$work"/
  log="$scratch/$t.log"
  start=$(date +%s%N)
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb: a parser must not balloon;
  # -max_len: URLs, conninfos and node data are short, 4 KiB covers them with room.
  set +e
  TMPDIR="$scratch" ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}" \
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
    "${seed_flag[@]}" -print_final_stats=1 -artifact_prefix="$artifacts/$t/" "$work" >"$log" 2>&1
  rc=$?
  set -e
  tenths=$((($(date +%s%N) - start) / 100000000))
  secs="$((tenths / 10)).$((tenths % 10))"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  inputs=$(find "$work" -type f | wc -l)
  bytes=$(find "$work" -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}')
  result=ok
  if [ "$rc" -ne 0 ]; then
    result="FAILED (exit $rc)"
    failed+=("$t")
  fi
  printf '%-18s %10s %10s %8s %10s %6s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$inputs" "$bytes" "$secs" "$result"
  if [ "$rc" -ne 0 ]; then
    grep -E 'ERROR|invariant broken|runtime error|SUMMARY|Test unit written' "$log" | head -20 | sed 's/^/    /'
  fi
  if [ -n "${FUZZ_KEEP_CORPUS:-}" ]; then
    mkdir -p "$FUZZ_KEEP_CORPUS/$t"
    cp "$work"/* "$FUZZ_KEEP_CORPUS/$t"/
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]} (inputs in $artifacts/)" >&2
  exit 1
fi
echo "fuzz.sh: all ${#targets[@]} targets ran ${seconds}s each without a finding"
