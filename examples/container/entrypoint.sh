#!/bin/sh
# entrypoint.sh: run the container's command only while this replica is the elected leader.
#
# Every replica starts this entrypoint. Each campaigns in the election $ELECTION_NAME in the
# shared store $LEASEHOLD_STORE; the leader runs the command (the image's CMD or the
# arguments to `docker run IMAGE ...`), the others wait their turn. `exec` makes leasehold the
# container's main process (PID 1), so `docker stop`'s SIGTERM reaches leasehold, which
# forwards it to the command, waits for it and releases the lease, and a successor is elected
# at once.
#
# Environment:
#   LEASEHOLD_STORE      required, e.g. redis://leases:6379/0. leasehold reads it itself. There
#                        is no default on purpose: leasehold's own default, an SQLite file in the
#                        container, would make every replica the leader of its own file.
#   ELECTION_NAME        the election (lease key election:NAME). Default: app-leader.
#   ELECTION_TTL         how long the store keeps leadership without renewal; a dead
#                        leader is replaced within this time. Default: 10s.
#   ELECTION_KILL_GRACE  SIGTERM to SIGKILL when leadership is lost or at risk; the command
#                        should exit within this time of a SIGTERM. It must stay below
#                        `docker stop`'s timeout (10 s unless --stop-timeout or compose's
#                        stop_grace_period says otherwise), with room for the release: see
#                        Dockerfile.snippet. Default: 5s.
#   ELECTION_ID          this candidate's id, shown by `leasehold leader`. Default: the
#                        container's hostname plus a random suffix. leasehold's own default is
#                        hostname:pid, and the pid is always 1 here, so two replicas with the
#                        host's hostname (--uts=host, --network=host) would look alike.
#
# --again: campaign again after the command exits or leadership is lost, so a replica never
# drops out of the election. -v: a container's log is where its lifecycle belongs (elected,
# containment, the command's start and exit); the first lines tell you which containment is in
# force (`docker logs`); in a container without CAP_SYS_ADMIN and without a writable cgroup
# it is "group" (see Dockerfile.snippet).
set -eu

: "${LEASEHOLD_STORE:?set LEASEHOLD_STORE to the store all replicas share, e.g. redis://leases:6379/0}"
ELECTION_NAME="${ELECTION_NAME:-app-leader}"
ELECTION_TTL="${ELECTION_TTL:-10s}"
ELECTION_KILL_GRACE="${ELECTION_KILL_GRACE:-5s}"
if [ -z "${ELECTION_ID:-}" ]; then
  read -r host < /proc/sys/kernel/hostname
  read -r uuid < /proc/sys/kernel/random/uuid
  ELECTION_ID="$host:${uuid%%-*}"
fi
export LEASEHOLD_STORE

if [ "$#" -eq 0 ]; then
  echo "entrypoint.sh: no command given (set CMD in the image, or pass it to docker run)" >&2
  exit 64
fi

exec leasehold elect --again -v --id "$ELECTION_ID" --ttl "$ELECTION_TTL" \
  --kill-grace "$ELECTION_KILL_GRACE" "$ELECTION_NAME" -- "$@"
