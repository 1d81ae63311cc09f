#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds a consumer against it twice: with
# find_package(leasehold) and with pkg-config. Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build_dir="$1"
source_dir="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build_dir" --prefix "$tmp/prefix" >/dev/null
cmake -S "$source_dir/tests/install/consumer" -B "$tmp/consumer" \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/consumer" >/dev/null
"$tmp/consumer/consumer"
libdir="$(find "$tmp/prefix" -name leasehold.pc -printf '%h\n' | head -1)"
PKG_CONFIG_PATH="$libdir" g++ -std=c++20 -o "$tmp/pc_consumer" "$source_dir/tests/install/consumer/main.cc" \
  $(PKG_CONFIG_PATH="$libdir" pkg-config --cflags --libs --static leasehold)
# A shared libleasehold is found at run time through the prefix's lib directory.
LD_LIBRARY_PATH="$(dirname "$libdir")" "$tmp/pc_consumer"
test -x "$tmp/prefix/bin/leasehold" || { echo "leasehold command not installed" >&2; exit 1; }
echo "install_test: find_package and pkg-config consumers both work"
