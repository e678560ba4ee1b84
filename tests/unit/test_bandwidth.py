"""The bandwidth meter on recorded speech: full-band recordings against phone lines, whether
a phone line reaches the server at 8 kHz or already resampled to 16 kHz."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from asr_server.audio.bandwidth import MIN_HEARD_S, BandwidthMeter
from asr_server.audio.decode import AudioDecoder, AudioFormat, Encoding
from asr_server.audio.g711 import mulaw_encode
from tests.helpers import corpus, first_channel

SR = 16_000
RECORDINGS = corpus()
#: recorded at 16 kHz or more with the full band (JFK's 1961 broadcast among them)
FULL_BAND = sorted(
    r.id
    for r in RECORDINGS.values()
    if r.sample_rate >= SR
    and r.category in ("short_read", "multispeaker", "non_english")
    and not r.id.endswith("_narrowband")
)
#: recorded at 8 kHz and resampled to 16 kHz by their publishers (sox)
RESAMPLED_PHONE = sorted(r.id for r in RECORDINGS.values() if r.category == "derived_up16k")


def heard(audio: np.ndarray, chunk: int = 320) -> BandwidthMeter:
    """The meter after ``audio`` in 20 ms pieces (it keeps what is less than a frame)."""
    meter = BandwidthMeter()
    for i in range(0, audio.size, chunk):
        meter.add(audio[i : i + chunk])
    return meter


def speech_of(audio: np.ndarray) -> np.ndarray:
    """From the first loud 20 ms on, as an utterance starts."""
    loud = np.flatnonzero(np.abs(audio) > 0.05 * np.abs(audio).max())
    return audio[max(0, loud[0] - 4_800) :]


def through_the_servers_phone_line(audio: np.ndarray) -> np.ndarray:
    """8 kHz mu-law, as a call arrives, decoded and resampled by the server."""
    at_8k = soxr.resample(audio, SR, 8_000)
    wire = mulaw_encode(np.clip(np.rint(at_8k * 32768), -32768, 32767).astype(np.int16))
    decoder = AudioDecoder(AudioFormat(Encoding.MULAW, 8_000))
    out = [decoder.decode(wire[i : i + 160])[0] for i in range(0, len(wire), 160)]
    return np.concatenate([*out, decoder.flush()[0]])


def linearly_interpolated(at_8k: np.ndarray) -> np.ndarray:
    """8 kHz → 16 kHz as ``audioop.ratecv`` does it (the classic Twilio recipe)."""
    return np.interp(np.arange(2 * at_8k.size) / 2, np.arange(at_8k.size), at_8k).astype(np.float32)


def test_the_corpus_has_both_kinds() -> None:
    assert len(FULL_BAND) >= 20 and len(RESAMPLED_PHONE) == 3


@pytest.mark.parametrize("recording", FULL_BAND)
def test_full_band_speech_is_not_a_phone_line(recording: str) -> None:
    audio = speech_of(first_channel(RECORDINGS[recording].path))
    meter = heard(audio[: 2 * SR])
    assert meter.high_band_db is not None and not meter.narrowband, meter.high_band_db
    # the same speech through a phone line: at 8 kHz into the server, or resampled to
    # 16 kHz before it is sent (as agent frameworks do)
    assert heard(through_the_servers_phone_line(audio)[: 2 * SR]).narrowband
    assert heard(soxr.resample(soxr.resample(audio, SR, 8_000), 8_000, SR)[: 2 * SR]).narrowband
    # ... or upsampled crudely, which leaves the voice band's mirror image above 4 kHz at
    # -17 to -36 dB: before, that passed for full band (and got full band's threshold)
    at_8k = soxr.resample(audio[: 2 * SR], SR, 8_000)
    for image in (linearly_interpolated(at_8k), np.repeat(at_8k, 2)):
        assert heard(image).narrowband, heard(image).high_band_db
    assert meter.mirroring is not None and abs(meter.mirroring) < 0.2


@pytest.mark.parametrize("recording", RESAMPLED_PHONE)
def test_a_phone_recording_resampled_to_16_khz_is_a_phone_line(recording: str) -> None:
    meter = heard(speech_of(first_channel(RECORDINGS[recording].path))[: 2 * SR])
    assert meter.narrowband, meter.high_band_db


def test_it_says_nothing_before_it_has_heard_enough() -> None:
    audio = first_channel(RECORDINGS["osr_us_000_0034_8k_up16k"].path)
    speech = speech_of(audio)
    short = heard(speech[: int(0.9 * MIN_HEARD_S * SR)])
    assert short.high_band_db is None and not short.narrowband
    assert heard(speech[: int(1.1 * MIN_HEARD_S * SR)]).narrowband
    assert not heard(np.zeros(2 * SR, np.float32)).narrowband  # silence: no verdict
