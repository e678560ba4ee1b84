#!/usr/bin/env bash
# Start the server with the embedded tiny.en model on a fresh machine: creates .venv on
# first use, installs the project and the semantic end-of-turn model, then runs asr-server
# (flags pass through, e.g. --port).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# the server, and what the README's next commands use: the browser bridge (asr-bridge) and
# the word error rate that `asr-client load` reports (a .venv from before they were
# installed here gets them too)
if [[ ! -x .venv/bin/asr-server ]] || ! .venv/bin/python -c "import jiwer, starlette" 2>/dev/null; then
  [[ -x .venv/bin/python ]] || "$PY" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e '.[bridge,eval]'
fi
# SEMANTIC endpointing's model (from the pinned pipecat-ai wheel), tried once per .venv,
# older ones included; without it the server still runs, refusing SEMANTIC streams with
# the command that installs it
if [[ ! -e .venv/.turn-model-tried ]]; then
  .venv/bin/asr-server turn-model ||
    echo "serve.sh: no turn model; SEMANTIC endpointing stays off until" \
      "'.venv/bin/asr-server turn-model' succeeds" >&2
  touch .venv/.turn-model-tried
fi
exec .venv/bin/asr-server "$@"
