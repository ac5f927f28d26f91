#!/usr/bin/env bash
# Installs the programs the build and the tests need beyond Rust, when they
# are missing: `protoc` (etcd-client's build, feature `cluster`) and `etcd`
# (cluster tests run real etcd members on loopback), `redis-server` (the
# loadgen's comparison tests), `chromium` (the status page is checked in a
# headless browser), `nats-server` (decision events are published to a
# real one), `promtool` (checks the alert rules in deploy/prometheus).
# Debian's packages: protobuf-compiler, etcd-server (3.4), redis-server,
# chromium, nats-server, prometheus. Safe to run again: it installs nothing
# that is already there. A missing program fails its tests, never skips them.
set -euo pipefail

missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v nats-server >/dev/null 2>&1 || missing+=(nats-server)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

echo "installing ${missing[*]}"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "no apt-get: install ${missing[*]} (protoc and etcd 3.4+) by hand" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update
"${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
