#!/usr/bin/env bash
# A bounded fuzz run of every cargo-fuzz target (fuzz/): the
# decoders, the rules file reader and the admin API's rule bodies, each
# for FUZZ_SECONDS (default 20) from its committed seed corpus, into a
# scratch copy so CI leaves no new inputs behind. Any crash or broken
# invariant fails the run (its input lands in fuzz/artifacts/).
# Needs cargo-fuzz: installed here when missing. Run by .ci/run after the
# tests. Built without a sanitizer (`-s none`): the targets check panics and
# the invariants of fuzz/src/lib.rs, and the code under test (decoders,
# rules parser) has no unsafe of its own (the server's two unsafe calls, a
# mimalloc option set at start and a prefetch instruction in the store, are
# not on that path), so AddressSanitizer
# would only slow the build and the runs.
# The four targets are built once, up front, in one cargo invocation.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-20}"

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install --locked cargo-fuzz
fi

# RUSTC_BOOTSTRAP lets the stable toolchain accept the flags cargo-fuzz passes.
export RUSTC_BOOTSTRAP=1
echo "== fuzz build (all targets)"
cargo fuzz build -s none

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for target in decode_request decode_response parse_rules put_rule; do
  mkdir -p "$scratch/$target"
  cp -r "fuzz/corpus/$target/." "$scratch/$target/"
  dict=()
  case $target in decode_*) dict=(-dict=fuzz/decode.dict) ;; esac
  echo "== fuzz $target (${seconds}s)"
  # libFuzzer reports every new input; CI shows the summary, or on a
  # failure the end of the log (the crash, its input and the artifact).
  log="$scratch/$target.log"
  if ! cargo fuzz run -s none "$target" "$scratch/$target" -- \
    "${dict[@]}" -max_total_time="$seconds" -rss_limit_mb=2048 >"$log" 2>&1; then
    tail -n 80 "$log"
    echo "fuzz-smoke: $target failed" >&2
    exit 1
  fi
  grep -E '^Done [0-9]+ runs' "$log" || tail -n 5 "$log"
done
