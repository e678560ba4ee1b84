"""The server never goes online: what the libraries it loads would send, they are told not
to. onnxruntime (Silero VAD, the turn model) opened a TLS connection to Microsoft's
telemetry host about 10 s after its first session; checked by hand in a network
namespace whose only DNS server logs the names asked (0 queries with asr_server's
default, 4 for mobile.events.data.microsoft.com with ORT_DISABLE_TELEMETRY=0)."""

from __future__ import annotations

import os
import subprocess
import sys


def _in_a_fresh_process(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_onnxruntime_telemetry_is_off_before_onnxruntime_loads() -> None:
    # the modules that load onnxruntime are asr_server's: it is set by then
    code = (
        "import sys, os; from asr_server.vad.silero import load_silero; load_silero(); "
        "print(os.environ['ORT_DISABLE_TELEMETRY'], 'onnxruntime' in sys.modules)"
    )
    assert _in_a_fresh_process(code) == "1 True"


def test_an_operator_may_still_choose_otherwise() -> None:
    code = "import os, asr_server; print(os.environ['ORT_DISABLE_TELEMETRY'])"
    assert _in_a_fresh_process(code, ORT_DISABLE_TELEMETRY="0") == "0"
