#!/usr/bin/env bash
# The one test command (README, .ci/run): builds .venv from a clean clone, installs the
# project with its test extras, checks lint and generated code, runs the whole suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -k grpc -x
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
PYTHON=.venv/bin/python scripts/gen_protos.sh --check
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
