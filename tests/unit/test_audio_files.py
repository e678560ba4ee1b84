"""asr_client.audio_files: a file's level, and --normalize raising a quiet one."""

from __future__ import annotations

import numpy as np
import pytest

from asr_client.audio_files import PcmAudio


def test_each_channel_is_raised_to_a_normal_level_without_clipping() -> None:
    """--normalize: the quiet channel up to -12 dBFS in its loudest 30 ms; the loud one
    left as it is (never lowered); a channel with one click near full scale only up to
    -1 dBFS at that click; silence untouched."""
    rate = 16_000
    t = np.arange(rate) / rate
    quiet = np.sin(2 * np.pi * 440 * t) * 100  # -53 dBFS RMS
    loud = np.sin(2 * np.pi * 440 * t) * 20_000
    clicked = quiet.copy()
    clicked[100] = 16_000
    frames = np.stack([quiet, loud, clicked, np.zeros(rate)], axis=1).round().astype(np.int16)
    audio = PcmAudio(frames, rate)
    before = audio.loudest_frame_db()
    assert before[0] == pytest.approx(20 * np.log10(100 / np.sqrt(2) / 32768), abs=0.1)
    assert before[3] == -np.inf
    raised, gains = audio.raised()
    after = raised.loudest_frame_db()
    assert after[0] == pytest.approx(-12.0, abs=0.1)
    assert gains[1] == 0 and np.array_equal(raised.frames[:, 1], frames[:, 1])
    assert np.abs(raised.frames[:, 2]).max() == pytest.approx(29_204, abs=2)
    assert gains[3] == 0 and not raised.frames[:, 3].any()


def notice_for(frames: np.ndarray, rate: int = 16_000) -> str:
    import argparse
    import io

    from asr_client.cli import _level_as_asked

    stderr = io.StringIO()
    args = argparse.Namespace(normalize=False, quiet=False)
    _level_as_asked(PcmAudio(frames.round().astype(np.int16), rate), args, stderr)
    return stderr.getvalue()


def test_a_quiet_channel_is_named_and_normal_read_speech_is_not_quiet() -> None:
    """A call's customer at -59 dBFS beside a loud agent was not told (the loudest channel
    was judged); read speech at -29 dBFS (three of the shared corpus's recordings, heard
    whole) was told it was quiet."""
    t = np.arange(16_000) / 16_000
    tone = np.sin(2 * np.pi * 440 * t) * np.sqrt(2) * 32768  # 0 dBFS RMS

    def at(db: float) -> np.ndarray:
        return tone * 10 ** (db / 20)

    told = notice_for(np.stack([at(-6), at(-59)], axis=1))
    assert told.startswith("channel 1 is quiet (its loudest moment at -59 dBFS)"), told
    assert notice_for(np.stack([at(-29)], axis=1)) == ""
    assert notice_for(np.stack([at(-40)], axis=1)).startswith("the recording is quiet (its")
    assert notice_for(np.stack([at(-6), np.zeros(16_000)], axis=1)) == ""  # a silent channel
    told = notice_for(np.stack([at(-40), at(-6), at(-50)], axis=1))
    assert told.startswith(
        "channels 0 and 2 are quiet (their loudest moments at -40 and -50 dBFS): the server "
        "may not hear some or all of their speech; --normalize raises them first"
    ), told


def test_a_file_refused_for_its_channels_gets_no_level_advice(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import argparse
    import io

    import soundfile as sf

    from asr_client.cli import UsageError, _audio_for_the_server

    rng = np.random.default_rng(0)
    path = tmp_path / "ten.wav"
    sf.write(str(path), rng.normal(0, 0.001, (16_000, 10)), 16_000, subtype="PCM_16")
    stderr = io.StringIO()
    args = argparse.Namespace(path=str(path), channels="auto", normalize=False, quiet=False)
    with pytest.raises(UsageError, match="10 channels, more than the server takes"):
        _audio_for_the_server(args, stderr)
    assert stderr.getvalue() == ""
