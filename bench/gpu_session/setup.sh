# Device call 1: install the project's Python 3.12 wheels under /root/site, link CUDA 13's
# cuBLAS as the libcublas.so.12 CTranslate2 4.8.5 opens, check imports and the GPU.
set -u
date; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv; nproc; free -g | head -2; python3 --version
mkdir -p /root/site /root/culib /root/stash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .devpack/c1/whl/*.whl || { echo PIP-FAILED; exit 1; }
mkdir -p /root/site/av && : > /root/site/av/__init__.py   # faster-whisper imports PyAV; nothing here decodes containers
CUB=$(find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null | grep -v Lt | head -1); echo "cublas: $CUB"
ln -sf "$CUB" /root/culib/libcublas.so.12
cat > /root/env.sh <<EOT
export PYTHONPATH=/root/site:$PWD LD_LIBRARY_PATH=/root/culib:$(dirname "$CUB"):\${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
EOT
cat /root/env.sh; . /root/env.sh
python3 -c "import ctranslate2, grpc, google.protobuf, pydantic, soxr, webrtcvad, soundfile, faster_whisper, jiwer, onnxruntime, numpy; print('ct2', ctranslate2.__version__, 'cuda devices', ctranslate2.get_cuda_device_count(), 'grpc', grpc.__version__, 'ort', onnxruntime.__version__, 'numpy', numpy.__version__)"
python3 -c "import asr_server.app, asr_client.load.runner, whisper_normalizer.english; print('imports ok')"
date
