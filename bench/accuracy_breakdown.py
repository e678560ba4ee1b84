"""Where does streaming lose accuracy? A deterministic breakdown. Prints figures.

Runs the server's own pieces (the webrtc endpointer, LocalAgreement, the faster-whisper
engine) in one process over the shared corpus, with no clock: a partial is decoded every
``partial_interval`` of new speech, exactly when the server would ask for it, and its
result is applied at once (the server on an idle machine). This makes a run repeatable and
several times faster than real time, so the streaming pipeline can be taken apart one
choice at a time against offline faster-whisper on the same model, files and normaliser:

* ``committed``: partials commit what two agree on, the final continues after it (what the
  server did until 2026-12; against ``segmented``, the cost of committing);
* ``segmented``: each utterance decoded alone, nothing committed (the cost of the cuts);
* ``carried``: nothing committed, each final decoded after the previous final's audio and
  text (the server's default from 2026-12-01 to 2026-12-02);
* ``carried_split6``: the same, with an utterance of 6 s or more split at its next pause
  (the server's defaults now: quote this one for the server);
* ``carried_window30``: the same with finals' shortest encoder window at 30 s.

VARIANTS below lists what a run compares (``--variant`` picks some); each changes one
choice. CHEAPER lists cheaper decodes (shorter windows, narrower beams), EARLY what a
final decoded early in a pause hears (SEMANTIC streams, voice agents), DECODING other ways
to decode (Whisper's timestamp mode, as offline ``transcribe`` decodes), and HELD longer
utterances (pauses held open, for transcripts); these run only by name. Offline
hypotheses are cached (``--offline-cache``) across runs, keyed by the audio decoded.

Usage: python bench/accuracy_breakdown.py [--telephone] [--model base] [--variant carried]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from streaming_bench import (  # noqa: E402
    Item,
    channel_audio,
    load_items,
    offline_text,
    references,
)

from asr_client.scoring import normalize, wer  # noqa: E402
from asr_server.engine.base import (  # noqa: E402
    DecodeKind,
    DecodeRequest,
    Hypothesis,  # noqa: E402
)
from asr_server.engine.text import spoken_words, without_unheard_loops  # noqa: E402
from asr_server.engine.whisper import CPU_FINAL_MIN_WINDOW_S  # noqa: E402
from asr_server.session.agreement import LocalAgreement  # noqa: E402
from asr_server.session.carry import CLOSING_PUNCTUATION, Carry  # noqa: E402
from asr_server.session.channel import SPLIT_PAUSE_MARGIN_S, TRAILING_PAD_S  # noqa: E402
from asr_server.session.finals import LOOP_CHECK_UNHEARD_S  # noqa: E402
from asr_server.settings import EngineSettings  # noqa: E402
from asr_server.vad.endpointer import (  # noqa: E402
    Endpointer,
    EndpointerConfig,
    SpeechAudio,
    SpeechEnded,
    SpeechStarted,
)
from asr_server.vad.silero import silero_hears_speech  # noqa: E402
from asr_server.vad.webrtc import WebRtcVoiceDetector  # noqa: E402

SR = 16_000
CHUNK = SR // 10


@dataclass
class Options:
    commit: bool = True
    partial_interval_s: float = 0.5
    min_commit_s: float = 1.5
    partial_cutoff_s: float = 0.15
    trailing_pad_s: float = 0.2
    silence_ms: int = 500
    start_ms: int = 120
    pre_roll_ms: int = 300
    max_utterance_s: float = 15.0
    agreement: int = 2
    #: the previous utterance's audio (if no longer than this) is decoded before this one's
    #: final, its final text forced as the prefix (0 = off), across pauses below carry_gap_s
    carry_s: float = 0.0
    carry_gap_s: float = 2.0
    #: carry only into utterances up to this long (0 = any): a long one has its own context
    carry_into_s: float = 0.0
    context_chars: int = 0
    #: the final's pause (``trailing_pad_s``: the server's pad is 0.2 s; a final decoded
    #: early in a pause has only what had arrived, 60-90 ms) lengthened to the server's
    #: pad by mirroring it (room tone instead of the window's padding)
    fill_pause: bool = False
    #: a carried final without new words is not decoded alone when Silero hears no speech
    #: in its utterance (as the server does)
    speech_check: bool = True
    #: an utterance this long (or longer) is split at a pause of ``trailing_pad_s`` and
    #: a margin or more when speech resumes after it, as the server splits SILENCE streams
    #: (streaming.split_at_pause_after_s; 0 = off)
    split_after_s: float = 0.0
    #: a pause this long splits an utterance of any length (with split_after_s set), as
    #: the server splits SILENCE streams whose silence_ms is longer (its
    #: LONG_PAUSE_SPLIT_S, 0.5 s); 0 = only the length rule, as before 2026-12-06
    long_pause_s: float = 0.0
    #: the carry holds the finals before the previous one too, while their audio fits in
    #: ``carry_s`` and each followed the one before within ``carry_gap_s``
    carry_chain: bool = False


@dataclass
class Utt:
    start: int
    audio: list[np.ndarray] = field(default_factory=list)
    n: int = 0
    since_partial: int = 0
    partial_n: int = 0  # samples the latest partial heard
    agreement: LocalAgreement = field(default_factory=LocalAgreement)

    def snapshot(self, end: int | None = None) -> np.ndarray:
        a = np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)
        return a if end is None else a[: max(0, end - self.start)]


class Simulator:
    def __init__(self, engine, opts: Options) -> None:  # type: ignore[no-untyped-def]
        self.engine = engine
        self.o = opts
        self.partials = 0
        self.fallbacks = 0  # carried finals that lost words, decoded again alone
        self.no_speech = 0  # carried finals without words not decoded alone: no speech
        self.looped_tails = 0  # finals whose end read a phrase again: the repeat cut

    def decode(self, audio: np.ndarray, kind: DecodeKind, prefix: str, prompt: str) -> str:
        if kind is DecodeKind.PARTIAL:
            self.partials += 1
        elif self.o.fill_pause:
            pause = audio[-int(self.o.trailing_pad_s * SR) :]
            mirrored = np.tile(np.concatenate([pause[::-1], pause]), 8)
            audio = np.concatenate([audio, mirrored[: int(TRAILING_PAD_S * SR) - pause.size]])
        hyp = self.engine.transcribe(
            [DecodeRequest(audio, kind, language="en", prefix=prefix, prompt=prompt)]
        )[0]
        return "" if hyp.rejected else hyp.text

    def run(self, audio: np.ndarray) -> list[str]:
        o = self.o
        ep = Endpointer(
            WebRtcVoiceDetector(3),
            EndpointerConfig(
                start_ms=o.start_ms, pre_roll_ms=o.pre_roll_ms, silence_ms=o.silence_ms
            ),
        )
        finals: list[str] = []
        utt: Utt | None = None
        # (audio, end sample, text) of the last final, for carrying it into the next
        last: tuple[np.ndarray, int, str] | None = None

        def context() -> tuple[np.ndarray, str, str]:
            """Audio and forced text carried from the previous utterance, and the prompt."""
            prompt = ""
            if o.context_chars and finals:
                prompt = " ".join(finals)[-o.context_chars :].partition(" ")[2]
            if not o.carry_s or last is None or utt is None:
                return np.zeros(0, np.float32), "", prompt
            prev_audio, prev_end, prev_text = last
            if (
                utt.start - prev_end > o.carry_gap_s * SR
                or not prev_text
                or prev_audio.size > o.carry_s * SR
                or (o.carry_into_s and utt.n > o.carry_into_s * SR)
            ):
                return np.zeros(0, np.float32), "", prompt
            return prev_audio, prev_text, prompt

        def finalize(end: int | None) -> None:
            nonlocal utt, last
            assert utt is not None
            a = utt.snapshot(end)
            carried, carried_text, prompt = context()
            # as the server does (session/carry.py Carry): without closing punctuation
            carried_text = carried_text.rstrip(CLOSING_PUNCTUATION)
            prefix = " ".join(p for p in (carried_text, utt.agreement.committed_text) if p)
            text = self.decode(np.concatenate([carried, a]), DecodeKind.FINAL, prefix, prompt)
            if carried_text:
                kept = text[len(carried_text) :] if text.startswith(carried_text) else ""
                text = kept.lstrip(CLOSING_PUNCTUATION + " ").strip()
                carry = Carry(carried, 0, last[2] if last else "", "en")
                hyp = Hypothesis(text, "en", rejected=not text)
                partial_words = spoken_words(" ".join(utt.agreement.committed + utt.agreement.tail))
                # as the server does (FinalDecoder.decode, session/finals.py)
                heard_share = min(1.0, utt.partial_n / max(a.size, 1))
                wrong = carry.misread(hyp, partial_words, heard_share)
                if (
                    hyp.rejected
                    and o.speech_check
                    and not silero_hears_speech(a, np.zeros(0, np.float32))
                ):
                    self.no_speech += 1  # no new words, and no speech to Silero: none
                elif wrong or carry.doubtful(hyp, partial_words, heard_share):
                    committed = utt.agreement.committed_text
                    alone = self.decode(a, DecodeKind.FINAL, committed, prompt)
                    alone_hyp = Hypothesis(alone, "en", rejected=not alone)
                    if not carry.keeps_carried(hyp, alone_hyp, partial_words, heard_share, wrong):
                        text = alone
                        self.fallbacks += 1
            # as the server does (FinalDecoder._without_unheard_loops)
            if a.size - utt.partial_n <= LOOP_CHECK_UNHEARD_S * SR:
                heard = spoken_words(" ".join(utt.agreement.committed + utt.agreement.tail))
                looped = text
                text = without_unheard_loops(text, heard)
                self.looped_tails += looped != text
            if text:
                finals.append(text)
            if o.carry_chain and carried_text and text and carried.size + a.size <= o.carry_s * SR:
                assert last is not None
                last = (np.concatenate([carried, a]), utt.start + a.size, f"{last[2]} {text}")
            else:
                last = (a, utt.start + a.size, text)
            utt = None

        def partial() -> None:
            assert utt is not None
            a = utt.snapshot()
            _, _, prompt = context()  # (the server carries into finals only)
            text = self.decode(a, DecodeKind.PARTIAL, utt.agreement.committed_text, prompt)
            utt.partial_n = a.size
            commit = o.commit and a.size >= o.min_commit_s * SR
            utt.agreement.update(text.split(), None, commit=commit)

        def split_at_pause(speech_end: int) -> None:
            """As the server: the final up to the pause's pad, the rest a new utterance."""
            nonlocal utt
            assert utt is not None
            cut = speech_end + int(o.trailing_pad_s * SR)
            rest = utt.snapshot()[cut - utt.start :]
            finalize(cut)
            utt = Utt(cut, [rest], rest.size, agreement=LocalAgreement(o.agreement))

        pause_from: int | None = None  # a pause heard long enough to split at: its start
        pause_len = 0  # how long that pause has lasted
        split_pause = (o.trailing_pad_s + SPLIT_PAUSE_MARGIN_S) * SR
        for pos in range(0, audio.size, CHUNK):
            events = ep.feed(audio[pos : pos + CHUNK])
            if pos + CHUNK >= audio.size:
                events += ep.flush()
            for ev in events:
                if isinstance(ev, SpeechStarted):
                    utt = Utt(ev.start_sample, agreement=LocalAgreement(o.agreement))
                    pause_from = None
                elif isinstance(ev, SpeechAudio) and utt is not None:
                    utt.audio.append(ev.samples)
                    if ev.trailing_silence >= split_pause:
                        pause_from, pause_len = ev.last_voiced_end, ev.trailing_silence
                    elif ev.trailing_silence == 0 and pause_from is not None:
                        speech_end, pause_from = pause_from, None
                        long_enough = speech_end - utt.start >= o.split_after_s * SR
                        long_pause = o.long_pause_s and pause_len >= o.long_pause_s * SR
                        if o.split_after_s and (long_enough or long_pause):
                            utt.n += ev.samples.size
                            split_at_pause(speech_end)
                            continue
                    utt.n += ev.samples.size
                    utt.since_partial += ev.samples.size
                    if utt.n >= o.max_utterance_s * SR:
                        # as the server at the length limit: a final, and the speech goes
                        # on under a new utterance (the server cuts between words; here
                        # the cut is where the limit falls, rare in this set)
                        cut = utt.start + utt.n
                        finalize(None)
                        utt = Utt(cut, agreement=LocalAgreement(o.agreement))
                        continue
                    if (
                        utt.since_partial >= o.partial_interval_s * SR
                        and ev.trailing_silence < o.partial_cutoff_s * SR
                    ):
                        utt.since_partial = 0
                        partial()
                elif isinstance(ev, SpeechEnded) and utt is not None:
                    finalize(ev.end_sample + int(o.trailing_pad_s * SR))
        if utt is not None:
            finalize(None)
        return finals


