#!/usr/bin/env bash
# By hand, as root: checks the quick start and the Debian package on a fresh Debian 12 made
# with debootstrap (a chroot, not this machine's own packages).
#
#   scripts/fresh-machine-check.sh [CHROOT_DIR] [DEB]
#
#   1. debootstrap --variant=minbase bookworm into CHROOT_DIR (default /var/tmp/fresh), unless
#      it is already there;
#   2. copies this checkout (git archive HEAD) into it and times the README's first command,
#      scripts/demo.sh, inside it;
#   3. installs DEB (default: the newest build/leasehold_*_amd64.deb; make it with
#      `cpack -G DEB` in build/) with `apt install ./…deb` inside a second, untouched copy of
#      the fresh system, shows `man leasehold`, runs `leasehold run`, then `apt remove`s it and
#      checks that none of the files `dpkg -L leasehold` listed is left.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
base="${1:-/var/tmp/fresh}"
deb="${2:-$(ls -t "$root"/build/leasehold_*_amd64.deb "$root"/build/packages/leasehold_*_amd64.deb 2>/dev/null | head -1 || true)}"
[ "$(id -u)" -eq 0 ] || { echo "run as root (debootstrap, chroot)" >&2; exit 77; }
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null

if [ ! -x "$base/bin/sh" ]; then
  debootstrap --variant=minbase bookworm "$base" http://deb.debian.org/debian >/dev/null
fi
fresh() {  # a throwaway copy of the fresh system, with /proc, /dev and DNS
  local dir="$1"
  rm -rf "$dir"
  cp -a "$base" "$dir"
  cp /etc/resolv.conf "$dir/etc/resolv.conf"
  mount -t proc proc "$dir/proc"
  mount --bind /dev "$dir/dev"
}
release() { umount "$1/dev" "$1/proc" 2>/dev/null || true; }

echo "== quick start: scripts/demo.sh on a fresh system"
qs="$base-quickstart"
fresh "$qs"
trap 'release "$qs"; release "${pk:-/nonexistent}"' EXIT
mkdir -p "$qs/src/leasehold"
git -C "$root" archive HEAD | tar -x -C "$qs/src/leasehold"
start=$(date +%s)
chroot "$qs" /bin/sh -c 'cd /src/leasehold && apt-get update -qq && scripts/demo.sh'
echo "== quick start took $(( $(date +%s) - start )) s (apt-get update, packages, build, demo)"
release "$qs"

if [ -z "$deb" ] || [ ! -f "$deb" ]; then
  echo "no .deb given and none in build/: run 'cpack -G DEB' in build/ first" >&2
  exit 1
fi
echo "== package: apt install ./$(basename "$deb") on a fresh system"
pk="$base-package"
fresh "$pk"
cp "$deb" "$pk/tmp/"
chroot "$pk" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq man-db ./tmp/$(basename "$deb") >/dev/null"
chroot "$pk" dpkg -L leasehold > "$pk.files"
echo "dpkg -L leasehold: $(wc -l < "$pk.files") paths"
chroot "$pk" /bin/sh -c 'MANWIDTH=80 man leasehold | head -20'
chroot "$pk" /bin/sh -c 'leasehold --version && leasehold run demo -- sh -c "echo token \$LEASEHOLD_FENCING_TOKEN"'
chroot "$pk" /bin/sh -c 'DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq leasehold >/dev/null'
left=0
while read -r path; do
  if [ -f "$pk$path" ] || [ -L "$pk$path" ]; then
    echo "left behind: $path"
    left=$((left + 1))
  fi
done < "$pk.files"
echo "== after apt remove: $left of the package's files left behind"
[ "$left" -eq 0 ]
