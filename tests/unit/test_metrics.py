"""asr_server.metrics: the labelled counters' series exist at 0 from the start, for every
label value the server uses."""

from __future__ import annotations

import re

from prometheus_client import generate_latest

from asr_server.metrics import (
    AUTH_FAILURE_REASONS,
    REFUSAL_REASONS,
    TIMEOUT_KINDS,
    Metrics,
)
from tests.helpers import ROOT


def test_every_error_refusal_and_timeout_series_is_there_at_zero() -> None:
    text = generate_latest(Metrics().registry).decode()
    for series in (
        'asr_streams_total{code="OK"} 0.0',
        'asr_streams_total{code="CANCELLED"} 0.0',
        'asr_stream_errors_total{code="UNAVAILABLE"} 0.0',
        'asr_stream_errors_total{code="CANCELLED"} 0.0',
        'asr_refused_streams_total{reason="draining"} 0.0',
        'asr_stream_timeouts_total{kind="config"} 0.0',
        'asr_auth_failures_total{reason="missing_token"} 0.0',
    ):
        assert series in text, series
    # a reload counter only for the files a server watches
    assert "asr_credential_reloads_total{" not in text
    metrics = Metrics()
    metrics.watch_reloads("tokens")
    text = generate_latest(metrics.registry).decode()
    assert 'asr_credential_reloads_total{file="tokens",outcome="failed"} 0.0' in text


def source() -> str:
    """The server's code, but for the list of values under test."""
    files = sorted((ROOT / "asr_server").rglob("*.py"))
    return "\n".join(p.read_text() for p in files if p.name != "metrics.py")


def test_the_label_values_the_code_uses_are_the_ones_made_at_zero() -> None:
    """A reason added in the code and not here would appear only at its first event."""
    code = source()
    refusals = re.findall(r'refused_streams\.labels\("(\w+)"\)', code)
    refusals += re.findall(r'_refuse\(\s*"(\w+)"', code)
    timeouts = re.findall(r'_timed_out\(\s*"(\w+)"', code)
    auth = re.findall(r'reason = "(\w+)"', code) + re.findall(r'"(\w+_token)"', code)
    assert len(refusals) >= 7 and len(timeouts) >= 3, (refusals, timeouts)
    assert set(refusals) <= set(REFUSAL_REASONS), refusals
    assert set(timeouts) <= set(TIMEOUT_KINDS), timeouts
    assert {"missing_token", "wrong_token"} <= set(auth) <= set(AUTH_FAILURE_REASONS) | {"token"}