def by_source(rows: list[tuple[str, str, str]]) -> dict[str, float]:
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for src, ref, hyp in rows:
        groups.setdefault(src, ([], []))[0].append(ref)
        groups[src][1].append(hyp)
    return {s: round(wer(r, h), 4) for s, (r, h) in sorted(groups.items())}


@dataclass(frozen=True)
class Variant:
    options: Options
    #: finals' and partials' shortest encoder windows: the server's defaults on a CPU
    final_window_s: float = CPU_FINAL_MIN_WINDOW_S
    partial_window_s: float = EngineSettings.model_fields["min_window_s"].default
    final_beam: int = 5
    #: "zeros": the engine's log-mel padded with 0 up to the window (as faster-whisper
    #: does); "silence": the audio padded with digital silence before the log-mel (as
    #: openai-whisper does), so the padding reads as the quietest sound in the clip
    mel_padding: str = "zeros"
    #: decode in Whisper's timestamp mode, as offline ``transcribe`` does, instead of
    #: after <|notimestamps|> (the text is the same tokens less the timestamps)
    timestamps: bool = False


#: the variants a plain run compares, one choice changed at a time
VARIANTS: dict[str, Variant] = {
    # what the server did before: commit what two greedy partials agree on
    "committed": Variant(Options(commit=True, carry_s=0.0)),
    # each utterance's final decoded alone, nothing committed
    "segmented": Variant(Options(commit=False, carry_s=0.0)),
    # the server's default now: nothing committed, the previous final carried
    "carried": Variant(Options(commit=False, carry_s=10.0)),
    # ... and long utterances split at the next 200 ms pause (the server's default since
    # 2026-12-02; here, with partials applied at once, it matters only for long speech)
    "carried_split6": Variant(Options(commit=False, carry_s=10.0, split_after_s=6.0)),
    # ... as the server did before 2026-12-02: a carried final without new words was
    # always decoded alone, even when Silero heard no speech in it
    "carried_unchecked": Variant(Options(commit=False, carry_s=10.0, speech_check=False)),
    # ... with the 30 s window Whisper was trained on (the GPU default)
    "carried_window30": Variant(Options(commit=False, carry_s=10.0), final_window_s=30.0),
}

