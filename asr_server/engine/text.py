"""Text hygiene after decoding: Whisper's known failure modes, caught cheaply.

Whisper sometimes loops — re-emitting the sentence it just produced, or one
short phrase many times, or starting the utterance over once the speech in its
window has run out — especially on short windows and near trailing silence.
Checks that catch that without re-decoding: the compression ratio of the new
text (Whisper's own test), trailing tandem repeats of words, a tail that re-reads
an earlier passage word for word (``trim_loops``, ``loop_trimmed``); and, against
another decode of the same audio (a final's latest partial), phrases read more
often than that decode read them (``without_unheard_loops``).
"""

from __future__ import annotations

import re
import unicodedata
import zlib
from collections.abc import Iterable, Iterator, Sequence
from difflib import SequenceMatcher

from asr_server.engine.base import WordTiming

#: punctuation that belongs to the previous word ("me ," → "me,") or the next ("( a" → "(a")
_APPEND = set("\"'.。,，!！?？:：”)]}、-")
_PREPEND = set("\"'“¿([{")

_NON_WORD = re.compile(r"[^\w']+")
#: Chinese and Japanese script (Han, kana, their punctuation, full-width forms)
_CJK = "\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"
_SPACE_IN_CJK = re.compile(f"(?<=[{_CJK}])\\s+(?=[{_CJK}])")
#: languages whose text has no spaces between words of their script (Thai, Lao, Khmer,
#: Burmese and Tibetan space phrases apart, and keep them)
CLOSED_UP_LANGUAGES = frozenset({"zh", "yue", "ja"})


def closed_up(text: str, language: str) -> str:
    """``text`` as its language writes it: Chinese and Japanese without the spaces
    Whisper now and then puts between words of their script (base, decoding a 4 s
    Chinese final in the server's 10 s window, wrote "廣州市 佛地產", where in 30 s it
    wrote "廣州市佛地產"; the multilingual reviewer). A space beside a Latin word or a
    digit stays ("iPhone 手机")."""
    return _SPACE_IN_CJK.sub("", text) if language in CLOSED_UP_LANGUAGES else text


#: a phrase of this many words or more repeated back to back is a loop
LONG_REPEAT_WORDS = 3
#: a shorter phrase is a loop only when repeated this many times ("no, no" is speech)
SHORT_REPEAT_COUNT = 4
#: a tail this long that repeats an earlier passage verbatim is a restart, not speech
RESTART_MIN_WORDS = 5
#: a text's last words that were read just before too (see looped_tail): phrases of
#: LOOP_MIN_WORDS to LOOP_MAX_WORDS words with up to LOOP_GAP_WORDS between the two
#: readings, or shorter ones with up to SHORT_LOOP_GAP_WORDS between
LOOP_MIN_WORDS = 3
LOOP_MAX_WORDS = 8
LOOP_GAP_WORDS = 10
SHORT_LOOP_GAP_WORDS = 2
#: a final's tail of this many words or more, after the last word another decode of the
#: same audio has too, that re-reads the passage before it is a loop (see
#: without_reread_tail); one word in REREAD_ALTERED_EVERY of it may read otherwise
REREAD_MIN_WORDS = 3
REREAD_ALTERED_EVERY = 5
#: words a loop cut (trim_loops) that, aligned to the audio, took at least this share of
#: the time per word that as many words before them took, at least SPOKEN_WORD_S each
#: on average and every one at least SHORTEST_SPOKEN_WORD_S (two of the aligner's
#: 20 ms steps), were spoken (see repeat_was_spoken)
SPOKEN_REPEAT_PACE = 0.5
SPOKEN_WORD_S = 0.08
SHORTEST_SPOKEN_WORD_S = 0.04


#: numbers spoken as words; with digits, what a speaker says again and again for real
NUMBER_WORDS = frozenset(
    "zero oh one two three four five six seven eight nine ten double triple".split()
)


