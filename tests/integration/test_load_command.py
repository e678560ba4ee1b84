"""``asr-client load`` end to end: telephone stereo calls on the real model, and rejection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asr_client.cli import run
from asr_server.engine.fake import FakeEngine
from tests.helpers import ROOT, fake_factory

pytestmark = pytest.mark.timeout(180)


@pytest.mark.model
async def test_telephone_stereo_calls_are_transcribed_whole(make_server, tmp_path: Path, capsys):  # type: ignore[no-untyped-def]
    server = await make_server()
    report = tmp_path / "report.json"
    code = await run(
        ["load", "--server", f"127.0.0.1:{server.port}", "--corpus", str(ROOT / "audio_samples"),
         "--language", "en", "--streams", "2", "--telephone", "--stereo", "--duration", "10",
         "--pause", "0.8:1.5", "--chunk-ms", "20", "--speed", "3", "--json", str(report),
         "--quiet"]
    )  # fmt: skip
    data = json.loads(report.read_text())
    assert code == 0, data["overall"]
    overall = data["overall"]
    assert data["settings"]["encoding"] == "MULAW" and data["settings"]["sample_rate_hz"] == 8000
    assert (overall["completed"], overall["rejected"], overall["failed"]) == (2, 0, 0)
    assert overall["audio_unprocessed_s"] == 0  # every second sent went through
    assert overall["wer"] is not None and overall["wer"] < 0.3, [
        (c["reference"], c["hypothesis"]) for s in data["streams"] for c in s["transcripts"]
    ]
    assert overall["final_latency_s"]["p50"] is not None
    assert overall["first_partial_s"]["p50"] is not None
    both_spoke = 0
    for stream in data["streams"]:
        assert stream["channels"] == 2
        # whoever spoke (agent, customer or both) got their own words back
        spoken = [c for c in stream["transcripts"] if c["reference"]]
        assert spoken and all(c["hypothesis"] for c in spoken)
        silent = [c for c in stream["transcripts"] if not c["reference"]]
        assert all(not c["hypothesis"] for c in silent)
        both_spoke += len(spoken) == 2
    assert both_spoke >= 1
    out = capsys.readouterr().out
    assert "end of speech to final: p50" in out and "WER:" in out


async def test_calls_past_the_limit_are_reported_rejected(make_server, tmp_path: Path, capsys):  # type: ignore[no-untyped-def]
    server = await make_server(fake_factory(FakeEngine()), max_streams=1)
    report = tmp_path / "report.json"
    code = await run(
        ["load", "--server", f"127.0.0.1:{server.port}", "--corpus", str(ROOT / "audio_samples"),
         "--language", "en", "--streams", "3", "--duration", "2", "--ramp", "0", "--speed", "4",
         "--json", str(report), "--quiet"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr()
    overall = json.loads(report.read_text())["overall"]
    assert (overall["completed"], overall["rejected"], overall["failed"]) == (1, 2, 0)
    statuses = sorted(s["status"] for s in json.loads(report.read_text())["streams"])
    assert statuses == ["OK", "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"]


async def test_without_the_eval_extra_the_report_comes_without_wer(  # type: ignore[no-untyped-def]
    make_server, tmp_path: Path, capsys, monkeypatch
):
    """scripts/serve.sh's .venv had no jiwer: the README's load example ran its whole
    simulation and then ended in a traceback, its report lost."""
    import asr_client.load.command as command
    import asr_client.scoring as scoring

    monkeypatch.setattr(scoring, "can_score", lambda: False)
    monkeypatch.setattr(command, "can_score", lambda: False)
    server = await make_server(fake_factory(FakeEngine()))
    report = tmp_path / "report.json"
    code = await run(
        ["load", "--server", f"127.0.0.1:{server.port}", "--corpus", str(ROOT / "audio_samples"),
         "--language", "en", "--streams", "1", "--duration", "4", "--speed", "20",
         "--json", str(report), "--quiet"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert "note: no WER in this report: it needs the eval extra" in err
    overall = json.loads(report.read_text())["overall"]
    assert overall["completed"] == 1 and overall["wer"] is None
