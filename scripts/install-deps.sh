#!/usr/bin/env bash
# Installs the Debian 12 packages leasehold needs. Idempotent and quick when everything is
# present. Runs apt-get as root, or through sudo when not root.
#
#   scripts/install-deps.sh           what building and testing need (the test command's set)
#   scripts/install-deps.sh --build   only what building the library and the `leasehold`
#                                     command needs: a compiler, CMake and the store client
#                                     libraries' -dev packages (the quick start's set: no
#                                     servers, no Java runtime, no Prometheus, no clang)
set -euo pipefail

build_packages=(
  g++ cmake make pkg-config ccache
  libfmt-dev libcli11-dev libsqlite3-dev nlohmann-json3-dev libcpp-httplib-dev
  libhiredis-dev libssl-dev libpq-dev libzookeeper-mt-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
)
# The stores the tests start (redis-server, PostgreSQL, PgBouncer, etcd, ZooKeeper and its
# JRE), the test frameworks, clang for the thread-safety build and libFuzzer for the fuzz targets
# built in it (tests/fuzz/, scripts/fuzz.sh), clang-format for the format check
# (scripts/check-format.sh), promtool for the metrics test,
# and what the package test uses (dpkg-shlibdeps from dpkg-dev, groff and man-db for the man
# page; zsh and fish for the syntax check of their completions), iproute2 and nftables for the partition tests' network namespaces, and spin for the
# model check (tests/model/; its verifier is compiled with gcc), and Patroni for the PostgreSQL
# failover chaos runs (tests/chaos: --store postgres-ha).
test_packages=(
  clang-14 clang-format-14 libfuzzer-14-dev python3 libgtest-dev libgmock-dev libbenchmark-dev
  redis-server redis-tools postgresql pgbouncer prometheus
  etcd-server etcd-client zookeeper default-jre-headless iproute2 nftables
  openssl curl dpkg-dev groff-base man-db zsh fish faketime spin gcc
  patroni python3-etcd python3-psycopg2
)

case "${1:-}" in
  --build) packages=("${build_packages[@]}") ;;
  "") packages=("${build_packages[@]}" "${test_packages[@]}") ;;
  *) echo "usage: $0 [--build]" >&2; exit 64 ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
