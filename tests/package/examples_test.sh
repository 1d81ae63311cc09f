#!/usr/bin/env bash
# Checks the service-manager examples that the Debian package installs (examples/cron,
# examples/systemd, examples/container), so they cannot drift from the command:
#   - each systemd unit passes `systemd-analyze verify` (the timer together with its service),
#     on a copy whose ExecStart points at real executables; any line of its output that names
#     one of our units fails the test. Without systemd-analyze: a syntax check, and it says so;
#   - every `leasehold` command line in the examples (the crontab line, the ExecStart lines, the
#     entrypoint) runs for real against a throwaway sqlite:// store, with the job replaced by a
#     stub that records its run, so a flag the CLI does not have fails the test; and the exit
#     codes the files promise (held and done moved to 0 by --exit-code while a job's own 75 or
#     80 fails, 130/143 on stop, SuccessExitStatus=) are the ones the command really gives;
#   - `sh -n` on entrypoint.sh, which also runs as the container's PID 1 (a new PID namespace,
#     where root may make one) and without privileges (where it must fall back to group
#     containment, as Dockerfile.snippet says).
# Usage: examples_test.sh LEASEHOLD_BINARY SOURCE_DIR
set -euo pipefail

if [ "$#" -ne 2 ]; then
  echo "usage: $0 LEASEHOLD_BINARY SOURCE_DIR" >&2
  exit 64
fi
leasehold="$(realpath "$1")"
src="$(realpath "$2")"
ex="$src/examples"
[ -x "$leasehold" ] || { echo "examples_test: $leasehold is not executable" >&2; exit 1; }

tmp="$(mktemp -d)"
chmod 0755 "$tmp"  # the unprivileged run below must reach the stubs
bg_pids=()
cleanup() {
  local p
  for p in "${bg_pids[@]+"${bg_pids[@]}"}"; do
    kill -KILL "$p" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

store="sqlite://$tmp/leases.db"
checks=0
fail() {
  echo "examples_test: FAIL: $*" >&2
  exit 1
}
ok() {
  checks=$((checks + 1))
  echo "ok $checks - $*"
}
note() { echo "# $*"; }

# --- helpers -------------------------------------------------------------------------------

# Duration (leasehold's 500ms/5s/2m/1m30s or systemd's 20s/1min/1h) -> milliseconds.
to_ms() {
  local d="$1" total=0 n u
  [[ "$d" =~ ^([0-9]+(ms|us|s|sec|m|min|h))+$ ]] || fail "cannot read duration '$d'"
  while [[ "$d" =~ ^([0-9]+)(ms|us|sec|min|s|m|h)(.*)$ ]]; do
    n="${BASH_REMATCH[1]}" u="${BASH_REMATCH[2]}" d="${BASH_REMATCH[3]}"
    case "$u" in
      us) total=$((total + n / 1000)) ;;
      ms) total=$((total + n)) ;;
      s | sec) total=$((total + n * 1000)) ;;
      m | min) total=$((total + n * 60000)) ;;
      h) total=$((total + n * 3600000)) ;;
    esac
  done
  echo "$total"
}

# The stub that stands in for /usr/local/bin/NAME: it appends "key term leader_id" to
# $tmp/ran/NAME and then, by $STUB_MODE: exits 0 (exit0), exits 3 (fail), 75 (exit75) or 80
# (exit80), runs until SIGTERM
# and exits 0 then (serve), or runs until killed, with SIGTERM's default action (serve-notrap).
mkdir -p "$tmp/bin" "$tmp/ran" "$tmp/pathbin"
chmod 0777 "$tmp/ran"
make_stub() {
  local name="$1"
  [ -e "$tmp/bin/$name" ] && return 0
  cat >"$tmp/bin/$name" <<EOF
#!/bin/sh
echo "\${LEASEHOLD_KEY:-} \${LEASEHOLD_TERM:-} \${LEASEHOLD_LEADER_ID:-}" >>"$tmp/ran/$name"
case "\${STUB_MODE:-exit0}" in
  exit0) exit 0 ;;
  fail) exit 3 ;;
  exit75) exit 75 ;;
  exit80) exit 80 ;;
  serve) trap 'exit 0' TERM; while :; do sleep 0.05; done ;;
  serve-notrap) exec sleep 60 ;;
esac
exit 99
EOF
  chmod 0755 "$tmp/bin/$name"
}
ran_count() {
  if [ -f "$tmp/ran/$1" ]; then wc -l <"$tmp/ran/$1" | tr -d ' '; else echo 0; fi
}
# Waits until stub $1 has run at least $2 times (default 1) while the background process $BG
# lives; fails at once if it exits first (a bad flag: 64), and after 15 s.
wait_ran() {
  local want="${2:-1}" i rc
  for ((i = 0; i < 300; i++)); do
    [ "$(ran_count "$1")" -ge "$want" ] && return 0
    if ! kill -0 "$BG" 2>/dev/null; then
      rc=0
      wait "$BG" || rc=$?
      tail -5 "$tmp/bg.log" >&2
      fail "the process meant to run the stub $1 exited $rc before running it $want time(s)"
    fi
    sleep 0.05
  done
  fail "the stub $1 did not run $want time(s) within 15 s"
}
reset_ran() { rm -f "$tmp/ran/"*; }

