#!/usr/bin/env bash
# Builds the Debian package from the build tree (cpack -G DEB), checks its control data and
# contents, unpacks it into a throwaway root (dpkg -x) and uses it from there: runs
# `leasehold --version` and a `leasehold run`, renders the man page, and compiles and runs the
# README's example against the unpacked headers and library, with pkg-config and with
# find_package. Usage: package_test.sh BUILD_DIR SOURCE_DIR README_EXAMPLE_CC
set -euo pipefail
build_dir="$1"
source_dir="$2"
example="$3"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "package_test: $*" >&2; exit 1; }

(cd "$tmp" && cpack --config "$build_dir/CPackConfig.cmake" -G DEB -B "$tmp/out" >"$tmp/cpack.log" 2>&1) \
  || { cat "$tmp/cpack.log" >&2; fail "cpack failed"; }
deb="$(ls "$tmp"/out/leasehold_*_amd64.deb 2>/dev/null | head -1)"
[ -n "$deb" ] || fail "no leasehold_<version>_amd64.deb in $tmp/out: $(ls "$tmp/out")"
echo "package_test: built $(basename "$deb") ($(du -h "$deb" | cut -f1))"

# Control data: name, version, and Depends: written by dpkg-shlibdeps from what is linked.
info="$(dpkg-deb --info "$deb")"
depends="$(dpkg-deb --field "$deb" Depends)"
echo "package_test: Depends: $depends"
[ "$(dpkg-deb --field "$deb" Package)" = leasehold ] || fail "Package: is not leasehold"
for lib in libc6 libstdc++6 libsqlite3 libhiredis libssl3 libpq5 libgrpc++ libprotobuf libzookeeper-mt libfmt; do
  grep -q "$lib" <<<"$depends" || fail "Depends: lacks $lib (dpkg-shlibdeps did not run?)"
done
grep -q "libleasehold" <<<"$depends" && fail "Depends: names the package's own library"
grep -Eq "[[:space:]]shlibs[[:space:]]*$" <<<"$info" || fail "no shlibs control file for libleasehold.so.0"
# postinst makes the host-wide store's directory, sticky and writable by every user.
postinst="$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./postinst)" || fail "no postinst"
grep -q "install -d -m 1777 /var/lib/leasehold" <<<"$postinst" \
  || fail "postinst does not make /var/lib/leasehold: $postinst"

# Contents: every piece the package promises.
contents="$(dpkg-deb --contents "$deb" | awk '{print $6}')"
for want in ./usr/bin/leasehold ./usr/lib/libleasehold.so.0 ./usr/include/leasehold/leasehold.h \
            ./usr/lib/cmake/leasehold/leaseholdConfig.cmake ./usr/lib/pkgconfig/leasehold.pc \
            ./usr/share/man/man1/leasehold.1 ./usr/share/bash-completion/completions/leasehold \
            ./usr/share/zsh/vendor-completions/_leasehold \
            ./usr/share/fish/vendor_completions.d/leasehold.fish \
            ./usr/share/doc/leasehold/examples/systemd/leasehold-leader.service; do
  grep -q "^${want}" <<<"$contents" || fail "the package lacks $want"
done

# Unpacked into a throwaway root, used from there.
root="$tmp/root"
dpkg -x "$deb" "$root"
export LD_LIBRARY_PATH="$root/usr/lib"
version="$("$root/usr/bin/leasehold" --version)"
echo "package_test: $version"
grep -Eq '^leasehold [0-9]+\.[0-9]+\.[0-9]+ \(commit [0-9a-f]{7,}(-dirty)?; stores: sqlite' <<<"$version" \
  || fail "unexpected --version: $version"
# ldd's output is captured before it is matched: `ldd | grep -q` under pipefail fails when grep
# exits at the match and ldd, still writing, dies of SIGPIPE (CI saw exactly that).
libs="$(ldd "$root/usr/bin/leasehold")"
grep -qF "$root/usr/lib/libleasehold.so.0" <<<"$libs" \
  || fail "the command does not use the packaged libleasehold.so.0: $libs"
HOME="$tmp" LEASEHOLD_STATE_DIR="$tmp/state" "$root/usr/bin/leasehold" run --quiet job -- sh -c \
  '[ -n "$LEASEHOLD_FENCING_TOKEN" ]' || fail "leasehold run from the package failed"
man -l "$root/usr/share/man/man1/leasehold.1"* >/dev/null 2>"$tmp/man.err" || fail "man -l failed"
[ ! -s "$tmp/man.err" ] || { cat "$tmp/man.err" >&2; fail "man -l warned"; }

# The README example against the packaged headers and library: pkg-config ...
PKG_CONFIG_PATH="$root/usr/lib/pkgconfig" g++ -std=c++20 -o "$tmp/pc_example" "$example" \
  $(PKG_CONFIG_PATH="$root/usr/lib/pkgconfig" pkg-config --cflags --libs leasehold)
LEASEHOLD_STORE="sqlite://$tmp/pc.db" "$tmp/pc_example" >/dev/null || fail "pkg-config example failed"
# ... and find_package (the packaged CMake package, relocated under the root).
mkdir -p "$tmp/consumer"
cp "$example" "$tmp/consumer/main.cc"
cat >"$tmp/consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(consumer LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(leasehold REQUIRED)
add_executable(consumer main.cc)
target_link_libraries(consumer PRIVATE leasehold::leasehold)
CMAKE
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$root/usr" >/dev/null
cmake --build "$tmp/consumer/build" >/dev/null
LEASEHOLD_STORE="sqlite://$tmp/cm.db" "$tmp/consumer/build/consumer" >/dev/null \
  || fail "find_package example failed"
echo "package_test: the package installs the command, library, headers, CMake package," \
     "pkg-config file, man page and completion, and all of them work"