def is_numeral(normalized: str) -> bool:
    """A ``normalize_word``: digits ("0", "4444") or a number said as a word."""
    return normalized.isdigit() or normalized in NUMBER_WORDS


def mostly_numerals(normalized: Sequence[str]) -> bool:
    """Half or more of these words are numerals: a PIN ("0 0 0 0"), a card number ("4444
    4444 4444 4444"), a number read back ("5 5 5 1 2 3 4, that's 5 5 5 1 2 3 4"). People
    say those again and again, so their repeats are never taken for Whisper looping
    (a long run of them still fails the compression ratio, Whisper's own test)."""
    return bool(normalized) and 2 * sum(map(is_numeral, normalized)) >= len(normalized)


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / max(1, len(zlib.compress(raw)))


def normalize_word(word: str) -> str:
    """``word`` lower-cased, without what is not part of a word. Combining marks stay
    (Unicode category M: Hindi's vowel signs, Thai's tone marks, a decomposed accent),
    which ``\\w`` leaves out although they tell words apart: "कि", "की" and "को" are not
    "क"."""
    lowered = word.lower()
    if lowered.isascii():
        return _NON_WORD.sub("", lowered)
    return "".join(
        c for c in lowered if not _NON_WORD.fullmatch(c) or unicodedata.category(c).startswith("M")
    )


#: what joins words that are said apart: "fat-mutton" is "fat mutton" in another decode
_JOINER_CHARS = "-\u2010-\u2015/"  # a regular expression's character range
_JOINERS = re.compile(f"[{_JOINER_CHARS}]+")


def spoken_words(text: str) -> list[str]:
    """The words of ``text`` for comparing two readings of the same audio: normalized
    (``normalize_word``), and apart where a hyphen, dash or slash joins them: Whisper
    writes the same speech as "fat-mutton" in one decode and "fat mutton" in another.
    (Numerals stay as written: "90210" and "9 0 2 1 0" differ, and a reader can tell.)"""
    words = (normalize_word(w) for w in _JOINERS.sub(" ", text).split())
    return [w for w in words if w]


