#!/usr/bin/env bash
# Builds redis-cell (the Redis module behind CL.THROTTLE, GCRA) from its
# crates.io release, checked against the registry's checksum, into
# target/redis-cell/, and prints the path of the module. Run again, it only
# prints the path. Needs curl and Rust; the crate is 0.2.2, the last one
# published (its Redis module API works with Redis 7).
#
#   redis-server --loadmodule "$(benches/redis/redis-cell.sh)"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION=0.2.2
SHA256=9a7fc93a6257cff317af736529c8462842b9ef7cce23acb20b6b454014ebec3d
DIR="$ROOT/target/redis-cell"
MODULE="$DIR/redis-cell-$VERSION/target/release/libredis_cell.so"

if [[ ! -f "$MODULE" ]]; then
  mkdir -p "$DIR"
  crate="$DIR/redis-cell-$VERSION.crate"
  curl -sSfL -o "$crate" "https://static.crates.io/crates/redis-cell/redis-cell-$VERSION.crate"
  echo "$SHA256  $crate" | sha256sum -c --quiet - >&2
  tar xzf "$crate" -C "$DIR"
  # Its own workspace: it sits inside this repository's target/.
  printf '\n[workspace]\n' >>"$DIR/redis-cell-$VERSION/Cargo.toml"
  (cd "$DIR/redis-cell-$VERSION" && cargo build --release --quiet 2>/dev/null) ||
    { echo "redis-cell.sh: building redis-cell $VERSION failed (cargo build --release in $DIR/redis-cell-$VERSION)" >&2; exit 1; }
fi
echo "$MODULE"