#: cheaper finals (``--variant`` only): what they cost in accuracy against ``carried``.
#: Measured 2026-12-01 and not taken: each one loses words somewhere (docs/accuracy.md).
CHEAPER: dict[str, Variant] = {
    # shorter encoder windows, finals and partials alike
    "carried_window6": Variant(
        Options(commit=False, carry_s=10.0), final_window_s=6.0, partial_window_s=6.0
    ),
    "carried_window8": Variant(
        Options(commit=False, carry_s=10.0), final_window_s=8.0, partial_window_s=8.0
    ),
    # narrower beams for finals
    "carried_greedy": Variant(Options(commit=False, carry_s=10.0), final_beam=1),
    "carried_beam2": Variant(Options(commit=False, carry_s=10.0), final_beam=2),
    # less carried (measured 2026-12-02, not taken: docs/accuracy.md): a carried final's
    # text is forced token by token, about 2 ms a token on this CPU, so a 10 s one adds
    # some 50 ms to the next final
    "carried_max5": Variant(Options(commit=False, carry_s=5.0)),
    "carried_max3": Variant(Options(commit=False, carry_s=3.0)),
    # carried into short utterances only (the phrase after a pause), long ones alone
    "carried_into3": Variant(Options(commit=False, carry_s=10.0, carry_into_s=3.0)),
    "carried_into5": Variant(Options(commit=False, carry_s=10.0, carry_into_s=5.0)),
}


