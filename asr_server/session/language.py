"""Which language a channel is decoded in: found once, then kept.

Whisper detects a language from each piece of audio it is given. Per utterance that flips:
a short or unclear utterance of Spanish comes out as Portuguese, in Portuguese words. Hosted
speech APIs keep a stream's language instead, and so does this: the first finals' detection
scores (weighted by how much speech they hold) pick the language once there is enough speech,
and from then on every partial and final is decoded in it. A different language takes over
only on strong, sustained evidence: finals in a row whose detection puts it first, together
worth ``switch_evidence_s`` of confident speech; the final that completes that evidence is
decoded in the new language, so a stream that really changes language changes at the
utterance where the change became clear, and never back and forth.

A language set in the stream's config is used as it is, with no detection. An allowed list
(``StreamConfig.languages``) restricts detection to those languages; the engine renormalizes
its scores over them.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

#: BCP-47 primary subtags Whisper spells otherwise (Google's Mandarin tag, Norwegian
#: Bokmål, the legacy ISO 639 codes, Javanese, Filipino)
WHISPER_SPELLING = {
    "cmn": "zh",
    "nb": "no",
    "iw": "he",
    "ji": "yi",
    "in": "id",
    "jv": "jw",
    "fil": "tl",
}


def language_code(tag: str) -> str:
    """A BCP-47 tag as the model's language code: its primary subtag, so ``en-US`` (what
    clients of Google's, Riva's and Deepgram's APIs send) is ``en``, in Whisper's spelling
    (``cmn-Hans-CN`` is ``zh``); Whisper's own codes (``en``, ``haw``, ``jw``) stay."""
    primary = tag.strip().replace("_", "-").split("-")[0].lower()
    return WHISPER_SPELLING.get(primary, primary)


#: (language code, probability) pairs, most likely first, as the engine reports them
Scores = Sequence[tuple[str, float]]


@dataclass(frozen=True)
class LanguagePolicy:
    #: speech (seconds of final audio, weighted by detection probability) before a
    #: language is kept
    keep_after_s: float = 1.5
    #: confident speech of one other language, in finals in a row, before it takes over
    switch_evidence_s: float = 2.0
    #: ... and the final that completes it must give that language at least this
    switch_probability: float = 0.8


class LanguageTracker:
    def __init__(
        self,
        forced: str | None = None,
        *,
        kept: str | None = None,
        policy: LanguagePolicy | None = None,
    ) -> None:
        self.forced = forced
        self.kept = forced or kept  # a resumed stream brings the language it had
        self.policy = policy or LanguagePolicy()
        self._evidence: defaultdict[str, float] = defaultdict(float)  # before keeping one
        self._challenger: tuple[str, float] | None = None  # (language, evidence) since kept

    @property
    def detecting(self) -> bool:
        """Finals need detection scores (no language set in the config)."""
        return self.forced is None

    def decode_language(self) -> str | None:
        """The language to decode a partial in (None: let the engine detect)."""
        if self.kept is not None:
            return self.kept
        if self._evidence:
            return max(self._evidence.items(), key=lambda kv: kv[1])[0]
        return None

    def final_language(self, scores: Scores, speech_s: float) -> str | None:
        """The language of a final whose audio (``speech_s`` long) detection scored as
        ``scores``; updates what the channel keeps. None: nothing was detected (a set
        language, an English-only model), the final stays as decoded."""
        if self.forced is not None:
            return self.forced
        if not scores:
            return None
        if self.kept is None:
            for language, p in scores:
                self._evidence[language] += p * speech_s
            best, weight = max(self._evidence.items(), key=lambda kv: kv[1])
            if weight >= self.policy.keep_after_s:
                self.kept = best
                self._evidence.clear()
            return best
        top, p = scores[0]
        if top == self.kept:
            self._challenger = None
            return self.kept
        evidence = p * speech_s
        if self._challenger is not None and self._challenger[0] == top:
            evidence += self._challenger[1]
        self._challenger = (top, evidence)
        if evidence >= self.policy.switch_evidence_s and p >= self.policy.switch_probability:
            self.kept, self._challenger = top, None
        return self.kept

    def peek_final_language(self, scores: Scores, speech_s: float) -> str | None:
        """What ``final_language`` would say of these scores, leaving what the channel
        keeps as it is (an eager result asks before its final is due)."""
        probe = copy.copy(self)
        probe._evidence = defaultdict(float, self._evidence)
        return probe.final_language(scores, speech_s)

    @staticmethod
    def probability(scores: Scores, language: str) -> float:
        return next((p for lang, p in scores if lang == language), 0.0)
