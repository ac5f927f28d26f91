#!/usr/bin/env bash
# The whole test suite: doc examples, the loom models, then every unit and
# integration test (real servers on 127.0.0.1:0, real etcd members for
# cluster mode). This is the README's test command and what CI runs after
# fmt and clippy. Cluster mode (feature `cluster`) is built and tested too:
# scripts/deps.sh installs protoc and etcd first when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/deps.sh
cargo test --workspace --all-features --doc
./scripts/loom.sh
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --no-fail-fast
else
  cargo test --workspace --all-features --no-fail-fast --lib --bins --tests
fi
