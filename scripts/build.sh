#!/usr/bin/env bash
# Configures and builds leasehold in build/ (or $BUILD_DIR), with any extra CMake arguments;
# $TARGET, if set, builds only that target (the quick start builds only `leasehold_cli`).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"
jobs="${JOBS:-$(nproc)}"
cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" "$@" >/dev/null
cmake --build "$build_dir" -j "$jobs" ${TARGET:+--target "$TARGET"}
