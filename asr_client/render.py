"""Show recognition events: live lines on a terminal, plain lines in a pipe, JSON lines on request.

On a terminal each channel gets one line that partials rewrite in place (stable text
normal, the unstable tail dimmed) and every final is printed above them for good. In a
pipe only finals are printed, one per line, so ``asr-client file x.wav > out.txt`` gives
a clean transcript.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import IO, Any

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from asr_api.v1 import asr_pb2
from asr_client.api import SPEECH_EVENT_TYPES, TURN_END_REASONS, speech_event_utterance

Response = asr_pb2.StreamingRecognizeResponse


#: a final's confidence under which the live view says the model is unsure of it (with
#: tiny.en the least sure quarter, which holds most errors: README, "Confidence")
UNSURE_BELOW = 0.6


def clock(seconds: float) -> str:
    """``mm:ss.d`` (``h:mm:ss.d`` past an hour) for stream audio time."""
    tenths = max(0, round(seconds * 10))
    minutes, tenths = divmod(tenths, 600)
    hours, minutes = divmod(minutes, 60)
    body = f"{minutes:02d}:{tenths // 10:02d}.{tenths % 10}"
    return f"{hours}:{body}" if hours else body


def final_line(result: asr_pb2.Result) -> str:
    """``[00:03.2-00:07.9] ch0  text``: the one line a final result becomes."""
    return f"[{clock(result.start_s)}-{clock(result.end_s)}] ch{result.channel}  {result.text}"


def words_line(result: asr_pb2.Result) -> str:
    """The indented line under a final with word timestamps: ``word@start-end`` each."""
    return "    " + " ".join(
        f"{w.word.strip()}@{w.start_s:.2f}-{w.end_s:.2f}" for w in result.words
    )


def turn_end_label(turn: asr_pb2.EndOfTurn) -> str:
    """What ended a turn, in a few words: ``model, 93 % sure``, ``longest pause``,
    ``finalize``, ``end of audio`` (``the server`` from one that predates the reason)."""
    reason = TURN_END_REASONS.get(turn.reason, "")
    if reason == "model":
        return f"model, {round(turn.probability * 100)} % sure"
    labels = {"max_silence": "longest pause", "end_of_audio": "end of audio"}
    return labels.get(reason, reason or "the server")


def event_type(response: Response) -> str:
    """speech_started, speech_ended, speech_resumed, no_words, finalized, end_of_turn,
    going_away, partial, eager, final, or progress (only progress: mid-stream in a long
    silence, and the stream's last response)."""
    if response.HasField("end_of_turn"):
        return "end_of_turn"
    if response.HasField("going_away"):
        return "going_away"
    if response.HasField("speech_event"):
        return SPEECH_EVENT_TYPES.get(response.speech_event.type, "speech_event")
    if not response.HasField("result"):
        return "progress"
    if response.result.is_final:
        return "final"
    return "eager" if response.result.eager else "partial"


def result_record(result: asr_pb2.Result) -> dict[str, Any]:
    # explicit fields rather than MessageToDict: that one drops zero values and
    # renames to camelCase, which makes the records awkward to consume
    record: dict[str, Any] = {
        "text": result.text,
        "stable_text": result.stable_text,
        "unstable_text": result.unstable_text,
        "stability": round(result.stability, 4),
        "start_s": round(result.start_s, 3),
        "end_s": round(result.end_s, 3),
        "utterance_id": result.utterance_id,
        "channel": result.channel,
        "language": result.language,
        "from_finalize": result.from_finalize,
        "confidence": round(result.confidence, 4),
        "words": [
            {
                "word": w.word,
                "start_s": round(w.start_s, 3),
                "end_s": round(w.end_s, 3),
                "probability": round(w.probability, 4),
            }
            for w in result.words
        ],
    }
    # only where the server sets them (README, "API summary"): 0 elsewhere means nothing
    if result.is_final:
        record["language_probability"] = round(result.language_probability, 4)
    if result.eager:
        record["turn_probability"] = round(result.turn_probability, 4)
    return record


def event_record(response: Response, *, recv_time: float, t: float) -> dict[str, Any]:
    """One ``--json-out`` line: type, receive times, the event's fields and the progress."""
    record: dict[str, Any] = {"type": event_type(response), "recv_time": recv_time, "t": t}
    event = response.WhichOneof("event")
    if event in ("speech_event", "end_of_turn"):
        ev = getattr(response, event)
        # null: a FINALIZED on a channel that has had no utterance yet
        utterance = speech_event_utterance(ev) if event == "speech_event" else ev.utterance_id
        record.update(offset_s=round(ev.offset_s, 3), channel=ev.channel, utterance_id=utterance)
        if event == "end_of_turn":
            record["probability"] = round(ev.probability, 4)
            record["reason"] = TURN_END_REASONS.get(ev.reason, "")
        elif ev.type == asr_pb2.SpeechEvent.SPEECH_ENDED:
            record["from_finalize"] = ev.from_finalize
    elif event == "going_away":
        going = response.going_away
        record.update(deadline_s=round(going.deadline_s, 3), reason=going.reason)
    elif event == "result":
        record.update(result_record(response.result))
    p = response.progress
    record["progress"] = {
        "audio_received_s": round(p.audio_received_s, 3),
        "audio_processed_s": round(p.audio_processed_s, 3),
        "lag_s": round(p.lag_s, 3),
    }
    return record


class JsonLines:
    """Writes one JSON object per line, flushed at once so ``tail -f`` and pipes see it live."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out

    def write(self, record: dict[str, Any]) -> None:
        self._out.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._out.flush()


class Renderer:
    """Does nothing: the base for the real ones and the renderer of ``--quiet``."""

    def event(self, response: Response) -> None:
        pass

    def __enter__(self) -> Renderer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class PlainRenderer(Renderer):
    """Finals as plain lines; with ``verbose`` also partials and speech events."""

    def __init__(self, out: IO[str], *, verbose: bool = False) -> None:
        self._out = out
        self._verbose = verbose

    def event(self, response: Response) -> None:
        kind = event_type(response)
        if kind == "final":
            line = final_line(response.result)
            if response.result.words:
                line += "\n" + words_line(response.result)
        elif not self._verbose or kind in ("progress", "going_away"):
            return  # a going-away is told by the resume that follows it
        elif kind in ("partial", "eager"):
            r = response.result
            mark = "~" if kind == "partial" else "?"  # eager: final unless speech resumes
            line = f"[{clock(r.start_s)}-{clock(r.end_s)}] ch{r.channel} {mark} {r.text}"
        elif kind == "end_of_turn":
            ev = response.end_of_turn
            line = f"[{clock(ev.offset_s)}] ch{ev.channel}  (end of turn: {turn_end_label(ev)})"
        else:
            ev = response.speech_event
            line = f"[{clock(ev.offset_s)}] ch{ev.channel}  ({kind.replace('_', ' ')})"
        self._out.write(line + "\n")
        self._out.flush()


class Tee(Renderer):
    """Shows every event with each of several renderers, in order."""

    def __init__(self, *renderers: Renderer) -> None:
        self._renderers = renderers

    def event(self, response: Response) -> None:
        for renderer in self._renderers:
            renderer.event(response)

    def __enter__(self) -> Tee:
        for renderer in self._renderers:
            renderer.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for renderer in reversed(self._renderers):
            renderer.__exit__(*exc)


class LiveRenderer(Renderer):
    """One live line per channel for the utterance in progress; finals printed above them.

    ``footer`` adds a last live line (the microphone's level meter); ``refresh()`` redraws
    when what it shows changes between events.
    """

    def __init__(self, console: Console, *, footer: Callable[[], Text] | None = None) -> None:
        self._partials: dict[int, asr_pb2.Result] = {}
        # SEMANTIC streams: each EndOfTurn until its final, which then says what ended it
        self._turn_ends: dict[tuple[int, int], asr_pb2.EndOfTurn] = {}
        self._last_final: dict[int, int] = {}  # per channel, the utterance last shown final
        # per channel, the latest utterance whose turn end is on screen: a resumed stream
        # sends a turn's end again when the old call may not have delivered it
        self._turn_shown: dict[int, int] = {}
        self._lag_s = 0.0
        self._footer = footer
        # transient: the live lines vanish at the end, leaving only the finals on screen
        self._live = Live(console=console, auto_refresh=False, transient=True)

    def __enter__(self) -> LiveRenderer:
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.stop()

    def refresh(self) -> None:
        self._live.update(self._view(), refresh=True)

    def note(self, message: str) -> None:
        """A dim line printed above the live lines, for messages that are not results."""
        self._live.console.print(Text(message, style="dim"))

    def event(self, response: Response) -> None:
        self._lag_s = response.progress.lag_s
        kind = event_type(response)
        r = response.result
        if kind in ("partial", "eager"):
            self._partials[r.channel] = r
        elif kind == "final":
            self._drop_partial(r.channel, lambda u: u <= r.utterance_id)
        elif kind == "no_words":  # a noise's partial: no final will replace it
            e = response.speech_event
            self._turn_ends.pop((e.channel, e.utterance_id), None)
            self._drop_partial(e.channel, lambda u: u == e.utterance_id)
        elif kind == "end_of_turn":
            e = response.end_of_turn
            if e.utterance_id <= self._turn_shown.get(e.channel, -1):
                return  # shown already (sent again after a resume)
            if e.utterance_id > self._last_final.get(e.channel, -1):
                self._turn_ends[e.channel, e.utterance_id] = e
            else:  # its final came first (the proto allows it): say so under it
                note = f"[{clock(e.offset_s)}] ch{e.channel}  ⏎ end of turn: {turn_end_label(e)}"
                self._live.console.print(Text(note, style="dim"))
                self._turn_shown[e.channel] = e.utterance_id
            return
        elif kind in ("progress", "going_away"):
            return
        # redraw before printing: printing redraws the last drawn live lines, and the
        # utterance that just became final must no longer be among them
        self._live.update(self._view(), refresh=True)
        if kind != "final":
            return
        # Text, not a markup string: transcripts can contain "[music]" and the like
        line = Text(final_line(r))
        self._last_final[r.channel] = max(r.utterance_id, self._last_final.get(r.channel, -1))
        turn_end = self._turn_ends.pop((r.channel, r.utterance_id), None)
        if turn_end is not None:
            line.append(f"  ⏎ end of turn: {turn_end_label(turn_end)}", style="dim")
            self._turn_shown[r.channel] = r.utterance_id
        elif r.from_finalize:
            line.append("  ⏎ finalized", style="dim")
        if 0.0 < r.confidence < UNSURE_BELOW:
            line.append(f"  (unsure: {round(r.confidence * 100)} %)", style="yellow")
        self._live.console.print(line)
        if r.words:
            self._live.console.print(Text(words_line(r), style="dim"))

    def _drop_partial(self, channel: int, of: Callable[[int], bool]) -> None:
        """The channel's live line goes if its utterance is ``of`` those that ended: a
        final replaces its own utterance's partial (and an older one's), never the next
        utterance's, which may already be under way (a split at a pause)."""
        shown = self._partials.get(channel)
        if shown is not None and of(shown.utterance_id):
            del self._partials[channel]

    def _view(self) -> Group:
        lines = [
            Text.assemble(
                (f"ch{channel}  ", "bold"),
                r.stable_text,
                # the server sends the two parts without the space that joins them
                " " if r.stable_text and r.unstable_text else "",
                (r.unstable_text, "dim"),
            )
            for channel, r in sorted(self._partials.items())
        ]
        lines.append(Text(f"lag {self._lag_s:.1f} s", style="dim"))
        if self._footer is not None:
            lines.append(self._footer())
        return Group(*lines)


def make_renderer(
    out: IO[str],
    *,
    quiet: bool = False,
    verbose: bool = False,
    footer: Callable[[], Text] | None = None,
) -> Renderer:
    """Live on a terminal, plain lines otherwise, nothing when quiet."""
    if quiet:
        return Renderer()
    if out.isatty():
        return LiveRenderer(Console(file=out, highlight=False), footer=footer)
    return PlainRenderer(out, verbose=verbose)
