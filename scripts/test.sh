#!/usr/bin/env bash
# The whole test suite: unit, integration (real servers on 127.0.0.1:0),
# doc examples, and the loom models. This is the README's test command and
# what CI runs after fmt and clippy.
set -euo pipefail
cd "$(dirname "$0")/.."

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast --lib --bins --tests
fi
cargo test --workspace --doc
./scripts/loom.sh
