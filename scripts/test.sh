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
# The browser test drives Debian's Chromium through Playwright (never Playwright's own
# browser download). Another apt may be running on the machine: wait for its lock.
if [[ ! -x /usr/bin/chromium ]]; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "installing Debian's chromium for the browser test..." >&2
    apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=600 "$@" >/dev/null; }
    apt_get install -y --no-install-recommends chromium \
      || { apt_get update && apt_get install -y --no-install-recommends chromium; }
  else
    echo "note: no /usr/bin/chromium, so the browser test is skipped (apt-get install chromium)" >&2
  fi
fi
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
