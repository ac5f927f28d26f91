#!/usr/bin/env bash
# Runs the loom models (loom-tests/) against the real store types.
# A separate target dir keeps the cfg'd build from invalidating the normal one.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:-} --cfg tollgate_loom"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom"
exec cargo test --profile loom -p loom-tests --test "*" "$@"