#: what a final decoded early in a pause hears, against ``carried`` (measured 2026-12-02,
#: docs/accuracy.md): 60 ms of pause instead of the 200 ms pad costs words, and neither
#: filling the pause nor padding with silence wins that back on both lines
EARLY: dict[str, Variant] = {
    "carried_pad60": Variant(Options(commit=False, carry_s=10.0, trailing_pad_s=0.06)),
    "carried_pad60_filled": Variant(
        Options(commit=False, carry_s=10.0, trailing_pad_s=0.06, fill_pause=True)
    ),
    "carried_silence_padded": Variant(Options(commit=False, carry_s=10.0), mel_padding="silence"),
    "carried_pad60_silence_padded": Variant(
        Options(commit=False, carry_s=10.0, trailing_pad_s=0.06), mel_padding="silence"
    ),
}


#: decoding choices against ``carried`` (``--variant`` only): Whisper's timestamp mode,
#: which offline ``transcribe`` uses and the server does not
DECODING: dict[str, Variant] = {
    "carried_timestamps": Variant(Options(commit=False, carry_s=10.0), timestamps=True),
}

#: longer utterances for transcripts, against ``carried_split6`` (``--variant`` only;
#: measured 2026-12-05, docs/accuracy.md): pauses up to 2 s held open, so that utterances
#: end at the first pause after 6 s (the server's split) or at a long pause. Sentences
#: come out whole more often; at 16 kHz it wins a little, as phone audio it loses more.
HELD: dict[str, Variant] = {
    "carried_split6_held2000": Variant(
        Options(commit=False, carry_s=10.0, silence_ms=2000, split_after_s=6.0)
    ),
    "carried_split10_held2000": Variant(
        Options(commit=False, carry_s=10.0, silence_ms=2000, split_after_s=10.0)
    ),
    "carried_held10000": Variant(Options(commit=False, carry_s=10.0, silence_ms=10000)),
    # the server since 2026-12-06: in such streams a 0.5 s pause splits any utterance
    "carried_split6_held2000_long500": Variant(
        Options(commit=False, carry_s=10.0, silence_ms=2000, split_after_s=6.0, long_pause_s=0.5)
    ),
    "carried_split6_held10000_long500": Variant(
        Options(commit=False, carry_s=10.0, silence_ms=10000, split_after_s=6.0, long_pause_s=0.5)
    ),
    "carried_split6_held10000": Variant(
        Options(commit=False, carry_s=10.0, silence_ms=10000, split_after_s=6.0)
    ),
}

