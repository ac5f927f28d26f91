#!/usr/bin/env bash
# The whole test suite: doc examples, the loom models, then every unit and
# integration test (real servers on 127.0.0.1:0). This is the README's test
# command and what CI runs after fmt and clippy.
set -euo pipefail
cd "$(dirname "$0")/.."

# Programs the tests start. A missing one fails its test rather than being
# skipped, so install it here (Debian's packages; CI runs as root).
if ! command -v redis-server >/dev/null 2>&1; then
  apt-get update
  apt-get install -y redis-server
fi

cargo test --workspace --doc
./scripts/loom.sh
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast --lib --bins --tests
fi
