"""Streaming sample-rate conversion, a few milliseconds behind the input.

Every stream's audio is converted to the pipeline's 16 kHz as it arrives, and
whatever the converter holds back reaches the voice detector and the engine that much
later: every partial, final and end of turn waits for it. soxr's ``ResampleStream``
(used here until 2026-12-05) converts in FFT blocks and held back 64 ms of an 8 kHz
phone line on average (up to 115 ms; 21 ms at 48 kHz, 47 ms at 22.05 kHz), and
python-soxr offers no smaller block. On the phone line that was most of why the first
partial came 0.10 s later than at 16 kHz (docs/call-center.md).

This converter is a polyphase FIR: the input, zero-stuffed by ``up``, goes through a
Kaiser-windowed sinc low-pass and every ``down``-th sample is kept, computed directly
(only the samples kept, only the non-zero inputs). An output sample needs the input up
to half the filter's length past it, and nothing more is held back: 3.2 ms at 8 kHz,
1.6 ms at 48 kHz. The filter is linear-phase and its delay is taken out, so output
sample ``n`` is the input at ``n * in_rate / out_rate``: timestamps need no correction.

The filter passes 90 % of the lower rate's Nyquist frequency and stops 80 dB from 110 %
on: for speech recognition, and for G.711 (whose own noise floor is about 38 dB down),
more than enough.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import soxr

#: attenuation of the stop band; sets the filter's length with the transition width
STOPBAND_DB = 80.0
#: the transition band's width, as a fraction of the lower rate's Nyquist frequency; it
#: is centred on that frequency (a phone line's 3.4 kHz is well inside the pass band)
TRANSITION = 0.2
#: up to this many phases the output is computed a phase at a time (a few fast
#: correlations); with more (44.1 kHz → 16 kHz has 160) sample by sample, gathered
FEW_PHASES = 8
#: the most phases a filter is designed for. Every common rate needs at most 640
#: (11.025 kHz); an odd one such as 8001 Hz needs 16,000, a 3-10 MB table that takes
#: 0.3-0.8 s to design, on the event loop, at the stream's start. Those go to soxr's
#: stream instead, whose block delay (a mean of 20-65 ms, more at low rates) is the lesser
#: cost (see resampler_for).
MAX_PHASES = 640
#: outputs computed together on the gathered path (at 44.1 kHz, 2.4 MB of windows)
GATHER_BLOCK = 4096


def _lowpass(up: int, down: int, in_rate: int, out_rate: int) -> tuple[np.ndarray, int]:
    """The filter, at ``in_rate * up``, with a DC gain of ``up`` (the zero-stuffing's loss),
    and its delay in output samples (its half length is a whole number of them)."""
    high_rate = in_rate * up
    nyquist = min(in_rate, out_rate) / 2
    width = TRANSITION * nyquist / high_rate  # cycles per sample
    # Kaiser's formulas for the window's shape and the length that reaches STOPBAND_DB
    beta = 0.1102 * (STOPBAND_DB - 8.7)
    length = (STOPBAND_DB - 7.95) / (2.285 * 2 * math.pi * width)
    delay = math.ceil(length / 2 / down)  # output samples
    half = delay * down
    t = np.arange(-half, half + 1, dtype=np.float64)
    cutoff = nyquist / high_rate  # cycles per sample
    taps = 2 * cutoff * np.sinc(2 * cutoff * t) * np.kaiser(t.size, beta)
    return taps * (up / taps.sum()), delay


@functools.lru_cache(maxsize=16)
def _polyphase(in_rate: int, out_rate: int) -> tuple[int, int, int, np.ndarray]:
    """``up``, ``down``, the delay (output samples) and each phase's taps, oldest input
    first (as np.correlate slides them). Shared, read-only, by every stream at the rate."""
    common = math.gcd(in_rate, out_rate)
    up, down = out_rate // common, in_rate // common
    taps, delay = _lowpass(up, down, in_rate, out_rate)
    width = math.ceil(taps.size / up)  # input samples per output sample
    padded = np.zeros(width * up)
    padded[: taps.size] = taps
    phases = np.ascontiguousarray(padded.reshape(width, up).T[:, ::-1], dtype=np.float32)
    phases.flags.writeable = False
    return up, down, delay, phases


class StreamingResampler:
    """One channel's conversion from ``in_rate`` to ``out_rate`` (whole hertz), chunk by
    chunk, with state across chunks: the output does not depend on how the input was cut."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.out_rate = out_rate
        self.up, self.down, self.delay, self._phases = _polyphase(in_rate, out_rate)
        self._width = self._phases.shape[1]  # input samples per output sample
        # the input from index self._first on; silence before the stream began
        self._first = -self._width
        self._input = np.zeros(self._width, np.float32)
        self._received = 0
        self._emitted = 0

    @property
    def held_back_s(self) -> float:
        """How far the output lags behind the input: half the filter's length."""
        return self.delay / self.out_rate

    def process(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        """The output that ``samples`` (after everything before) completes; with ``last``,
        the rest of the stream too (the input is over)."""
        samples = np.asarray(samples, dtype=np.float32)
        self._input = np.concatenate([self._input, samples])
        self._received += samples.size
        whole = -(-self._received * self.up // self.down)  # the output of all the input
        if last:
            end = whole
            needed = self._newest_input(end - 1) + 1 - self._first
            if needed > self._input.size:  # the filter runs on into silence
                self._input = np.concatenate(
                    [self._input, np.zeros(needed - self._input.size, np.float32)]
                )
        else:
            # output n needs input up to _newest_input(n): every n before this has it
            end = whole - self.delay
        start, end = self._emitted, max(self._emitted, end)
        out = self._compute(start, end)
        self._emitted = end
        keep_from = self._newest_input(end) - self._width + 1
        if keep_from > self._first:
            self._input = self._input[keep_from - self._first :]
            self._first = keep_from
        return out

    def _newest_input(self, n: int) -> int:
        """The newest input sample that output ``n`` is made of."""
        return (n + self.delay) * self.down // self.up

    def _compute(self, start: int, end: int) -> np.ndarray:
        count = end - start
        out = np.empty(count, np.float32)
        if count == 0:
            return out
        if self.up <= FEW_PHASES:
            # outputs up samples apart share a phase, and their inputs are down apart
            for offset in range(min(self.up, count)):
                j = (start + offset + self.delay) * self.down
                newest, phase = divmod(j, self.up)
                n = len(range(offset, count, self.up))
                lo = newest - self._width + 1 - self._first
                hi = lo + (n - 1) * self.down + self._width
                taps = self._phases[phase]
                out[offset :: self.up] = np.correlate(self._input[lo:hi], taps)[:: self.down]
            return out
        # in blocks: a whole file in one message (Recognize takes up to 64 MB) would
        # otherwise gather every output's window at once, gigabytes at 44.1 kHz
        for block in range(start, end, GATHER_BLOCK):
            outputs = np.arange(block, min(end, block + GATHER_BLOCK))
            newest_inputs, phases = np.divmod((outputs + self.delay) * self.down, self.up)
            oldest = newest_inputs - self._width + 1 - self._first
            windows = self._input[oldest[:, None] + np.arange(self._width)]
            out[block - start : block - start + outputs.size] = np.einsum(
                "nk,nk->n", windows, self._phases[phases]
            )
        return out


class SoxrStream:
    """soxr's streaming resampler, for rates with more than MAX_PHASES phases."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self._rates = (in_rate, out_rate)
        self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32")
        self._taken = 0  # input samples, in all
        self._given = 0  # output samples, in all

    def process(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        chunk = np.ascontiguousarray(samples, dtype=np.float32)
        out = np.asarray(self._stream.resample_chunk(chunk, last=last), np.float32)
        self._taken += chunk.size
        self._given += out.size
        return out

    def catch_up(self) -> np.ndarray:
        """What soxr holds back (tens of milliseconds at these rates), now: its stream is
        ended and a new one takes the audio after (soxr cannot flush and go on). Each
        ended stream rounds its length on its own, a third of a sample long on average:
        at a FINALIZE a second that drifted the stream clock 40 ms in 30 minutes. So the
        flush is cut or padded to make the total exactly the input's length at the new
        rate (a sample or two of the flush's tail, which is the filter's ringing)."""
        out = self.process(np.zeros(0, np.float32), last=True)
        self._stream = soxr.ResampleStream(*self._rates, 1, dtype="float32")
        in_rate, out_rate = self._rates
        exact = (2 * self._taken * out_rate + in_rate) // (2 * in_rate)  # rounded
        extra = self._given - exact
        if extra > 0:
            cut = min(extra, out.size)
            out = out[: out.size - cut]
            self._given -= cut
        elif extra < 0:
            out = np.concatenate([out, np.zeros(-extra, np.float32)])
            self._given -= extra
        return out


def resampler_for(in_rate: int, out_rate: int) -> StreamingResampler | SoxrStream:
    """The converter for one channel: this module's, unless the rates' ratio needs more
    than MAX_PHASES phases (no common rate does)."""
    if out_rate // math.gcd(in_rate, out_rate) > MAX_PHASES:
        return SoxrStream(in_rate, out_rate)
    return StreamingResampler(in_rate, out_rate)
