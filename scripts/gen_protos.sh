#!/usr/bin/env bash
# Regenerates asr_api/ (the checked-in protobuf and gRPC code) from protos/.
# With --check, generates into a temporary folder and fails if the checked-in
# code differs, so CI catches a proto edit that was not regenerated.
set -euo pipefail
cd "$(dirname "$0")/.."
# grpcio-tools is among the test extras: the project's .venv has it (scripts/test.sh)
if [[ -x .venv/bin/python ]]; then default_py=.venv/bin/python; else default_py=python3; fi
PY=${PYTHON:-$default_py}
out=.
if [[ "${1:-}" == "--check" ]]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out/asr_api/v1"
"$PY" -m grpc_tools.protoc -Iprotos \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  protos/asr_api/v1/asr.proto
for init in "$out/asr_api/__init__.py" "$out/asr_api/v1/__init__.py"; do
  echo '"""Generated from protos/ by scripts/gen_protos.sh; do not edit."""' > "$init"
done
# the messages' types (asr_pb2.pyi) reach the users' type checkers (PEP 561)
: > "$out/asr_api/py.typed"
if [[ "${1:-}" == "--check" ]]; then
  if ! diff -r -x __pycache__ "$out/asr_api" asr_api; then
    echo "asr_api/ is stale: run scripts/gen_protos.sh and commit the result" >&2
    exit 1
  fi
  echo "generated protobuf code is up to date"
fi
