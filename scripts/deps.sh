#!/usr/bin/env bash
# Installs the programs the build and the tests need beyond Rust, when they
# are missing: `protoc` and the google/protobuf includes (etcd-client's
# build, feature `cluster`; proto/, feature `envoy`) and `etcd` (cluster
# tests run real etcd members on loopback), `redis-server`, `redis-cli` and
# `redis-benchmark` (the loadgen's comparison tests, the RESP front end's
# tests), `chromium` (the status page is checked in a headless browser),
# `nats-server` (decision events are published to a real one), `promtool`
# (checks the alert rules in deploy/prometheus), openssl, curl and taskset
# (benches/feature-cost.sh). Debian's packages:
# protobuf-compiler, libprotobuf-dev, etcd-server (3.4), redis-server,
# redis-tools, python3-venv, chromium, nats-server, prometheus. Then the
# Python clients of the front end tests (tests/frontends/requirements.txt:
# redis-py, grpcio, grpcio-tools) into the virtualenv target/py. Safe to run
# again: it installs nothing that is already there. A missing program fails
# its tests, never skips them.
set -euo pipefail
cd "$(dirname "$0")/.."

install_packages() {
  echo "installing $*"
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "no apt-get: install $* (protoc and etcd 3.4+) by hand" >&2
    exit 1
  fi
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update
  "${sudo[@]}" apt-get install -y --no-install-recommends "$@"
}

# The front end tests' Python clients, pinned, in target/py (the tests run
# target/py/bin/python3). Reinstalled only when the requirements change.
python_clients() {
  local venv=target/py req=tests/frontends/requirements.txt
  if [ -f "$venv/.installed" ] && cmp -s "$req" "$venv/.installed"; then
    return 0
  fi
  echo "installing the Python clients of $req into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check -r "$req"
  cp "$req" "$venv/.installed"
}

missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/wrappers.proto ] || missing+=(libprotobuf-dev)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || missing+=(redis-tools)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v nats-server >/dev/null 2>&1 || missing+=(nats-server)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# benches/feature-cost.sh (and its smoke test): test certificates, the
# redis-cell crate's download, pinning to a core.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v taskset >/dev/null 2>&1 || missing+=(util-linux)
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  install_packages "${missing[@]}"
fi
python_clients

