#!/usr/bin/env bash
# Runs a Helm chart test with the end-to-end venv's python, which has helm,
# PyYAML and kubernetes-validate (tests/e2e/requirements.txt).
#   usage: with_e2e_python.sh TEST.py LAZYKV_BINARY
# Exits 77 (skipped) without LAZYKV_E2E_PYTHON (set by scripts/test.sh).
set -uo pipefail
py=${LAZYKV_E2E_PYTHON:-}
if [ -z "$py" ]; then
  echo "skipped: LAZYKV_E2E_PYTHON (the end-to-end venv's python) is not set"
  exit 77
fi
if ! "$py" -c 'import kubernetes_validate, yaml' || [ ! -x "$(dirname "$py")/helm" ]; then
  echo "FAIL: $py lacks helm or kubernetes-validate: run LAZYKV_SETUP_E2E=1 scripts/setup.sh" >&2
  exit 1
fi
exec "$py" "$@"
