#!/usr/bin/env bash
# Lints the code under the loom cfg, then runs the loom models against
# the real code: the store and replication models (loom-tests/), then the
# client's pending-request map with its calls, writer and driver
# (client/src/connection/loom_models.rs, unit tests of the client crate
# because they need its private types).
# A separate target dir keeps the cfg'd build from invalidating the normal one.
#
# Arguments go to the loom-tests run (e.g. a test name filter). The client
# run always takes all its models and nothing else: under the cfg every
# other client test would meet loom's types outside a model.
# LOOM_MAX_PREEMPTIONS, when set, applies to both runs; by default the
# store models take 2 and the client's 3 (they are small: a few seconds at
# 2, about a minute at 3).
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:-} --cfg tollgate_loom"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom"
# Lint what only exists under the cfg (the loom shims and models) too:
# the normal clippy run never sees it.
cargo clippy --profile loom -p tollgate -p tollgate-client -p loom-tests --lib --tests \
    -- -D warnings
LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}" \
    cargo test --profile loom -p loom-tests --test "*" "$@"
LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
    cargo test --profile loom -p tollgate-client --lib connection::loom_models