# Rewrites an example's command line for this machine: /usr/bin/leasehold -> the built binary,
# the --store value -> the throwaway store, /usr/local/bin/NAME -> a stub. Refuses lines where
# a substitution would silently not happen.
localize() {
  local c="$1" name
  [[ "$c" == /usr/bin/leasehold\ * ]] || fail "command does not start with /usr/bin/leasehold: $c"
  [[ "$c" =~ --store\ [^\ ]+ ]] || fail "command has no --store URL: $c"
  [[ "$c" == */usr/local/bin/* ]] || fail "command runs nothing under /usr/local/bin: $c"
  for name in $(grep -o '/usr/local/bin/[A-Za-z0-9_.-]*' <<<"$c" | sed 's#.*/##'); do
    make_stub "$name"
  done
  sed -E "s#^/usr/bin/leasehold #$leasehold #; s#--store [^ ]+#--store $store#; s#/usr/local/bin/([A-Za-z0-9_.-]+)#$tmp/bin/\\1#g" <<<"$c"
}

# Holds KEY from another process (as another host would) until release_holder; sets HOLDER.
hold_key() {
  "$leasehold" --store "$store" run --quiet "$1" -- sleep 60 &
  bg_pids+=("$!")
  local pid=$! i
  for ((i = 0; i < 200; i++)); do
    grep -q 'state: *held' <<<"$("$leasehold" --store "$store" status "$1")" && { HOLDER=$pid; return 0; }
    sleep 0.05
  done
  fail "could not hold $1"
}
release_holder() {
  kill -TERM "$HOLDER" 2>/dev/null || true
  wait "$HOLDER" 2>/dev/null || true
}

# Joins systemd's backslash-continued lines; prints the value of every KEY= line of FILE.
unit_values() {
  awk -v key="$2" '
    /^[ \t]*[#;]/ && cont == "" { next }
    { line = cont $0; cont = "" }
    /\\$/ { sub(/\\$/, "", line); cont = line; next }
    { sub(/^[ \t]+/, "", line) }
    index(line, key "=") == 1 { print substr(line, length(key) + 2) }
  ' "$1"
}
one_value() {
  local v
  v="$(unit_values "$1" "$2")"
  [ -n "$v" ] || fail "$(basename "$1") has no $2="
  [ "$(wc -l <<<"$v")" -eq 1 ] || fail "$(basename "$1") has more than one $2="
  echo "$v"
}
# The ExecStart command with runs of blanks squeezed (the continuation indent).
exec_start() {
  one_value "$1" ExecStart | tr -s ' \t' '  '
}
# Starts an argv in the background (as its own process, like systemd's main process), sets BG.
start_bg() {
  "$@" 2>>"$tmp/bg.log" &
  BG=$!
  bg_pids+=("$BG")
}
# Sends SIGTERM to BG alone (systemd's KillMode=mixed; docker stop), sets RC and STOP_MS.
stop_bg() {
  local t0 t1
  t0=$(date +%s%N)
  kill -TERM "$BG"
  RC=0
  wait "$BG" || RC=$?
  t1=$(date +%s%N)
  STOP_MS=$(((t1 - t0) / 1000000))
}
in_list() {  # in_list CODE "LIST"
  local x
  for x in $2; do [ "$x" = "$1" ] && return 0; done
  return 1
}

# --- systemd units: systemd-analyze verify --------------------------------------------------

sd="$ex/systemd"
units=(leasehold-report.service leasehold-report.timer leasehold-leader.service
       leasehold-invoices.service leasehold-invoices.timer)
for u in "${units[@]}"; do
  [ -f "$sd/$u" ] || fail "missing examples/systemd/$u"
done

verify_dir="$tmp/units"
mkdir -p "$verify_dir"
for u in "${units[@]}"; do
  # Real executables in place of the installed paths: verify checks that ExecStart's program
  # exists. The rest of each line is kept.
  sed -E "s#/usr/bin/leasehold#$leasehold#g; s#/usr/local/bin/[A-Za-z0-9_.-]+#/bin/true#g" \
    "$sd/$u" >"$verify_dir/$u"
done

if command -v systemd-analyze >/dev/null 2>&1; then
  man_args=()
  if command -v man >/dev/null 2>&1 && [ -f "$src/docs/leasehold.1" ]; then
    # Documentation=man:leasehold(1) is checked against the man page in the source tree.
    mkdir -p "$tmp/man/man1"
    cp "$src/docs/leasehold.1" "$tmp/man/man1/"
    export MANPATH="$tmp/man"
  else
    man_args=(--man=no)
    note "no man(1) or no docs/leasehold.1: systemd-analyze verify --man=no"
  fi
  verify() {  # verify UNIT... ; fails on any output line naming one of our units
    local out rc=0 names
    out="$(systemd-analyze verify "${man_args[@]+"${man_args[@]}"}" "${@/#/$verify_dir/}" 2>&1)" || rc=$?
    names="$(printf '%s\n' "${units[@]}" | sed 's/\./\\./g' | paste -sd'|')"
    if grep -E "$names" <<<"$out" >/dev/null || [ "$rc" -ne 0 ]; then
      echo "$out" >&2
      fail "systemd-analyze verify $* (exit $rc)"
    fi
  }
  verify leasehold-report.timer leasehold-report.service
  ok "systemd-analyze verify leasehold-report.timer leasehold-report.service"
  verify leasehold-leader.service
  ok "systemd-analyze verify leasehold-leader.service"
  verify leasehold-invoices.timer leasehold-invoices.service
  ok "systemd-analyze verify leasehold-invoices.timer leasehold-invoices.service"
  # The calendar spec fires every 15 minutes.
  cal="$(one_value "$sd/leasehold-report.timer" OnCalendar)"
  next="$(TZ=UTC systemd-analyze calendar --iterations=3 "$cal" | awk -F': ' '/Iter\. #|Next elapse/ {print $2}' |
          while read -r t; do TZ=UTC date -d "$t" +%s; done)"
  [ "$(awk 'NR > 1 { print $1 - prev } { prev = $1 }' <<<"$next" | sort -u)" = 900 ] ||
    fail "OnCalendar=$cal does not fire every 15 minutes"
  ok "OnCalendar=$cal fires every 900 s"
  # The invoices timer fires every hour, the period of its service's --once-per.
  cal="$(one_value "$sd/leasehold-invoices.timer" OnCalendar)"
  next="$(TZ=UTC systemd-analyze calendar --iterations=3 "$cal" | awk -F': ' '/Iter\. #|Next elapse/ {print $2}' |
          while read -r t; do TZ=UTC date -d "$t" +%s; done)"
  [ "$(awk 'NR > 1 { print $1 - prev } { prev = $1 }' <<<"$next" | sort -u)" = 3600 ] ||
    fail "OnCalendar=$cal does not fire every hour"
  ok "OnCalendar=$cal fires every 3600 s"
else
  note "systemd-analyze not found: falling back to a syntax check of the units (sections, Key=Value lines)"
  for u in "${units[@]}"; do
    awk -v f="$u" '
      /^[ \t]*([#;]|$)/ && !cont { next }
      cont { cont = /\\$/; next }
      /^\[[A-Za-z]+\]$/ { sec = 1; next }
      /^[A-Za-z][A-Za-z0-9]*=/ { if (!sec) { print f ": key before any section: " $0; bad = 1 } cont = /\\$/; next }
      { print f ": not a section or Key=Value line: " $0; bad = 1 }
      END { exit bad }
    ' "$verify_dir/$u" >&2 || fail "syntax of $u"
    ok "syntax of $u (no systemd-analyze)"
  done
fi

# The settings the comments explain are there.
rs="$sd/leasehold-report.service"
rt="$sd/leasehold-report.timer"
ls_="$sd/leasehold-leader.service"
[ "$(one_value "$rs" Type)" = oneshot ] || fail "leasehold-report.service: Type= is not oneshot"
for f in "$rs" "$ls_"; do
  [ "$(one_value "$f" Delegate)" = yes ] || fail "$(basename "$f"): Delegate= is not yes"
  [ "$(one_value "$f" KillMode)" = mixed ] || fail "$(basename "$f"): KillMode= is not mixed"
done
[ "$(one_value "$rt" AccuracySec)" = 1s ] || fail "leasehold-report.timer: AccuracySec= is not 1s"
[ "$(one_value "$rt" Persistent)" = true ] || fail "leasehold-report.timer: Persistent= is not true"
[ "$(one_value "$ls_" Restart)" = always ] || fail "leasehold-leader.service: Restart= is not always"
[ -z "$(unit_values "$rs" SuccessExitStatus)" ] ||
  fail "leasehold-report.service: SuccessExitStatus= would pass a job's own code; --exit-code moves leasehold's"
[[ "$(exec_start "$rs")" == *" --exit-code held=0 "* ]] ||
  fail "leasehold-report.service: ExecStart lacks --exit-code held=0"
# TimeoutStopSec covers the job's grace, the leftovers' grace and a release (2 s).
for f in "$rs" "$ls_"; do
  cmd="$(exec_start "$f")"
  [[ "$cmd" =~ --kill-grace\ ([^ ]+) ]] || fail "$(basename "$f"): ExecStart has no --kill-grace"
  grace_ms="$(to_ms "${BASH_REMATCH[1]}")"
  stop_ms="$(to_ms "$(one_value "$f" TimeoutStopSec)")"
  [ "$stop_ms" -ge $((2 * grace_ms + 2000)) ] ||
    fail "$(basename "$f"): TimeoutStopSec=${stop_ms}ms < 2 x --kill-grace + 2 s"
done
ok "unit settings: oneshot, Delegate=yes, KillMode=mixed, AccuracySec=1s, Persistent=true, Restart=always, held moved to 0, TimeoutStopSec >= 2 x grace + 2 s"
# leasehold-invoices.{service,timer}: the --once-per pair.
is_="$sd/leasehold-invoices.service"
it="$sd/leasehold-invoices.timer"
[ "$(one_value "$is_" Type)" = oneshot ] || fail "leasehold-invoices.service: Type= is not oneshot"
[ "$(one_value "$is_" Delegate)" = yes ] || fail "leasehold-invoices.service: Delegate= is not yes"
[ "$(one_value "$is_" KillMode)" = mixed ] || fail "leasehold-invoices.service: KillMode= is not mixed"
[ -z "$(unit_values "$is_" SuccessExitStatus)" ] ||
  fail "leasehold-invoices.service: SuccessExitStatus= would pass a job's own code"
cmd="$(exec_start "$is_")"
[[ "$cmd" == *" --exit-code held=0 --exit-code done=0 "* ]] ||
  fail "leasehold-invoices.service: ExecStart lacks --exit-code held=0 --exit-code done=0"
[[ "$cmd" == *" --once-per 1h "* ]] || fail "leasehold-invoices.service: ExecStart lacks --once-per 1h"
[[ "$cmd" =~ --kill-grace\ ([^ ]+) ]] || fail "leasehold-invoices.service: ExecStart has no --kill-grace"
[ "$(to_ms "$(one_value "$is_" TimeoutStopSec)")" -ge $((2 * $(to_ms "${BASH_REMATCH[1]}") + 2000)) ] ||
  fail "leasehold-invoices.service: TimeoutStopSec < 2 x --kill-grace + 2 s"
[ -z "$(unit_values "$it" AccuracySec)" ] ||
  fail "leasehold-invoices.timer sets AccuracySec= (its comment explains why the default is kept)"
[ "$(one_value "$it" Persistent)" = true ] || fail "leasehold-invoices.timer: Persistent= is not true"
[ "$(one_value "$it" Unit)" = leasehold-invoices.service ] || fail "leasehold-invoices.timer: Unit= is not the service"
ok "leasehold-invoices: oneshot, Delegate=yes, KillMode=mixed, held and done moved to 0, --once-per 1h, default AccuracySec, Persistent=true"

# --- crontab line ---------------------------------------------------------------------------

cron="$ex/cron/leasehold.cron"
[ -f "$cron" ] || fail "missing examples/cron/leasehold.cron"
[ -z "$(tail -c1 "$cron")" ] || fail "leasehold.cron does not end with a newline (cron drops the last line)"
cron_lines=0
mapfile -t cron_file <"$cron"  # not a `while read` loop: the commands below must not eat it
for line in "${cron_file[@]}"; do
  case "$line" in '' | '#'*) continue ;; esac
  [[ "$line" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] && continue  # SHELL=, PATH=
  read -r m h dom mon dow user cmd <<<"$line"
  [ "$m $h $dom $mon $dow" = "*/15 * * * *" ] || fail "crontab line is not every 15 minutes: $line"
  [[ "$user" =~ ^[a-z_][a-z0-9_-]*$ ]] || fail "crontab line has no user field: $line"
  [[ "$cmd" != *%* ]] || fail "crontab command contains %, which cron turns into a newline"
  [[ "$cmd" == *" --wait 0 "* ]] || fail "crontab line lacks --wait 0"
  [[ "$cmd" == *" --exit-code held=0 "* ]] || fail "crontab line lacks --exit-code held=0"
  [[ "$cmd" != *"||"* ]] || fail "crontab line judges leasehold's codes with a shell wrapper: $cmd"
  cron_lines=$((cron_lines + 1))
  local_cmd="$(localize "$cmd")"
  job="$(grep -o '/usr/local/bin/[A-Za-z0-9_.-]*' <<<"$cmd" | head -1 | sed 's#.*/##')"
  key="$(sed -E 's/.* ([^ ]+) -- .*/\1/' <<<"$cmd")"
  # cron runs the line with SHELL=/bin/sh.
  reset_ran
  rc=0
  sh -c "$local_cmd" || rc=$?
  [ "$rc" -eq 0 ] || fail "crontab line exited $rc on a free key: $local_cmd"
  [ "$(ran_count "$job")" -eq 1 ] || fail "crontab line did not run its job once"
  [ "$(cut -d' ' -f1 "$tmp/ran/$job")" = "$key" ] || fail "the job did not see LEASEHOLD_KEY=$key"
  ok "crontab line runs the job with the lease $key, exit 0"
  # Another host holds the key: leasehold's 75, moved to 0; the job does not run.
  hold_key "$key"
  rc=0
  sh -c "$local_cmd" 2>/dev/null || rc=$?
  [ "$rc" -eq 0 ] || fail "crontab line exited $rc when another holds the key (--exit-code held=0)"
  [ "$(ran_count "$job")" -eq 1 ] || fail "the job ran although another held the key"
  release_holder
  ok "crontab line with the key held elsewhere: exit 0 (leasehold's 75 moved), no run"
  # A job that fails fails the line with its own code, 75 included.
  for mode_code in fail:3 exit75:75 exit80:80; do
    rc=0
    STUB_MODE="${mode_code%:*}" sh -c "$local_cmd" 2>/dev/null || rc=$?
    [ "$rc" -eq "${mode_code#*:}" ] || fail "crontab line exited $rc for a job that exits ${mode_code#*:}"
  done
  ok "crontab line fails with the job's own code (3, 75, 80) when the job fails"
done
[ "$cron_lines" -ge 1 ] || fail "no crontab line in leasehold.cron"

# --- schedule slots: the --once-per crontab line and leasehold-invoices.service --------------

# Waits, if need be, until no instant at which the slot's name changes (a boundary of the
# command's --once-per grid minus the slot tolerance) falls within the next 20 s, so that the
# runs of check_once_per all name one slot.
avoid_slot_edge() {
  local c="$1" p_ms tol_ms now_ms edge_ms until_ms
  [[ "$c" =~ --once-per\ ([^ ]+) ]] || fail "no --once-per in: $c"
  p_ms="$(to_ms "${BASH_REMATCH[1]}")"
  if [[ "$c" =~ --slot-tolerance\ ([^ ]+) ]]; then
    tol_ms="$(to_ms "${BASH_REMATCH[1]}")"
  else
    tol_ms=$((p_ms / 4 < 300000 ? p_ms / 4 : 300000))  # the default: min(period/4, 5m)
  fi
  [[ "$c" != *--slot-offset* && "$c" != *--slot-zone* ]] || fail "avoid_slot_edge: no offsets or zones: $c"
  now_ms=$(($(date +%s%N) / 1000000))
  edge_ms=$(((p_ms - tol_ms) % p_ms))
  until_ms=$(((edge_ms - now_ms % p_ms + p_ms) % p_ms))
  if [ "$until_ms" -lt 20000 ]; then
    note "waiting $((until_ms / 1000 + 1)) s for a slot edge to pass"
    sleep $((until_ms / 1000 + 1))
  fi
}
# check_once_per NAME LOCAL_COMMAND: runs a --once-per command line (after localize; a crontab
# line's command or an ExecStart) on a store of its own, as the hosts of a fleet would in one
# slot: held by another host (leasehold's 75 moved to 0 by --exit-code held=0, nothing
# printed, the job not run), the job exits 80 and then 3 (its own codes, failures: the slot
# stays open), the next run (0, the job runs), and once more (the slot is done: leasehold's 80
# moved to 0 by --exit-code done=0, nothing printed, the job not run).
check_once_per() {
  local name="$1" c="$2" key job rc err saved_store="$store"
  store="sqlite://$tmp/slots-$name.db"
  c="$(sed -E "s#--store [^ ]+#--store $store#" <<<"$c")"
  [[ "$c" == *" --exit-code held=0 --exit-code done=0 "* ]] ||
    fail "$name: lacks --exit-code held=0 --exit-code done=0: $c"
  [[ "$c" != *"||"* ]] || fail "$name: judges leasehold's codes with a shell wrapper: $c"
  key="$(sed -E 's/.* ([^ ]+) -- .*/\1/' <<<"$c")"
  job="$(grep -o "$tmp/bin/[A-Za-z0-9_.-]*" <<<"$c" | head -1 | sed 's#.*/##')"
  avoid_slot_edge "$c"
  reset_ran
  # expect WHAT CODE [STUB_MODE]: runs the line (cron runs it with sh; systemd splits it as sh
  # does here), checks its code.
  expect() {
    rc=0
    STUB_MODE="${3:-exit0}" sh -c "$c" 2>"$tmp/once.err" || rc=$?
    err="$(cat "$tmp/once.err")"
    [ "$rc" -eq "$2" ] || fail "$name, $1: exited $rc, not $2: $err"
  }
  hold_key "$key"
  expect "key held by another host (leasehold's 75, moved)" 0
  release_holder
  [ -z "$err" ] || fail "$name: --quiet --once-per printed when held elsewhere: $err"
  [ "$(ran_count "$job")" -eq 0 ] || fail "$name ran the job while another host held the key"
  expect "the job itself exits 80" 80 exit80
  [ "$(ran_count "$job")" -eq 1 ] || fail "$name: the job exiting 80 did not run once"
  expect "the job fails" 3 fail
  [ "$(ran_count "$job")" -eq 2 ] || fail "$name: the failing job did not run"
  expect "after failures" 0
  [ "$(ran_count "$job")" -eq 3 ] || fail "$name: the slot's failed runs were not run again"
  expect "the slot is done (leasehold's 80, moved)" 0
  [ -z "$err" ] || fail "$name: --quiet --once-per printed on a done slot: $err"
  [ "$(ran_count "$job")" -eq 3 ] || fail "$name ran the job again in a done slot"
  python3 - "$("$leasehold" --store "$store" status --json "$key")" <<'PY' || fail "$name: status --json slot_runs"
import json, sys
runs = json.loads(sys.argv[1])["slot_runs"]
got = [(r["outcome"], r["exit_code"]) for r in runs]
assert got[0] == ("done", 0) and ("failed_retryable", 3) in got, got
assert all(r["slot"] == runs[0]["slot"] for r in runs), runs
PY
  ok "$name: held elsewhere 0, silent; the job's own 80 and 3 fail and leave the slot open; next run 0; then done, 0, silent"
  store="$saved_store"
}

once_cron="$ex/cron/leasehold-once-per.cron"
[ -f "$once_cron" ] || fail "missing examples/cron/leasehold-once-per.cron"
[ -z "$(tail -c1 "$once_cron")" ] || fail "leasehold-once-per.cron does not end with a newline"
once_lines=0
mapfile -t cron_file <"$once_cron"
for line in "${cron_file[@]}"; do
  case "$line" in '' | '#'*) continue ;; esac
  [[ "$line" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] && continue
  read -r m h dom mon dow user cmd <<<"$line"
  [ "$m $h $dom $mon $dow" = "0 * * * *" ] || fail "--once-per crontab line is not hourly: $line"
  [[ "$user" =~ ^[a-z_][a-z0-9_-]*$ ]] || fail "crontab line has no user field: $line"
  [[ "$cmd" != *%* ]] || fail "crontab command contains %, which cron turns into a newline"
  [[ "$cmd" == *" --once-per 1h "* ]] || fail "crontab line lacks --once-per 1h (its schedule is hourly)"
  [[ "$cmd" == *" --quiet "* ]] || fail "crontab line lacks --quiet"
  once_lines=$((once_lines + 1))
  check_once_per "leasehold-once-per.cron" "$(localize "$cmd")"
done
[ "$once_lines" -eq 1 ] || fail "want one crontab line in leasehold-once-per.cron, got $once_lines"

cmd="$(exec_start "$is_")"
[[ "$cmd" != *[\$%\"\']* ]] || fail "ExecStart uses \$, % or quotes; this test splits it like sh"
check_once_per "leasehold-invoices.service" "$(localize "$cmd")"

# --- the units' ExecStart lines, run for real -----------------------------------------------

# leasehold-report.service: a oneshot `leasehold run`.
cmd="$(exec_start "$rs")"
[[ "$cmd" != *[\$%\"\']* ]] || fail "ExecStart uses \$, % or quotes; this test splits it like sh"
local_cmd="$(localize "$cmd")"
read -ra argv <<<"$local_cmd"
job="$(basename "${argv[-1]}")"
key="${argv[-3]}"
reset_ran
rc=0
"${argv[@]}" || rc=$?
[ "$rc" -eq 0 ] || fail "leasehold-report.service ExecStart exited $rc"
[ "$(ran_count "$job")" -eq 1 ] || fail "leasehold-report.service did not run its job"
ok "leasehold-report.service ExecStart runs the job, exit 0"
hold_key "$key"
rc=0
"${argv[@]}" 2>/dev/null || rc=$?
release_holder
[ "$rc" -eq 0 ] || fail "leasehold-report.service ExecStart exited $rc with the key held elsewhere, not 0 (held moved)"
[ "$(ran_count "$job")" -eq 1 ] || fail "leasehold-report.service ran the job although the key was held"
rc=0
STUB_MODE=exit75 "${argv[@]}" 2>/dev/null || rc=$?
[ "$rc" -eq 75 ] || fail "leasehold-report.service: a job exiting 75 gave $rc, not its own 75 (a failure)"
ok "leasehold-report.service with the key held elsewhere: exit 0, a success; the job's own 75: 75, a failure"
# systemctl stop (KillMode=mixed: SIGTERM to leasehold alone): forwarded, job exits, released.
reset_ran
STUB_MODE=serve start_bg "${argv[@]}"
wait_ran "$job"
stop_bg
[ "$RC" -eq 0 ] || fail "leasehold-report.service: stop gave exit $RC (job exits 0 on SIGTERM)"
[ "$STOP_MS" -lt "$(to_ms "$(one_value "$rs" TimeoutStopSec)")" ] || fail "stop took ${STOP_MS} ms"
grep -q "^$key: free" <<<"$("$leasehold" --store "$store" status "$key")" || fail "$key not released after stop"
ok "leasehold-report.service stop: SIGTERM reaches the job, exit 0 in ${STOP_MS} ms, lease released"

# leasehold-leader.service: `leasehold elect --again`.
cmd="$(exec_start "$ls_")"
[[ "$cmd" != *[\$%\"\']* ]] || fail "ExecStart uses \$, % or quotes; this test splits it like sh"
[[ "$cmd" == *" --again "* ]] || fail "leasehold-leader.service ExecStart lacks --again"
local_cmd="$(localize "$cmd")"
read -ra argv <<<"$local_cmd"
job="$(basename "${argv[-1]}")"
election="${argv[-3]}"
success="0 $(one_value "$ls_" SuccessExitStatus)"
timeout_ms="$(to_ms "$(one_value "$ls_" TimeoutStopSec)")"
# Once, without --again and with --wait 0: every other flag must exist, exit 0.
once=()
for a in "${argv[@]}"; do
  if [ "$a" = --again ]; then once+=(--wait 0); else once+=("$a"); fi
done
reset_ran
rc=0
"${once[@]}" 2>"$tmp/once.log" || rc=$?
[ "$rc" -eq 0 ] || cat "$tmp/once.log" >&2
[ "$rc" -eq 0 ] || fail "leasehold-leader.service ExecStart (once, --wait 0) exited $rc"
[ "$(ran_count "$job")" -eq 1 ] || fail "leasehold-leader.service did not run its worker"
ok "leasehold-leader.service ExecStart with --again replaced by --wait 0: worker ran, exit 0"
# As written, with a worker that serves until SIGTERM and then exits 0.
reset_ran
STUB_MODE=serve start_bg "${argv[@]}"
wait_ran "$job"
read -r k term leader_id <"$tmp/ran/$job"
[ "$k" = "election:$election" ] && [ -n "$term" ] && [ -n "$leader_id" ] ||
  fail "the worker saw LEASEHOLD_KEY='$k' LEASEHOLD_TERM='$term' LEASEHOLD_LEADER_ID='$leader_id'"
stop_bg
[ "$RC" -eq 0 ] || fail "leasehold-leader.service: stop gave exit $RC (worker exits 0 on SIGTERM)"
[ "$STOP_MS" -lt "$timeout_ms" ] || fail "stop took ${STOP_MS} ms, TimeoutStopSec is ${timeout_ms} ms"
grep -q "no leader" <<<"$("$leasehold" --store "$store" leader "$election")" || fail "did not resign on stop"
ok "leasehold-leader.service stop: worker (term $term) exits 0, exit 0 in ${STOP_MS} ms, resigned"
# A worker that dies of the SIGTERM: 143, which SuccessExitStatus must list.
reset_ran
STUB_MODE=serve-notrap start_bg "${argv[@]}"
wait_ran "$job"
stop_bg
[ "$RC" -eq 143 ] || fail "leasehold-leader.service: a worker killed by SIGTERM gave exit $RC, not 143"
in_list "$RC" "$success" || fail "leasehold-leader.service: exit $RC on stop is not in SuccessExitStatus"
ok "leasehold-leader.service stop, worker dies of SIGTERM: exit 143, listed in SuccessExitStatus"
# Stopped while another host leads: 130, which SuccessExitStatus must list.
"$leasehold" --store "$store" elect --quiet "$election" -- sleep 60 &
bg_pids+=("$!")
leader_pid=$!
for ((i = 0; i < 200; i++)); do
  grep -q ": leader " <<<"$("$leasehold" --store "$store" leader "$election")" && break
  sleep 0.05
done
reset_ran
start_bg "${argv[@]}"
sleep 0.5
[ "$(ran_count "$job")" -eq 0 ] || fail "leasehold-leader.service ran its worker while another led"
stop_bg
kill -TERM "$leader_pid"
wait "$leader_pid" || true
[ "$RC" -eq 130 ] || fail "leasehold-leader.service stopped while waiting gave exit $RC, not 130"
in_list "$RC" "$success" || fail "leasehold-leader.service: exit $RC on stop is not in SuccessExitStatus"
ok "leasehold-leader.service stopped while another leads: exit 130, listed in SuccessExitStatus"
# --again: a worker that exits is followed by a new term.
reset_ran
STUB_MODE=exit0 start_bg "${argv[@]}"
wait_ran "$job" 2
stop_bg
in_list "$RC" "$success" || fail "leasehold-leader.service --again: exit $RC on stop"
t1="$(sed -n 1p "$tmp/ran/$job" | cut -d' ' -f2)"
t2="$(sed -n 2p "$tmp/ran/$job" | cut -d' ' -f2)"
[ "$t2" -gt "$t1" ] || fail "--again: the second term ($t2) is not above the first ($t1)"
ok "leasehold-leader.service --again campaigns again after the worker exits (term $t1, then $t2)"

# --- container entrypoint -------------------------------------------------------------------

ep="$ex/container/entrypoint.sh"
df="$ex/container/Dockerfile.snippet"
[ -f "$ep" ] && [ -f "$df" ] || fail "missing examples/container/entrypoint.sh or Dockerfile.snippet"
[ "$(head -1 "$ep")" = "#!/bin/sh" ] || fail "entrypoint.sh does not start with #!/bin/sh"
sh -n "$ep" || fail "sh -n entrypoint.sh"
also=""
for shell in dash posh busybox; do
  if command -v "$shell" >/dev/null 2>&1; then
    if [ "$shell" = busybox ]; then busybox sh -n "$ep"; else "$shell" -n "$ep"; fi ||
      fail "$shell -n entrypoint.sh"
    also="$also, $shell -n"
  fi
done
if command -v shellcheck >/dev/null 2>&1; then
  shellcheck -s sh "$ep" || fail "shellcheck -s sh entrypoint.sh"
  also="$also, shellcheck -s sh"
fi
if command -v checkbashisms >/dev/null 2>&1; then
  checkbashisms "$ep" || fail "checkbashisms entrypoint.sh"
  also="$also, checkbashisms"
fi
ok "sh -n entrypoint.sh$also"
grep -Eq '^exec leasehold elect --again ' "$ep" || fail "entrypoint.sh does not exec leasehold elect --again"
grep -q -- '-- "\$@"' "$ep" || fail "entrypoint.sh does not pass \"\$@\" after --"
# Dockerfile.snippet: exec-form ENTRYPOINT naming where entrypoint.sh is copied, STOPSIGNAL.
grep -q '^STOPSIGNAL SIGTERM$' "$df" || fail "Dockerfile.snippet has no STOPSIGNAL SIGTERM"
entry="$(sed -n 's/^ENTRYPOINT //p' "$df")"
python3 -c 'import json, sys; v = json.loads(sys.argv[1]); assert isinstance(v, list) and v' "$entry" ||
  fail "Dockerfile.snippet: ENTRYPOINT is not a JSON list (exec form): $entry"
entry_path="$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])[0])' "$entry")"
grep -Eq "^COPY entrypoint\.sh $entry_path\$" "$df" || fail "Dockerfile.snippet does not COPY entrypoint.sh to $entry_path"
grep -Eq '^CMD \[' "$df" || fail "Dockerfile.snippet: no exec-form CMD"
grace="$(sed -n 's/.*ELECTION_KILL_GRACE:-\([0-9a-z]*\)}.*/\1/p' "$ep")"
[ -n "$grace" ] && [ "$(to_ms "$grace")" -lt 10000 ] ||
  fail "entrypoint.sh's default kill grace '$grace' is not below docker stop's 10 s"
ok "Dockerfile.snippet: exec-form ENTRYPOINT $entry_path, CMD, STOPSIGNAL SIGTERM; default grace $grace < 10 s"

# entrypoint.sh runs leasehold from PATH, as in the image.
ln -s "$leasehold" "$tmp/pathbin/leasehold"
make_stub worker
ep_env=(env "PATH=$tmp/pathbin:/usr/bin:/bin" "LEASEHOLD_STORE=$store" ELECTION_NAME=ep-test)
reset_ran
rc=0
env -u LEASEHOLD_STORE PATH="$tmp/pathbin:/usr/bin:/bin" sh "$ep" "$tmp/bin/worker" 2>"$tmp/ep.err" || rc=$?
[ "$rc" -ne 0 ] && grep -q LEASEHOLD_STORE "$tmp/ep.err" || fail "entrypoint.sh without LEASEHOLD_STORE exited $rc"
rc=0
"${ep_env[@]}" sh "$ep" 2>/dev/null || rc=$?
[ "$rc" -eq 64 ] || fail "entrypoint.sh without a command exited $rc, not 64"
[ "$(ran_count worker)" -eq 0 ] || fail "entrypoint.sh ran the worker without a store or a command"
ok "entrypoint.sh refuses to start without LEASEHOLD_STORE or a command"
reset_ran
STUB_MODE=serve start_bg "${ep_env[@]}" sh "$ep" "$tmp/bin/worker"
wait_ran worker
read -r k term leader_id <"$tmp/ran/worker"
[ "$k" = election:ep-test ] || fail "entrypoint.sh: the worker saw LEASEHOLD_KEY=$k"
[[ "$leader_id" =~ ^[^:]+:[0-9a-f]{8}$ ]] || fail "entrypoint.sh: leader id '$leader_id' is not HOST:xxxxxxxx"
stop_bg
[ "$RC" -eq 0 ] || fail "entrypoint.sh: docker-stop-like SIGTERM gave exit $RC"
grep -q "no leader" <<<"$("$leasehold" --store "$store" leader ep-test)" || fail "entrypoint.sh: did not resign"
ok "entrypoint.sh elects, runs the worker as $leader_id, SIGTERM: exit 0 in ${STOP_MS} ms, resigned"

# As the container's PID 1: a new PID namespace (root only). docker stop's SIGTERM to PID 1.
if [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null 2>&1 &&
   unshare --pid --fork --mount-proc true 2>/dev/null; then
  reset_ran
  STUB_MODE=serve start_bg unshare --pid --fork --mount-proc "${ep_env[@]}" sh "$ep" "$tmp/bin/worker"
  wait_ran worker
  init=""
  for ((i = 0; i < 100; i++)); do
    init="$(ps -o pid= --ppid "$BG" | tr -d ' ' | head -1)"
    [ -n "$init" ] && grep -q "^NSpid:.*[[:space:]]1$" "/proc/$init/status" 2>/dev/null && break
    sleep 0.05
  done
  [ -n "$init" ] || fail "cannot find the PID namespace's init"
  grep -q '^Name:[[:space:]]*leasehold$' "/proc/$init/status" || fail "PID 1 of the namespace is not leasehold (exec)"
  kill -TERM "$init"
  RC=0
  wait "$BG" || RC=$?  # unshare exits with its child's status
  [ "$RC" -eq 0 ] || fail "entrypoint.sh as PID 1: SIGTERM gave exit $RC"
  grep -q "no leader" <<<"$("$leasehold" --store "$store" leader ep-test)" || fail "entrypoint.sh as PID 1: did not resign"
  ok "entrypoint.sh as PID 1 of a PID namespace: leasehold is PID 1, SIGTERM: exit 0, resigned"
else
  note "not root or no unshare: entrypoint.sh as PID 1 not tried"
fi

# Without CAP_SYS_ADMIN and a writable cgroup (an unprivileged container): group containment.
as_nobody=(setpriv --reuid=nobody --regid="$(id -g nobody 2>/dev/null || echo 65534)" --clear-groups
           --inh-caps=-all --bounding-set=-all)
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null 2>&1 && id nobody >/dev/null 2>&1 &&
   "${as_nobody[@]}" test -x "$leasehold"; then
  mkdir -m 0777 "$tmp/nobody"
  install -m 0755 "$ep" "$tmp/entrypoint.sh"  # the source tree may be closed to nobody
  reset_ran
  rc=0
  STUB_MODE=serve "${as_nobody[@]}" \
    env "PATH=$tmp/pathbin:/usr/bin:/bin" "LEASEHOLD_STORE=sqlite://$tmp/nobody/leases.db" \
    ELECTION_NAME=ep-unpriv sh -c 'sh "$1" "$2" & p=$!; i=0; while [ ! -s "$3" ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i + 1)); done; kill -TERM $p; wait $p' \
    sh "$tmp/entrypoint.sh" "$tmp/bin/worker" "$tmp/ran/worker" 2>"$tmp/unpriv.err" || rc=$?
  [ "$rc" -eq 0 ] || { cat "$tmp/unpriv.err" >&2; fail "entrypoint.sh unprivileged exited $rc"; }
  grep -q 'containment: group' "$tmp/unpriv.err" ||
    { cat "$tmp/unpriv.err" >&2; fail "unprivileged: containment is not group"; }
  ok "entrypoint.sh without privileges: --contain=auto falls back to group ($(grep -o 'no cgroup: [^;]*' "$tmp/unpriv.err" | head -1))"
else
  note "not root, no setpriv, or $leasehold closed to nobody: the unprivileged fallback to group containment not tried"
fi

echo "examples_test: all $checks checks passed"
