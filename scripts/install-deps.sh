#!/usr/bin/env bash
# Installs the Debian 12 packages leasehold needs to build and test. Idempotent and quick when
# everything is present. Runs apt-get as root, or through sudo when not root.
set -euo pipefail

packages=(
  g++ clang-14 cmake make pkg-config ccache python3
  libfmt-dev libcli11-dev libsqlite3-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev
  libhiredis-dev redis-server redis-tools
  postgresql pgbouncer libpq-dev
  libcpp-httplib-dev prometheus
  etcd-server etcd-client libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  zookeeper default-jre-headless libzookeeper-mt-dev
  openssl curl
)

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