#: the carry over several finals (``--variant`` only; 2026-12-05): against
#: ``carried_split6``, and with utterances ended at 200 ms pauses, as a voice agent's
#: client that finalizes at its VAD's stop ends them
CHAINED: dict[str, Variant] = {
    "carried_split6_chain": Variant(
        Options(commit=False, carry_s=10.0, split_after_s=6.0, carry_chain=True)
    ),
    "carried_split6_silence200": Variant(
        Options(commit=False, carry_s=10.0, split_after_s=6.0, silence_ms=200)
    ),
    "carried_split6_silence200_chain": Variant(
        Options(commit=False, carry_s=10.0, split_after_s=6.0, silence_ms=200, carry_chain=True)
    ),
}

#: every variant a name can pick (``--variant``); a plain run compares VARIANTS only
BY_NAME: dict[str, Variant] = {
    **VARIANTS,
    **CHEAPER,
    **EARLY,
    **DECODING,
    **HELD,
    **CHAINED,
}


def with_timestamps(engine_class):  # type: ignore[no-untyped-def]
    """``engine_class`` decoding in timestamp mode: the prompt ends with the start of
    transcript, or with <|0.00|> before a forced prefix, as faster-whisper's own prompt."""

    class WithTimestamps(engine_class):  # type: ignore[misc,valid-type]
        def _prompt(self, req, tok):  # type: ignore[no-untyped-def]
            prompt, prefix = super()._prompt(req, tok)
            head = prompt[: len(prompt) - len(prefix) - 1]  # up to <|notimestamps|>
            if not prefix:
                return head, prefix
            return [*head, tok.timestamp_begin, *prefix], [tok.timestamp_begin, *prefix]

    return WithTimestamps


