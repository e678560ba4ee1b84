"""A fast, deterministic engine for logic tests (never instead of the real-model tests).

It "hears" one word per ``seconds_per_word`` of audio louder than silence and names
words by their position (``w0 w1 w2 …``), so a growing utterance yields growing,
self-consistent hypotheses, like a real recognizer on clean speech. A ``gate``
stalls every call until it is set, to create backpressure on demand.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from asr_server.engine.base import DecodeRequest, EngineCapabilities, Hypothesis, WordTiming

LOG_09 = math.log(0.9)


class FakeEngine:
    name = "fake"
    is_multilingual = False

    def __init__(
        self,
        *,
        seconds_per_word: float = 0.25,
        max_batch_size: int = 1,
        workers: int = 1,
        gate: threading.Event | None = None,
        fail_with: Exception | None = None,
        on_call: Callable[[Sequence[DecodeRequest]], None] | None = None,
        capabilities: EngineCapabilities | None = None,
        batch_key: Callable[[DecodeRequest], Hashable] | None = None,
        record_calls: bool = True,
    ) -> None:
        #: as declared; with ``prefix_forcing=False`` it ignores ``DecodeRequest.prefix``,
        #: as an engine without it would. It names words by their place in what it hears,
        #: so carried audio would renumber the new words: no context carry unless a test
        #: asks for it
        self.capabilities = capabilities or EngineCapabilities(context_carry=False)
        self.seconds_per_word = seconds_per_word
        self.max_batch_size = max_batch_size
        self.workers = workers
        self.gate = gate
        self.fail_with = fail_with
        self.on_call = on_call
        self._batch_key = batch_key
        #: every call's requests, audio included, for tests to inspect; a server process
        #: on the fake backend (drills, hours of streams) keeps none
        self.calls: list[list[DecodeRequest]] = []
        self._record_calls = record_calls
        self._lock = threading.Lock()

    def transcribe(self, requests: Sequence[DecodeRequest]) -> list[Hypothesis]:
        if self._record_calls:
            with self._lock:
                self.calls.append(list(requests))
        if self.on_call is not None:
            self.on_call(requests)
        if self.gate is not None:
            self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        return [self._hear(r) for r in requests]

    def batch_key(self, request: DecodeRequest) -> Hashable:
        """The request's kind, unless a test gives its own rule."""
        return request.kind if self._batch_key is None else self._batch_key(request)

    def _hear(self, req: DecodeRequest) -> Hypothesis:
        loud = np.flatnonzero(np.abs(req.audio) > 1e-3)
        per_word = int(16_000 * self.seconds_per_word)
        n_words = round(loud.size / per_word)
        if n_words == 0:
            return Hypothesis("", req.language or "en", rejected=True)
        words = [f"w{i}" for i in range(n_words)]
        prefix = req.prefix.split() if self.capabilities.prefix_forcing else []
        if prefix:  # forced prefix: kept verbatim, decoding continues after it
            words = prefix + words[len(prefix) :]
        timings = []
        if req.word_timestamps:  # each word spans its share of the loud samples
            for i, w in enumerate(words):
                first = loud[min(i * per_word, loud.size - 1)]
                last = loud[min((i + 1) * per_word, loud.size) - 1]
                timings.append(WordTiming(w, first / 16_000, (last + 1) / 16_000, 0.9))
        # as sure of the text as of each word
        return Hypothesis(" ".join(words), req.language or "en", timings, avg_logprob=LOG_09)