def trim_trailing_repeats(words: list[str], protected: int = 0) -> list[str]:
    """Drop trailing back-to-back copies of a phrase, never touching the first ``protected``."""
    words = list(words)
    norm = [normalize_word(w) for w in words]
    changed = True
    while changed:
        changed = False
        n = len(norm)
        for k in range(1, n // 2 + 1):
            tail = norm[n - k :]
            copies = 1
            while n - (copies + 1) * k >= 0 and norm[n - (copies + 1) * k : n - copies * k] == tail:
                copies += 1
            needed = 2 if k >= LONG_REPEAT_WORDS else SHORT_REPEAT_COUNT
            if copies >= needed and any(tail) and not mostly_numerals(tail):
                # remove whole copies only, and none that reaches into the protected words
                removable = min(copies - 1, (n - protected) // k)
                keep = n - removable * k
                if keep < n:
                    del words[keep:]
                    del norm[keep:]
                    changed = True
                    break
    return words


def trim_restarted_passage(words: list[str], protected: int = 0) -> list[str]:
    """Cut a tail that re-reads an earlier passage ("A B A…"): Whisper starting over.

    The earliest cut wins, and the first ``protected`` words are never touched.
    """
    norm = [normalize_word(w) for w in words]
    n = len(norm)
    for p in range(max(1, protected), n - RESTART_MIN_WORDS + 1):
        tail = norm[p:]
        if not all(tail[:RESTART_MIN_WORDS]) or mostly_numerals(tail):
            continue
        for q in range(0, p):
            earlier = norm[q : q + len(tail)]
            # the last word of a restart is often cut off mid-word ("Subiac" for "Subiaco")
            if earlier[:-1] == tail[:-1] and earlier[-1].startswith(tail[-1]):
                return list(words[:p])
    return list(words)


def trim_loops(words: list[str], protected: int = 0) -> list[str]:
    """``trim_trailing_repeats`` and ``trim_restarted_passage`` until neither cuts more:
    a restart cut off can leave back-to-back copies before it ("A B A B" + a restart of
    the passage), and the copies, once trimmed, a restart."""
    while True:
        trimmed = trim_restarted_passage(trim_trailing_repeats(words, protected), protected)
        if trimmed == words:
            return trimmed
        words = trimmed


def repeat_was_spoken(words: Sequence[WordTiming], kept: int) -> bool:
    """Whether the words after the first ``kept`` of ``words`` (a text's words aligned to
    its audio; after ``kept``: what ``trim_loops`` would cut) took the time spoken words
    take: per word, at least SPOKEN_REPEAT_PACE of what as many words before them took,
    and at least SPOKEN_WORD_S; and every one of them some time of its own
    (SHORTEST_SPOKEN_WORD_S). A loop over other speech (crosstalk, another language)
    has a word or two stretched over that speech and the rest given none ("Go" 0.18 s,
    "forward" 0.40 s, "10" 1.78 s, "meters." 0 s, over Mandarin), which the span of the
    copy alone took for spoken.

    A speaker may say a phrase twice ("Ask what you can do for your country. Ask what
    you can do for your country."), which the loop checks cannot tell from Whisper
    reading a phrase again once its audio has run out. The audio can: the aligner gives
    a spoken copy as long as the first (2.4 s against 3.0 s, jfk.flac's phrase said
    twice), and a loop's copy next to none (0.1 s for 8 words, the same phrase once)."""
    removed = words[kept:]
    before = words[max(0, kept - len(removed)) : kept]
    if not removed or not before:
        return False

    def per_word(run: Sequence[WordTiming]) -> float:
        return (run[-1].end_s - run[0].start_s) / len(run)

    pace = per_word(removed)
    return (
        pace >= SPOKEN_WORD_S
        and pace >= SPOKEN_REPEAT_PACE * per_word(before)
        and all(w.end_s - w.start_s >= SHORTEST_SPOKEN_WORD_S for w in removed)
    )


def next_copy_size(words: Sequence[str], kept: int) -> int:
    """How many of ``words`` after the first ``kept`` make the next copy to check: the
    fewest that repeat, back to back, as many just before them ("A B C | A B C A B"
    → 3), else all of them (a restart, "A B C D | A B": 2); 0 when none are left."""
    rest = len(words) - kept
    norm = [normalize_word(w) for w in words]
    for size in range(1, min(rest, kept) + 1):
        if norm[kept : kept + size] == norm[kept - size : kept]:
            return size
    return rest


def timings_of_tokens(words: Sequence[WordTiming], text: str) -> list[WordTiming] | None:
    """The aligned ``words`` joined into ``text.split()``'s tokens (None where they do not
    make them up): the aligner splits a hyphenated word ("flower", "-fattened") that the
    text has as one token."""
    tokens = text.split()
    joined: list[WordTiming] = []
    at = 0
    for token in tokens:
        piece = ""
        first = at
        while at < len(words) and len(piece) < len(token):
            piece += "".join(words[at].word.split())
            at += 1
        if piece != token:
            return None
        part = words[first:at]
        joined.append(
            WordTiming(token, part[0].start_s, part[-1].end_s, min(w.probability for w in part))
        )
    return joined if at == len(words) else None


def trim_dangling_restart(words: list[str]) -> list[str]:
    """Drop the first words of a phrase of LONG_REPEAT_WORDS or more that end ``words``
    right after the whole phrase: what a loop leaves once its copies are trimmed
    ("...produced the block books produced the"; "...an exact imitation, which are an").
    Only for a text known to loop (``loop_trimmed``): in speech it can be a restart."""
    norm = [normalize_word(w) for w in words]
    n = len(norm)
    for j in range(LOOP_MAX_WORDS - 1, 0, -1):  # the longest fragment first
        for k in range(max(j + 1, LONG_REPEAT_WORDS), LOOP_MAX_WORDS + 1):
            if n < k + j:
                break
            phrase = norm[n - j - k : n - j]
            if all(phrase) and norm[n - j :] == phrase[:j]:
                return list(words[: n - j])
    return list(words)


def repeats_back_to_back(words: Sequence[str], min_words: int = LONG_REPEAT_WORDS) -> bool:
    """Whether a phrase of ``min_words`` words or more comes twice in a row anywhere
    ("or cost incurred, or cost incurred"): a loop, where speech says a word or two again
    at most."""
    norm = [normalize_word(w) for w in words]
    return next(_back_to_back(norm, range(min_words, len(norm) // 2 + 1)), None) is not None


def repeated_phrases(words: Sequence[str]) -> list[tuple[int, int]]:
    """(start, length) of each phrase of LONG_REPEAT_WORDS words or more that comes twice
    in a row in ``words`` (as ``text.split()`` has them, compared normalized): where a
    final's text may say what the speaker said twice, or Whisper read twice."""
    norm = [normalize_word(w) for w in words]
    return list(_back_to_back(norm, range(len(norm) // 2, LONG_REPEAT_WORDS - 1, -1)))


def _back_to_back(norm: Sequence[str], lengths: Iterable[int]) -> Iterator[tuple[int, int]]:
    """(start, length) of each phrase of one of ``lengths`` words that comes twice in a
    row in ``norm`` (normalized words), in the order of ``lengths``."""
    for k in lengths:
        for i in range(len(norm) - 2 * k + 1):
            if all(norm[i : i + k]) and norm[i : i + k] == norm[i + k : i + 2 * k]:
                yield i, k


def loop_trimmed(text: str) -> str | None:
    """``text``, a decode whose end looped, cut back to before its loop (``trim_loops``,
    then ``trim_dangling_restart``); None where a loop is left inside it, which only
    decoding again can mend. Whisper loops mostly where its audio runs out
    mid-sentence, a final decoded in a pause: then the text before the loop is the
    transcript, where a decode retried with repeats forbidden loops on with words
    altered ("…therefore far pleasanter—and therefore far plesinter, therefore far
    pleasure—and"; 231 s of LJ Speech, 2026-12-03)."""
    words = trim_dangling_restart(trim_loops(text.split()))
    if not words or repeats_back_to_back(words):
        return None
    return " ".join(words)


#: a decode that only reads back this many words or more of its client's prompt, in the
#: prompt's order, is taken for an echo of it (echoes_prompt)
ECHO_MIN_WORDS = 2
#: the letters an echo's last word, often cut short or garbled, shares with the prompt's
ECHO_STEM_LETTERS = 3


def echoes_prompt(text: str, prompt: str) -> bool:
    """Whether ``text`` is only the client's ``prompt`` (initial prompt, hotwords) read
    back: at least ECHO_MIN_WORDS of its words, each the prompt's next in order, the last
    maybe cut short ("Ishmael, Queeque"). Whisper does this on a sound without speech
    when the language is detected, not set (noise taken for Nynorsk, decoded with an
    English prompt): "Customer support call." over a tone, as sure as speech."""
    said, given = spoken_words(text), spoken_words(prompt)
    if len(said) < ECHO_MIN_WORDS or not given:
        return False
    at = 0
    for i, word in enumerate(said):
        last = i == len(said) - 1
        while at < len(given) and not (
            given[at] == word
            or (
                last
                and len(word) >= ECHO_STEM_LETTERS
                and given[at][:ECHO_STEM_LETTERS] == word[:ECHO_STEM_LETTERS]
            )
        ):
            at += 1
        if at == len(given):
            return False
        at += 1
    return True


#: words this long that begin alike are one word, heard whole and cut short ("dated" and
#: "date" at the end of a partial), where shorter ones are often different words ("in")
SAME_STEM_LETTERS = 4


def same_word(a: str, b: str) -> bool:
    """``a`` and ``b`` are the same word, or one begins with the other of at least
    SAME_STEM_LETTERS letters."""
    short, long = sorted((a, b), key=len)
    return a == b or (len(short) >= SAME_STEM_LETTERS and long.startswith(short))


def count_phrase(words: Sequence[str], phrase: Sequence[str], alike: bool = False) -> int:
    """How often ``phrase`` is in ``words``; ``alike``: its words as ``same_word``."""
    k = len(phrase)
    if not alike:
        return sum(list(words[i : i + k]) == list(phrase) for i in range(len(words) - k + 1))
    return sum(
        all(same_word(w, p) for w, p in zip(words[i : i + k], phrase, strict=True))
        for i in range(len(words) - k + 1)
    )


def looped_tail(text: str, heard: Sequence[str], min_words: int = 1) -> int:
    """How many of ``text``'s last words (as ``text.split()`` has them; 0: none) re-read
    a phrase of at least ``min_words`` words read just before it (see LOOP_MIN_WORDS)
    more often than ``heard``, another decode of the same audio (its ``spoken_words``),
    has it: Whisper, out of audio, jumping back a few words and reading on ("has never
    been surpassed. Printing, then, for our purpose, has never been surpassed."). A
    repeat ``heard`` has as often is the speaker's ("no, no"; "very, very")."""
    tokens = text.split()
    norm = [normalize_word(t) for t in tokens]
    spoken = spoken_words(text)
    n = len(norm)
    for k in range(min(LOOP_MAX_WORDS, n // 2), max(1, min_words) - 1, -1):  # longest first
        tail = norm[n - k :]
        if not all(tail):
            continue
        gap = LOOP_GAP_WORDS if k >= LOOP_MIN_WORDS else SHORT_LOOP_GAP_WORDS
        if not count_phrase(norm[max(0, n - 2 * k - gap) : n - k], tail):
            continue
        phrase = spoken_words(" ".join(tokens[n - k :]))
        if count_phrase(heard, phrase) < count_phrase(spoken, phrase):
            return k
    return 0


def without_looped_tail(text: str, heard: Sequence[str]) -> str:
    """``text`` without the phrases of LOOP_MIN_WORDS or more that its end reads again
    (``looped_tail``) where ``heard`` has them, but fewer times (where it has none, it
    heard that passage otherwise and cannot tell)."""
    tokens = text.split()
    while k := looped_tail(" ".join(tokens), heard, min_words=LOOP_MIN_WORDS):
        if not count_phrase(heard, spoken_words(" ".join(tokens[-k:]))):
            break
        del tokens[-k:]
    return " ".join(tokens)


_PIECES = re.compile(f"[^{_JOINER_CHARS}]+")  # what _JOINERS joins


def without_unheard_loops(text: str, heard: Sequence[str]) -> str:
    """``text``, a final, without what Whisper read twice where ``heard``, a partial of
    (nearly) the same audio, read it once: a phrase said again right after itself
    (``without_unheard_repeats``), a phrase its end reads again
    (``without_looped_tail``), a passage re-read with a word altered
    (``without_reread_tail``)."""
    text = without_unheard_repeats(text, heard)
    return without_reread_tail(without_looped_tail(text, heard), heard)


def without_unheard_repeats(text: str, heard: Sequence[str]) -> str:
    """``text`` without the second of two back-to-back copies of a phrase of 2 to
    LOOP_MAX_WORDS words where ``heard`` has the phrase, but never twice in a row: the
    speaker said it once ("But the first Bible actually dated, actually dated, and";
    LJ Speech split at a pause, 2026-12-03). A repeat ``heard`` has is the speaker's."""
    tokens = text.split()
    while True:
        norm = [normalize_word(t) for t in tokens]
        cut = next(
            (
                (i, k)
                for i, k in _back_to_back(norm, range(LOOP_MAX_WORDS, 1, -1))
                if count_phrase(heard, norm[i : i + k], alike=True)
                and not count_phrase(heard, norm[i : i + k] * 2, alike=True)
            ),
            None,
        )
        if cut is None:
            return " ".join(tokens)
        i, k = cut
        del tokens[i + k : i + 2 * k]


def _spoken_pieces(text: str) -> tuple[list[str], list[tuple[int, str]]]:
    """``spoken_words(text)``, and for each the token of ``text.split()`` it is in and
    that token's text before it ("perfection—the": "the" is in it after "perfection")."""
    words: list[str] = []
    where: list[tuple[int, str]] = []
    for i, token in enumerate(text.split()):
        for piece in _PIECES.finditer(token):
            word = normalize_word(piece.group())
            if word:
                words.append(word)
                where.append((i, _JOINERS.sub(" ", token[: piece.start()]).strip()))
    return words, where


def without_reread_tail(text: str, heard: Sequence[str]) -> str:
    """``text`` without a tail that comes after the last word ``heard`` (another decode
    of the same audio, its ``spoken_words``) shares with it, and re-reads, in order, the
    passage just before it: REREAD_MIN_WORDS words or more, all but one in
    REREAD_ALTERED_EVERY of them. Whisper, its audio run out mid-sentence, jumps back
    and reads a passage again; retried with repeated 3-grams forbidden (engine/
    whisper.py), it still does, with a word altered, which exact checks
    (``looped_tail``) miss: "The Middle Ages brought calligraphy to perfection—the
    middle ages brought calligraphee to perfection." (LJ Speech, 2026-12-03). A repeat
    ``heard`` has is not cut: the speaker's."""
    words, where = _spoken_pieces(text)
    if not heard or len(words) < 2 * REREAD_MIN_WORDS:
        return text
    shared = SequenceMatcher(None, list(heard), words, autojunk=False).get_matching_blocks()
    start = max((b + size for _, b, size in shared if size), default=0)
    tail = words[start:]
    if len(tail) < REREAD_MIN_WORDS:
        return text
    before = words[max(0, start - 2 * len(tail) - LOOP_GAP_WORDS) : start]
    again = SequenceMatcher(None, before, tail, autojunk=False).get_matching_blocks()
    if sum(size for *_, size in again) < len(tail) - len(tail) // REREAD_ALTERED_EVERY:
        return text
    token, kept_of_it = where[start]
    kept = text.split()[:token]
    if kept_of_it:
        kept.append(kept_of_it)
    return " ".join(kept)


def timings_in_text(words: Sequence[WordTiming], text: str) -> list[WordTiming]:
    """The timings of ``words`` (aligned to the decoded tokens) that ``text`` still reads
    from its start: a cut loop leaves the end out. Compared without spaces, so that it
    holds for languages written without them too (Chinese, Japanese, Thai: one aligned
    "word" per character, where ``text.split()`` finds one word)."""
    target = "".join(text.split())
    kept: list[WordTiming] = []
    at = 0
    for w in words:
        piece = "".join(w.word.split())
        if not target.startswith(piece, at):
            break
        kept.append(w)
        at += len(piece)
    return kept


def merge_punctuation(words: Sequence[WordTiming]) -> list[WordTiming]:
    """Attach punctuation-only alignment words to their neighbours, as the text shows them."""
    merged: list[WordTiming] = []
    carry = ""
    for w in words:
        text = w.word.strip()
        if not text:
            continue
        if merged and all(c in _APPEND for c in text) and not carry:
            last = merged[-1]
            merged[-1] = WordTiming(last.word + text, last.start_s, last.end_s, last.probability)
        elif all(c in _PREPEND for c in text):
            carry += text
        else:
            merged.append(WordTiming(carry + text, w.start_s, w.end_s, w.probability))
            carry = ""
    return merged
