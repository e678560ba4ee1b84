#!/usr/bin/env bash
# Start the server with the embedded tiny.en model on a fresh machine: creates .venv on
# first use, installs the project, then runs asr-server (flags pass through, e.g. --port).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/asr-server ]]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e .
fi
exec .venv/bin/asr-server "$@"
