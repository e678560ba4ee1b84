"""The streaming resampler: what soxr computes, in any chunking, milliseconds behind."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from asr_server.audio.resample import StreamingResampler, resampler_for

OUT = 16_000
#: 8 kHz (phone lines), a few phases (12, 24, 32, 48 kHz), and many (the 44.1 kHz family)
RATES = [8_000, 12_000, 24_000, 32_000, 44_100, 48_000, 22_050, 11_025]


def run(resampler: StreamingResampler, x: np.ndarray, chunks: list[int]) -> np.ndarray:
    out, start = [], 0
    for size in chunks:
        out.append(resampler.process(x[start : start + size]))
        start += size
    assert start == x.size
    out.append(resampler.process(np.zeros(0, np.float32), last=True))
    return np.concatenate(out)


def tones(rate: int, seconds: float, seed: int) -> np.ndarray:
    """Twenty tones across the band both rates carry (up to 85 % of the lower Nyquist)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    top = 0.85 * min(rate, OUT) / 2
    x = sum(np.sin(2 * np.pi * rng.uniform(50, top) * t + rng.uniform(0, 6)) for _ in range(20))
    return (np.asarray(x) / 20).astype(np.float32)


@pytest.mark.parametrize("rate", RATES)
def test_the_band_comes_out_as_soxr_makes_it_and_in_time(rate: int) -> None:
    """Within the band both rates carry, the output is soxr's (80 dB down, where a shift
    by one sample, or a wrong gain, would be 10-30 dB) and as long."""
    x = tones(rate, 1.0, seed=rate)
    step = rate // 50  # 20 ms messages, the last one shorter where 50 do not divide it
    y = run(
        StreamingResampler(rate, OUT), x, [min(step, x.size - s) for s in range(0, x.size, step)]
    )
    reference = soxr.resample(x, rate, OUT)
    assert y.size == reference.size == OUT
    edge = 400  # both treat the silence around the stream a little differently
    error = y[edge:-edge] - reference[edge:-edge]
    assert 20 * np.log10(np.std(error) / np.std(reference)) < -75