def silence_padded(engine_class):  # type: ignore[no-untyped-def]
    """``engine_class`` with its requests' audio padded with digital silence up to the
    encoder window before the log-mel, instead of the log-mel padded with 0."""
    from asr_server.engine.whisper import MAX_FRAMES

    class SilencePadded(engine_class):  # type: ignore[misc,valid-type]
        def _features(self, requests):  # type: ignore[no-untyped-def]
            fe = self._model.feature_extractor
            hop = fe.hop_length
            shortest = max(self._min_frames[r.kind] for r in requests)
            window = min(MAX_FRAMES, max(shortest, max(r.audio.size // hop for r in requests)))
            frames = [min(r.audio.size // hop, MAX_FRAMES) for r in requests]
            batch = np.stack(
                [
                    fe(r.audio, padding=max(hop, (window + 1) * hop - r.audio.size))[:, :window]
                    for r in requests
                ]
            )
            return np.ascontiguousarray(batch, dtype=np.float32), frames

    return SilencePadded


def run_variant(
    name: str, items: list[Item], a: argparse.Namespace, model, cache: dict[str, str]
) -> dict[str, object]:  # type: ignore[no-untyped-def]
    from asr_server.engine.whisper import WhisperEngine

    variant = BY_NAME[name]
    engine_class = (
        WhisperEngine if variant.mel_padding == "zeros" else silence_padded(WhisperEngine)
    )
    if variant.timestamps:
        engine_class = with_timestamps(engine_class)
    engine = engine_class(
        model,
        workers=1,
        cpu_threads=a.threads,
        min_window_s=variant.partial_window_s,
        final_min_window_s=variant.final_window_s,
        final_beam_size=variant.final_beam,
    )
    sim = Simulator(engine, variant.options)
    offline_model = None
    rows, off_rows, shown = [], [], []
    t0 = time.monotonic()
    for item in items:
        for ch, audio in channel_audio(item, a.telephone).items():
            ref = references(item)[ch]
            hyp = " ".join(sim.run(audio))
            # keyed by the audio itself: a change in how recordings are heard (the
            # server's resampler, 2026-12-05) must not reuse texts of other audio
            key = f"{a.model}|{item.id}|{ch}|{hashlib.sha1(audio.tobytes()).hexdigest()[:16]}"
            if key not in cache:
                if offline_model is None:
                    from faster_whisper import WhisperModel

                    offline_model = WhisperModel(
                        model.path_or_id, device="cpu", compute_type="int8"
                    )
                cache[key] = offline_text(offline_model, audio)
            rows.append((item.source, ref, hyp))
            off_rows.append((item.source, ref, cache[key]))
            if normalize(hyp) != normalize(cache[key]):
                shown.append((item.id, normalize(ref), normalize(hyp), normalize(cache[key])))
    if a.show:
        for item_id, ref, hyp, off in shown:
            print(
                f"[{name}] {item_id}\n  ref:     {ref}\n  stream:  {hyp}\n  offline: {off}",
                file=sys.stderr,
            )
    return {
        "wall_s": round(time.monotonic() - t0, 1),
        "carry_fallbacks": sim.fallbacks,
        "finals_without_speech": sim.no_speech,
        "looped_tails_trimmed": sim.looped_tails,
        "wer": round(wer([r for _, r, _ in rows], [h for _, _, h in rows]), 4),
        "offline_wer": round(wer([r for _, r, _ in off_rows], [h for _, _, h in off_rows]), 4),
        "wer_by_source": by_source(rows),
        "offline_wer_by_source": by_source(off_rows),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ids", help="only recordings whose id matches this regular expression")
    p.add_argument("--limit", type=int)
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--telephone", action="store_true", help="as 8 kHz mu-law phone lines")
    p.add_argument(
        "--variant",
        action="append",
        choices=sorted(BY_NAME),
        help="only these (repeatable); all but VARIANTS run only when named",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads per decode: 1, as the server's workers (2 until 2026-12-04)",
    )
    p.add_argument("--offline-cache", type=Path, default=Path("/tmp/streamasr-offline.json"))
    p.add_argument("--json", type=Path)
    p.add_argument("--show", action="store_true", help="print texts that differ from offline")
    a = p.parse_args()

    from asr_server.engine.models import resolve_model

    model = resolve_model(a.model, Path.home() / ".cache" / "streamasr")
    items = load_items(a.limit, a.ids)
    cache = json.loads(a.offline_cache.read_text()) if a.offline_cache.exists() else {}
    figures: dict[str, object] = {"model": a.model, "telephone": a.telephone}
    for name in a.variant or VARIANTS:
        figures[name] = run_variant(name, items, a, model, cache)
        a.offline_cache.write_text(json.dumps(cache))
        print(name, json.dumps(figures[name]), file=sys.stderr)
    print(json.dumps(figures, indent=2))
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
