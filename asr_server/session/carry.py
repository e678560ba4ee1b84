"""The previous final carried into the next: a phrase cut at a pause is decoded after
what came before it, and the checks that decide whether the carried decode is trusted.

A final is decoded after the previous final's audio, with that final's text forced as
the prefix (docs/accuracy.md). Whisper now and then stops right after a forced
prefix, skips what follows it, or hears other words in another speaker's context; the
checks here compare the carried final with the utterance's partial, which heard it
alone (the latest partial, unless it stopped short: ``UtteranceState.hear``), and say
when it must be decoded again alone and which of the two is kept.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from difflib import SequenceMatcher

import numpy as np

from asr_server.engine.base import Hypothesis, WordTiming
from asr_server.engine.text import looped_tail, same_word, spoken_words
from asr_server.session.utterance import SAMPLE_RATE

CLOSING_PUNCTUATION = ".,;:!?…"
#: a carried final with fewer words than this share of the partial's (rounded)
#: lost some (with more than 1.25 times as many and 2, for the same length of audio, it
#: read something twice): it is decoded again without the carry
CARRY_MIN_KEPT = 0.6
#: a carried final with this many words the partial does not have is decoded
#: alone too (see Carry.doubtful for which one is kept)
CARRY_DOUBT_WORDS = 3
#: ... if that partial heard at least this share of the utterance's audio: one of its
#: first tenth of a second ("Thank you." for 0.12 s of 1.6) has no say on the rest
DOUBT_MIN_HEARD_SHARE = 0.5
#: a carried final that begins with the carried passage's last this-many words, where
#: the partial does not, read them again (see Carry.restarts)
RESTART_WORDS = 2
#: how alike (difflib's ratio) the letters of words a partial heard at a cut inside a word
#: must be to the end of the word the previous final ended with, to be its rest
CUT_REST_LIKENESS = 0.6


def spells_out(heard: list[str], words: list[str]) -> bool:
    """``words`` begin with every letter and digit of ``heard``, written as fewer words:
    the partial's digits grouped into a numeral ("01803" for "0 1 8 0"). Counted in
    words that looks like words lost; nothing is."""
    said = "".join(heard)
    return bool(said) and "".join(words).startswith(said)


def read_alike(heard: list[str], words: list[str]) -> list[int]:
    """Indices of ``words`` that read what ``heard`` does another way, in order: the same
    letters split otherwise ("may be" / "maybe"), or a word that begins with another of
    at least SAME_STEM_LETTERS letters ("considered" / "consider")."""
    if "".join(heard) == "".join(words):
        return list(range(len(words)))
    alike: list[int] = []
    i = j = 0
    while i < len(heard) and j < len(words):
        if j + 1 < len(words) and words[j] + words[j + 1] == heard[i]:
            alike += [j, j + 1]  # two words heard as one
            i, j = i + 1, j + 2
            continue
        if i + 1 < len(heard) and heard[i] + heard[i + 1] == words[j]:
            alike.append(j)  # one word heard as two
            i, j = i + 2, j + 1
            continue
        for k in range(i, len(heard)):
            if same_word(heard[k], words[j]):
                alike.append(j)
                i = k + 1
                break
        j += 1
    return alike


@dataclass(frozen=True)
class Carry:
    """The previous final's audio and text. The next final is decoded after them (the
    text forced as a prefix): a phrase cut at a pause is heard with what came before it,
    as offline decoding hears it, instead of alone ("ask not" after JFK's pause)."""

    audio: np.ndarray
    end_sample: int
    text: str
    language: str
    #: a finalize ended it with speech still going (a push-to-talk release mid-word)
    cut_in_speech: bool = False

    @property
    def duration_s(self) -> float:
        return self.audio.size / SAMPLE_RATE

    @property
    def forced(self) -> str:
        """The text forced ahead of the next utterance: without its closing punctuation,
        which would tell the model a sentence ended where it may go on (after "…led me to
        leave." it dropped "my native country" that continued it)."""
        return self.text.rstrip(CLOSING_PUNCTUATION)

    def went_wrong(self, carried: Hypothesis, heard: list[str], heard_share: float = 1.0) -> bool:
        """Whisper now and then ends right after a forced prefix, skips what follows it,
        or reads the carried passage again before the new one. ``carried``: the stripped
        hypothesis; ``heard``: the ``spoken_words`` of the utterance's partial (none: no
        partial), which heard ``heard_share`` of its audio (a partial of the first half
        has about half the words)."""
        return (
            carried.rejected
            or self.lost_words(carried, heard)
            or self.wordier_than_heard(carried, heard, heard_share)
            or self.rereads(carried)
            or self.skips_heard_start(carried, heard)
        )

    def skips_heard_start(self, carried: Hypothesis, heard: list[str]) -> bool:
        """It lacks the first word or two of the partial (``heard``), which heard this
        utterance alone, and begins with the partial's next three: Whisper, forced
        through the carried text, skipped a word after it ("…differs from most" cut by
        a finalize, then "not from all the arts" where the partial read "if not from
        all the arts"; a reviewer). Not where the partial's first words are the carried
        text's last: it read the carried end, not a word of this utterance."""
        words = spoken_words(carried.text)
        if len(heard) < 4 or len(words) < 3:
            return False
        before = spoken_words(self.text)
        return any(heard[k : k + 3] == words[:3] and heard[:k] != before[-k:] for k in (1, 2))

    @staticmethod
    def lost_words(carried: Hypothesis, heard: list[str]) -> bool:
        """Fewer words than CARRY_MIN_KEPT of the partial's (not the partial's digits
        written as one numeral)."""
        words = spoken_words(carried.text)
        return len(words) < round(len(heard) * CARRY_MIN_KEPT) and not spells_out(heard, words)

    @staticmethod
    def wordier_than_heard(carried: Hypothesis, heard: list[str], heard_share: float) -> bool:
        """More words than the partial allows for the audio it heard: read something
        twice; or digits the partial wrote as one numeral, written apart (the decode
        alone writes numerals as a reader wants them, "90210"). Or the partial stopped
        short: Whisper's greedy decode now and then ends after a word or two ("The" for
        1.9 s of "the aforementioned Gutenberg Bible"), which ``reads_no_more_alone``
        tells once the decode alone is back."""
        n, words = len(heard), spoken_words(carried.text)
        return bool(n) and len(words) > n / max(heard_share, 0.1) * 1.25 + 2

    def rereads(self, carried: Hypothesis) -> bool:
        """It begins with three words of the carried passage: reading it again."""
        words, before = spoken_words(carried.text), spoken_words(self.text)
        return len(words) >= 3 and any(
            before[i : i + 3] == words[:3] for i in range(len(before) - 2)
        )

    def only_wordier_than_heard(
        self, carried: Hypothesis, heard: list[str], heard_share: float = 1.0
    ) -> bool:
        """``misread`` for no other reason than ``wordier_than_heard`` (which a rejected
        hypothesis, without words, or one that lost words, never is)."""
        return self.wordier_than_heard(carried, heard, heard_share) and not (
            self.rereads(carried)
            or self.restarts(carried, heard)
            or self.reads_its_end_twice(carried, heard)
        )

    @staticmethod
    def reads_no_more_alone(carried: Hypothesis, alone: Hypothesis | None) -> bool:
        """After ``only_wordier_than_heard``: the decode alone, which has no carried
        passage to read again, has at least as many words as the carried one, so the
        carried one read nothing twice and it was the partial that stopped short. The
        carried one stands then: its context is what carrying is for (alone,
        "the aforementioned Gutenberg Bible" was "The afore said Guttenberg Bible").
        Digits written apart are more words than the numeral alone writes: alone wins."""
        if alone is None or alone.rejected:
            return False
        return len(spoken_words(alone.text)) >= len(spoken_words(carried.text))

    def keeps_carried(
        self,
        carried: Hypothesis,
        alone: Hypothesis | None,
        heard: list[str],
        heard_share: float,
        misread: bool,
    ) -> bool:
        """Once a carried final that was ``misread`` or ``doubtful`` has been decoded
        again ``alone``: whether the carried one stands. A misread one only if the partial
        merely stopped short (``only_wordier_than_heard``, ``reads_no_more_alone``); a
        doubtful one unless alone reads what the partials did (``alone_is_right``)."""
        if misread:
            return self.only_wordier_than_heard(
                carried, heard, heard_share
            ) and self.reads_no_more_alone(carried, alone)
        return not self.alone_is_right(alone, heard)

    def alone_reads_the_carried_end(self, alone: Hypothesis | None) -> bool:
        """The decode alone reads nothing but the carried passage's last word or two.
        After a finalize cut inside a word (``cut_in_speech``), an utterance that begins
        at the cut holds the rest of that word, which the previous final read whole:
        the carried decode rightly has no new words, and alone "-sed" is "used." again
        ("…are used. used.", the finalize bench at a cut every 1.6 s). Not taken for a
        word after a pause: a speaker may say it again ("…processing? … Processing.")."""
        if alone is None or alone.rejected:
            return False
        words = spoken_words(alone.text)
        tail = spoken_words(self.text)[-len(words) :] if words else []
        return 0 < len(words) <= RESTART_WORDS and tail == words

    def heard_past_the_cut(self, carried: Hypothesis, heard: list[str]) -> list[str]:
        """For an utterance that begins at a finalize's cut inside a word
        (``cut_in_speech``): its partials, decoded without the carried passage, may hear
        the rest of that word as a word or two of its own ("-quisite" read "is it"),
        where the carried decode reads on from the whole word ("…Mason's exquisite" /
        "itals are as…"). ``heard`` without those first words, when what follows them is
        the carried decode's first word and they spell about the end of the carried
        passage's last word; as it is otherwise. (Taken as words the carried decode
        skipped, they made it look wrong, and the decode alone, "is it itals are…", was
        kept: a resume reviewer's push-to-talk read, cut after a finalize. A real word
        the carried decode skipped, "if" after "…differs from most", spells no such end,
        and still counts: skips_heard_start.)"""
        words = spoken_words(carried.text)
        if not words or not heard or heard[0] == words[0]:
            return heard
        for k in range(1, min(RESTART_WORDS, len(heard) - 1) + 1):
            if heard[k] == words[0]:
                return heard[k:] if self._spells_its_last_words_end(heard[:k]) else heard
        return heard

    def _spells_its_last_words_end(self, words: list[str]) -> bool:
        """``words``, their letters run together, read about like the end of the carried
        passage's last word ("is it" / "exquisite": "isit" against "isite")."""
        carried = spoken_words(self.text)
        last = "".join(c for c in carried[-1] if c.isalpha()) if carried else ""
        rest = "".join(c for w in words for c in w if c.isalpha())
        if not last or not rest:
            return False
        ends = (last[-n:] for n in range(max(1, len(rest) - 1), len(rest) + 3))
        return max(SequenceMatcher(None, rest, end).ratio() for end in ends) >= CUT_REST_LIKENESS

    def misread(self, carried: Hypothesis, heard: list[str], heard_share: float = 1.0) -> bool:
        """The carried decode went wrong in one of the ways below, and this utterance must
        be decoded again alone: it lost words or read the carried passage again
        (``went_wrong``), went back over the carried end (``restarts``) or looped at its
        own (``reads_its_end_twice``). ``heard``: the partial's ``spoken_words``,
        which heard ``heard_share`` of this utterance's audio."""
        return (
            self.went_wrong(carried, heard, heard_share)
            or self.restarts(carried, heard)
            or self.reads_its_end_twice(carried, heard)
        )

    def restarts(self, carried: Hypothesis, heard: list[str]) -> bool:
        """It begins by reading the carried passage's last RESTART_WORDS words again,
        and the partial (its ``spoken_words`` ``heard``), which heard this
        utterance alone, does not begin with them: Whisper, forced through the carried
        text, went back over its end ("But the first Bible actually dated," then
        "actually dated, and also was printed…" for "which also was printed…"; LJ
        Speech, split at a pause). Three words of the carried passage are caught by
        ``went_wrong`` wherever they come from; two only at its very end, and only
        where the partial says the speaker did not say them again."""
        end = spoken_words(self.text)[-RESTART_WORDS:]
        begins = spoken_words(carried.text)[:RESTART_WORDS]
        return (
            bool(heard)
            and len(end) == RESTART_WORDS
            and begins == end
            and heard[:RESTART_WORDS] != end
        )

    @staticmethod
    def reads_its_end_twice(carried: Hypothesis, heard: list[str]) -> bool:
        """Its last words were read just before too, more often than the partials, which
        heard the utterance alone, have them (``looped_tail``): Whisper, forced through a
        long carried passage, looped at the end ("simpler, rounder" read as "simpler,
        simpler"; "not only by Schoeffer" as "not only by chauffeur, not only by"; 231 s
        of LJ Speech split at its pauses). A repeat the partials have too is the
        speaker's ("very, very")."""
        return looped_tail(carried.text, heard) > 0

    @staticmethod
    def agreement(hyp: Hypothesis, heard: list[str]) -> tuple[int, int]:
        """(words of ``hyp`` the partial's ``spoken_words`` ``heard`` also have, in order;
        words of ``hyp`` up to its last such word that they do not have). A word read
        two ways is had: as one word or two ("maybe", "may be"), or with another ending
        ("consider", "considered"; see ``read_alike``)."""
        words = spoken_words(hyp.text)
        had = [False] * len(words)
        matcher = SequenceMatcher(None, heard, words, autojunk=False)
        for tag, a1, a2, b1, b2 in matcher.get_opcodes():
            if tag == "equal":
                had[b1:b2] = [True] * (b2 - b1)
            elif tag == "replace":
                for j in read_alike(heard[a1:a2], words[b1:b2]):
                    had[b1 + j] = True
        matched = sum(had)
        span = max((j + 1 for j, h in enumerate(had) if h), default=len(words))
        return matched, span - matched

    def doubtful(self, carried: Hypothesis, heard: list[str], heard_share: float = 1.0) -> bool:
        """The carried final reads this utterance unlike the partials, which heard it
        alone: CARRY_DOUBT_WORDS or more of its words, before the last one they share, are
        not theirs. Carrying mends a word or two at a cut ("S not" -> "ask not"), now and
        then a name ("In which way in time at patterns" -> "Twainheim and Panert", LJ
        Speech); in another speaker's context Whisper can instead hear other words
        ("ladies and gentlemen" -> "they didn't get to me", the Picovoice clip on a phone
        line). The final decoded alone decides: it replaces the carried one only if it
        reads every word the partials did, and nothing else before the last of them.
        (The partial covers less audio than the final: new words at its end are not held
        against it; and one that heard less than DOUBT_MIN_HEARD_SHARE of the audio does
        not judge it at all.)"""
        return (
            bool(heard)
            and heard_share >= DOUBT_MIN_HEARD_SHARE
            and self.agreement(carried, heard)[1] >= CARRY_DOUBT_WORDS
        )

    def alone_is_right(self, alone: Hypothesis | None, heard: list[str]) -> bool:
        """After ``doubtful``: the final decoded alone reads exactly what the partials
        ``heard`` (see there); otherwise the carried one stands."""
        if alone is None or alone.rejected:
            return False
        return self.agreement(alone, heard) == (len(heard), 0)

    def strip(self, hyp: Hypothesis) -> Hypothesis:
        """``hyp`` without the carried words (and their timing)."""
        forced = self.forced
        if not hyp.text.startswith(forced):  # the engine did not keep the prefix verbatim
            return dataclasses.replace(hyp, text="", words=[], rejected=True)
        # the punctuation the model put where the carried text ends belongs to it
        text = hyp.text[len(forced) :].lstrip(CLOSING_PUNCTUATION + " ").strip()
        if hyp.rejected or not text:
            return dataclasses.replace(hyp, text="", words=[], rejected=True)
        # the carried words by their characters, not by count: the aligner splits some
        # text words ("up-gards" -> "up", "-gards"; "i.e." -> "i", ".e."), and counting
        # kept the previous final's last word at the head of this one's words
        carried, at, n = len("".join(forced.split())), 0, 0
        while n < len(hyp.words) and at < carried:
            at += len("".join(hyp.words[n].word.split()))
            n += 1
        shift = self.duration_s
        words = [
            WordTiming(
                w.word, max(0.0, w.start_s - shift), max(0.0, w.end_s - shift), w.probability
            )
            for w in hyp.words[n:]
        ]
        # the carried text ended inside a word (a FINALIZE cut "Godspeed": the previous
        # final read "God", this one "speed."): the word the model read across the cut
        # is timed once, among the carried words; its rest is this final's first word
        if at > carried and n > 0:
            straddling = hyp.words[n - 1]
            rest = "".join(straddling.word.split())[-(at - carried) :]
            rest = rest.lstrip(CLOSING_PUNCTUATION)
            if rest and "".join(text.split()).startswith(rest):
                end = max(0.0, straddling.end_s - shift)
                words.insert(0, WordTiming(rest, 0.0, end, straddling.probability))
        return dataclasses.replace(hyp, text=text, words=words)


class ReplayedFinal:
    """A resumed channel's last final, in the audio its client replays
    (``ChannelStart.previous_samples``): collected as it arrives, then carried into the
    channel's next final as on the uncut stream (docs/scale-out.md)."""

    def __init__(self, start_sample: int, end_sample: int) -> None:
        self.start_sample = start_sample
        self.end_sample = end_sample
        self._parts: list[np.ndarray] = []

    def collect(self, first_sample: int, samples: np.ndarray) -> np.ndarray | None:
        """Keeps what of ``samples`` (its first at ``first_sample``) falls in the final;
        the final's whole audio once its end has arrived, else None."""
        lo = max(self.start_sample, first_sample)
        hi = min(self.end_sample, first_sample + samples.size)
        if lo < hi:
            self._parts.append(samples[lo - first_sample : hi - first_sample].copy())
        if first_sample + samples.size < self.end_sample:
            return None
        return np.concatenate(self._parts) if self._parts else np.zeros(0, np.float32)