@pytest.mark.parametrize("rate", [8_000, 48_000, 44_100])
def test_the_output_does_not_depend_on_how_the_input_was_cut(rate: int) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal(rate // 2).astype(np.float32) * 0.3
    whole = run(StreamingResampler(rate, OUT), x, [x.size])
    sizes: list[int] = []  # 1 to 50 ms
    while sum(sizes) < x.size:
        sizes.append(min(int(rng.integers(1, rate // 20)), x.size - sum(sizes)))
    np.testing.assert_allclose(run(StreamingResampler(rate, OUT), x, sizes), whole, atol=1e-6)


@pytest.mark.parametrize("rate", [8_000, 24_000, 44_100, 48_000])
def test_each_chunk_comes_out_within_a_few_milliseconds(rate: int) -> None:
    """After every 20 ms message, all but the filter's half length of it is out: the
    voice detector and the engine hear the audio 2-4 ms after it arrived (soxr's stream
    held back 64 ms of an 8 kHz line on average, up to 115 ms)."""
    resampler = StreamingResampler(rate, OUT)
    assert resampler.held_back_s <= 0.0035
    x = tones(rate, 2.0, seed=1)
    step, produced = rate // 50, 0
    for start in range(0, x.size, step):
        produced += resampler.process(x[start : start + step]).size
        arrived = (start + step) * OUT / rate
        assert arrived - resampler.held_back_s * OUT - 1 <= produced <= arrived


def test_stream_lengths_and_empty_input() -> None:
    resampler = StreamingResampler(48_000, OUT)
    assert resampler.process(np.zeros(0, np.float32)).size == 0
    # a stream of 1,000 samples at 48 kHz is 333.3 samples at 16 kHz: all 334 come out
    assert run(StreamingResampler(48_000, OUT), np.ones(1000, np.float32), [999, 1]).size == 334
    assert run(StreamingResampler(8_000, OUT), np.ones(3, np.float32), [3]).size == 6
    assert StreamingResampler(8_000, OUT).process(np.zeros(0, np.float32), last=True).size == 0


def test_images_and_aliases_are_stopped() -> None:
    """8 kHz → 16 kHz: a 3 kHz tone leaves no image at 5 kHz; 48 kHz → 16 kHz: a 10 kHz
    tone, above the new Nyquist, does not fold back to 6 kHz."""
    t = np.arange(16_000) / 8_000
    up = run(
        StreamingResampler(8_000, OUT), np.sin(2 * np.pi * 3000 * t).astype(np.float32), [160] * 100
    )
    spectrum = np.abs(np.fft.rfft(up * np.hanning(up.size)))
    freqs = np.fft.rfftfreq(up.size, 1 / OUT)
    assert spectrum[np.argmin(np.abs(freqs - 5000))] < spectrum.max() * 10 ** (-70 / 20)
    t = np.arange(48_000) / 48_000
    down = run(
        StreamingResampler(48_000, OUT),
        np.sin(2 * np.pi * 10_000 * t).astype(np.float32),
        [960] * 50,
    )
    assert np.std(down[500:-500]) < 0.7 * 10 ** (-70 / 20)


def test_odd_rates_go_to_soxr_without_designing_a_huge_filter() -> None:
    """8001 Hz would need 16,000 phases (a 3 MB table, 0.25 s on the event loop): soxr's
    stream converts it, as well as ever (the band within 75 dB of its one-shot output)."""
    common = resampler_for(8_000, OUT)
    assert isinstance(common, StreamingResampler)
    odd = resampler_for(8_001, OUT)
    assert not isinstance(odd, StreamingResampler)
    x = tones(8_001, 1.0, seed=3)
    y = run(odd, x, [160] * 50 + [x.size - 8000])  # type: ignore[arg-type]
    reference = soxr.resample(x, 8_001, OUT)
    assert abs(y.size - reference.size) <= 1
    n = min(y.size, reference.size) - 400
    error = y[400:n] - reference[400:n]
    assert np.std(error) <= np.std(reference) * 10 ** (-75 / 20)


@pytest.mark.parametrize("rate", [8_001, 44_101])
def test_catch_up_emits_everything_so_far_and_the_stream_goes_on(rate: int) -> None:
    """At a FINALIZE what soxr holds back comes at once (as if silence followed; only
    soxr's streams are caught up, AudioDecoder.catch_up says why); the output after it
    continues where it ended: nothing twice, nothing lost, and away from the cut the same
    samples as without it."""
    x = tones(rate, 2.0, seed=3)
    half = rate  # one second
    plain, cut = resampler_for(rate, OUT), resampler_for(rate, OUT)
    expected = np.concatenate(
        [plain.process(x[:half]), plain.process(x[half:]), plain.process(x[:0], last=True)]
    )
    before = np.concatenate([cut.process(x[:half]), cut.catch_up()])
    assert before.size == OUT  # all of the first second, now
    after = np.concatenate([cut.process(x[half:]), cut.process(x[:0], last=True)])
    got = np.concatenate([before, after])
    assert abs(got.size - expected.size) <= 1  # soxr's restart may round one sample
    n = min(got.size, expected.size)
    away = np.r_[0 : OUT - 160, OUT + 800 : n - 160]  # 10 ms before, 50 ms after the cut
    assert np.max(np.abs(got[away] - expected[away])) < 1e-3


@pytest.mark.parametrize("rate", [8_001, 44_101, 47_999])
def test_frequent_catch_ups_do_not_drift_the_stream_clock(rate: int) -> None:
    """Each of soxr's streams rounds its own length, a third of a sample long on average:
    a client finalizing every second drifted a 44.1 kHz-ish stream's clock 40 ms in 30
    minutes. After each catch-up the output is exactly the input's length at 16 kHz."""
    resampler = resampler_for(rate, OUT)
    chunk = np.random.default_rng(0).standard_normal(rate // 50).astype(np.float32) * 0.1
    taken = given = 0
    for second in range(120):  # two minutes of 20 ms chunks, a catch-up every second
        for _ in range(50):
            given += resampler.process(chunk).size
            taken += chunk.size
        given += resampler.catch_up().size  # type: ignore[union-attr]
        assert abs(given - taken * OUT / rate) <= 0.5 + 1e-9, (second, given - taken * OUT / rate)
