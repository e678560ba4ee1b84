"""LocalAgreement commits and text hygiene (repetition loops)."""

from __future__ import annotations

import pytest

from asr_server.engine.base import WordTiming
from asr_server.engine.text import (
    LOOP_GAP_WORDS,
    compression_ratio,
    count_phrase,
    echoes_prompt,
    loop_trimmed,
    looped_tail,
    merge_punctuation,
    next_copy_size,
    normalize_word,
    repeat_was_spoken,
    repeated_phrases,
    repeats_back_to_back,
    spoken_words,
    timings_in_text,
    timings_of_tokens,
    trim_dangling_restart,
    trim_loops,
    trim_restarted_passage,
    trim_trailing_repeats,
    without_reread_tail,
    without_unheard_loops,
    without_unheard_repeats,
)
from asr_server.session.agreement import LocalAgreement


def test_commits_what_two_hypotheses_agree_on() -> None:
    la = LocalAgreement()
    assert la.update("he hoped there".split())
    assert la.committed == []  # one hypothesis proves nothing
    assert la.update("He hoped there would".split())
    assert la.committed == ["He", "hoped", "there"]  # case-insensitive agreement
    assert la.tail == ["would"]


def test_agreement_of_three_commits_only_what_all_three_share() -> None:
    la = LocalAgreement(3)
    assert la.update("he hoped there".split())
    assert la.update("he hoped their would".split())
    assert la.committed == []  # two hypotheses are not enough
    assert la.update("he hoped there would be".split())
    assert la.committed == ["he", "hoped"]  # "there"/"their" was not unanimous
    assert la.update("he hoped there would be stew".split())
    assert la.committed == ["he", "hoped"]  # the earlier "their" still counts against it
    assert la.update("he hoped there would be stew for".split())
    assert la.committed == ["he", "hoped", "there", "would", "be"]
    assert la.tail == ["stew", "for"]


def test_committed_words_never_change() -> None:
    la = LocalAgreement()
    history = []
    for hyp in [
        "the cat",
        "the cat sat on",
        "the cat sat on the mat",
        "the cat sat on the mat today",
        "the cat sat on the hat today",  # disagrees with nothing committed? (prefix check)
    ]:
        la.update(hyp.split())
        history.append(list(la.committed))
    for earlier, later in zip(history, history[1:], strict=False):
        assert later[: len(earlier)] == earlier


def test_hypothesis_contradicting_committed_words_is_stale() -> None:
    la = LocalAgreement()
    la.update("a b c".split())
    la.update("a b c d".split())
    assert la.committed == ["a", "b", "c"]
    assert not la.update("x b c d e".split())
    assert la.committed == ["a", "b", "c"]


def test_punctuation_does_not_block_agreement() -> None:
    la = LocalAgreement()
    la.update("stew for dinner.".split())
    la.update("stew for dinner, turnips".split())
    assert la.committed == ["stew", "for", "dinner,"]


def test_timings_follow_committed_words() -> None:
    la = LocalAgreement()
    words = "one two three".split()
    timings = [WordTiming(w, i * 0.5, i * 0.5 + 0.4, 0.9) for i, w in enumerate(words)]
    la.update(words[:2], timings[:2])
    la.update(words, timings)
    assert [t.end_s for t in la.committed_timing if t] == [0.4, 0.9]


def test_committed_words_end_only_where_their_timing_can_say() -> None:
    def committed(timing: list[tuple[float, float]] | None) -> LocalAgreement:
        la = LocalAgreement()
        words = "one two three".split()
        for _ in range(2):  # two hypotheses agree: all three are committed
            timed = timing and [
                WordTiming(w, a, b, 0.9) for w, (a, b) in zip(words, timing, strict=False)
            ]
            la.update(words, timed or None)
        assert la.committed == words
        return la

    assert committed([(0.0, 0.4), (0.5, 0.9), (1.0, 1.4)]).committed_end_s == 1.4
    assert committed([(0.0, 0.0), (0.0, 0.0), (0.0, 0.0)]).committed_end_s is None
    # the last word back at the start
    assert committed([(5.2, 5.24), (5.24, 5.26), (0.0, 0.0)]).committed_end_s is None
    assert committed(None).committed_end_s is None  # untimed


def test_trailing_sentence_loop_is_trimmed_but_prefix_protected() -> None:
    text = "the narrative would be tedious. the narrative would be tedious."
    assert trim_trailing_repeats(text.split(), protected=2) == text.split()[:5]
    # never cuts into committed words
    assert trim_trailing_repeats("a b c a b c".split(), protected=5) == "a b c a b c".split()


def test_a_repeat_the_audio_has_room_for_was_spoken() -> None:
    """Times as the aligner gives them (jfk.flac's phrase said twice, and said once but
    read twice): a spoken copy takes about as long as the first, a loop's next to none."""

    def timed(*spans: tuple[float, float]) -> list[WordTiming]:
        return [WordTiming(f"w{i}", a, b, 0.9) for i, (a, b) in enumerate(spans)]

    first = [(0.0, 0.9), (0.9, 1.2), (1.2, 1.5), (1.5, 1.7), (1.7, 2.0)]
    spoken = [(3.1, 3.7), (3.7, 3.9), (3.9, 4.3), (4.3, 4.5), (4.5, 4.7)]
    read = [(2.0, 2.0), (2.0, 2.0), (2.0, 2.0), (2.0, 2.0), (2.0, 2.1)]
    assert repeat_was_spoken(timed(*first, *spoken), kept=5)
    assert not repeat_was_spoken(timed(*first, *read), kept=5)
    # said a lot faster than the words before it: squeezed in, not spoken
    assert not repeat_was_spoken(
        timed(*first, *[(2.0 + i / 10, 2.1 + i / 10) for i in range(5)]), 5
    )
    # nothing to compare with, or nothing cut
    assert not repeat_was_spoken(timed(*read), kept=0)
    assert not repeat_was_spoken(timed(*first), kept=5)
    # too quick for a word whatever the pace before
    assert not repeat_was_spoken(timed(*read, *[(2.1, 2.15)] * 5), kept=5)
    # a loop over other speech: one word stretched over it, another given no time
    # (the aligner's times for "Go forward 10 meters." read again over Mandarin)
    over_speech = [(3.44, 3.62), (3.62, 4.02), (4.02, 5.8), (5.8, 5.8)]
    said_once = [(0.3, 0.6), (0.6, 1.0), (1.0, 1.4), (1.4, 1.9)]
    assert not repeat_was_spoken(timed(*said_once, *over_speech), kept=4)


def test_the_copies_a_cut_took_are_checked_one_at_a_time() -> None:
    words = "I said ask what you can ask what you can ask what".split()
    assert next_copy_size(words, kept=6) == 4  # "ask what you can" again
    assert next_copy_size(words, kept=10) == 2  # what is left: a copy cut short
    assert next_copy_size("a b c d a b".split(), kept=4) == 2  # a restart
    assert next_copy_size("no, no no".split(), kept=1) == 1  # as normalized words
    assert next_copy_size("a b c".split(), kept=3) == 0


def test_phrases_said_twice_in_a_row_of_any_length_are_found() -> None:
    text = "For a full hour he had paced up and down. " * 2 + "Waiting."
    assert repeated_phrases(text.split()) == [(0, 10)]
    assert repeated_phrases("very very good".split()) == []  # shorter than 3 words
    assert repeated_phrases("no repeat here at all".split()) == []


def test_aligned_words_are_joined_into_the_texts_tokens() -> None:
    """The aligner splits a hyphenated word the text has as one token, so a repeat with
    one was never checked against the audio (always cut)."""
    aligned = [
        WordTiming("Heppered", 0.3, 0.8, 0.9),
        WordTiming("flower", 0.8, 1.1, 0.8),
        WordTiming("-fattened", 1.1, 1.6, 0.7),
        WordTiming("sauce.", 1.6, 2.0, 0.9),
    ]
    joined = timings_of_tokens(aligned, "Heppered flower-fattened sauce.")
    assert joined == [
        WordTiming("Heppered", 0.3, 0.8, 0.9),
        WordTiming("flower-fattened", 0.8, 1.6, 0.7),
        WordTiming("sauce.", 1.6, 2.0, 0.9),
    ]
    assert timings_of_tokens(aligned, "Heppered flower-fattened") is None  # words left
    assert timings_of_tokens(aligned, "Peppered flower-fattened sauce.") is None


def test_short_phrases_need_many_repeats() -> None:
    assert trim_trailing_repeats("no, no".split()) == ["no,", "no"]
    assert trim_trailing_repeats("thank you thank you thank you thank you".split()) == [
        "thank",
        "you",
    ]


def test_compression_ratio_flags_loops() -> None:
    assert compression_ratio("He hoped there would be stew for dinner.") < 2.0
    assert compression_ratio("I'm going to go. " * 20) > 2.4


def test_restarted_passage_is_cut() -> None:
    text = (
        "In 1465, Swainheim and Panerts began printing near Rome and used a beautiful type. "
        "In 1465, Swainheim and Panerts began printing"
    ).split()
    assert trim_restarted_passage(text) == text[:14]
    # a short echo is speech, and committed words are never cut
    assert trim_restarted_passage("I said go. I said".split()) == "I said go. I said".split()
    assert trim_restarted_passage(text, protected=len(text) - 2) == text


def test_back_to_back_copies_left_by_a_restart_are_trimmed_too() -> None:
    """The restart is cut after the copies were looked for: both run until neither cuts
    (a final read "...printing beautiful letters for printing beautiful letters for")."""
    start = "It is of the first importance that the letter used".split()
    end = "or printing beautiful letters for".split()
    assert trim_loops([*start, *end, *end, *start[:6]]) == [*start, *end]


def test_a_looped_tail_is_one_the_other_reading_has_fewer_times() -> None:
    text = (
        "the Gutenberg Bible of about 1455 has never been surpassed. Printing, then, "
        "for our purpose, has never been surpassed."
    )
    partial = spoken_words("the Guttenburg Bible of about 1455 has never been surpassed. Printing")
    assert looped_tail(text, partial, min_words=3) == 4
    # the speaker said it twice: the other reading has it twice too
    twice = spoken_words(text)
    assert looped_tail(text, twice, min_words=3) == 0
    # one word again, or two, is a loop only right after its first reading
    assert looped_tail("simpler, simpler.", ["simpler", "rounder"]) == 1
    assert looped_tail("simpler, simpler.", ["simpler", "rounder"], min_words=3) == 0
    assert looped_tail("the cat sat on the mat and then the", ["the", "cat"]) == 0
    # a longer phrase read again after more than LOOP_GAP_WORDS words is speech
    far = "we will go on. " + "x " * (LOOP_GAP_WORDS + 1) + "we will go on."
    assert looped_tail(far, ["we", "will", "go", "on"], min_words=3) == 0
    assert count_phrase(["a", "b", "a", "b"], ["a", "b"]) == 2


def test_a_passage_re_read_with_a_word_altered_is_cut_after_what_the_partial_heard() -> None:
    """Retried with repeated 3-grams forbidden, Whisper's loop reads a word otherwise."""
    final = (
        "The forms of printed letters should be beautiful. The Middle Ages brought "
        "calligraphy to perfection—the middle ages brought calligraphee to perfection."
    )
    partial = spoken_words(
        "the forms of printed letters should be beautiful the middle ages brought "
        "calligraphy to perfection"
    )
    kept = (
        "The forms of printed letters should be beautiful. The Middle Ages brought "
        "calligraphy to perfection"
    )
    assert without_reread_tail(final, partial) == kept  # cut inside "perfection—the"
    # the speaker said it twice: the partial has it twice too
    assert without_reread_tail(final, spoken_words(final)) == final
    # words the partial did not hear that do not re-read the passage before them
    assert without_reread_tail(kept + " and so it stayed for centuries", partial) == (
        kept + " and so it stayed for centuries"
    )
    # more than one word in five read otherwise: not a re-reading
    loose = kept + " the middle years bought calligraphee to perfection"
    assert without_reread_tail(loose, partial) == loose
    assert without_reread_tail(final, []) == final  # no partial to judge by


def test_the_loops_at_a_finals_end_are_cut_one_after_the_other() -> None:
    final = (
        "the Gutenberg Bible—of about 1455—has never been surpassed. Printing then for "
        "our purpose has never been surpassed. Printing, for our"
    )
    partial = spoken_words(
        "the Gutenberg Bible of about 1455 has never been surpassed printing then for our purpose"
    )
    assert without_unheard_loops(final, partial) == (
        "the Gutenberg Bible—of about 1455—has never been surpassed. Printing then for our purpose"
    )


def test_a_loop_at_the_end_is_cut_back_to_before_it() -> None:
    looped = "by a similar process produced the block books" + " produced the block books" * 9
    assert loop_trimmed(looped + " produced the") == "by a similar process produced the block books"
    assert loop_trimmed("soldiers, etc." + " etc." * 15) == "soldiers, etc."
    # a loop left inside the text: only decoding again can mend it
    inside = "no more time is occupied or cost incurred, or cost incurred, consist principally"
    assert repeats_back_to_back(inside.split())
    assert loop_trimmed(inside + " of types," * 6) is None
    # a dangling start of the phrase before it; in speech "no, no" is not a loop
    assert trim_dangling_restart("which are an exact imitation, which are".split()) == [
        "which",
        "are",
        "an",
        "exact",
        "imitation,",
    ]
    assert trim_dangling_restart("I said no, no".split()) == "I said no, no".split()
    assert not repeats_back_to_back("I said no, no, no".split())


def test_a_phrase_read_twice_in_a_row_that_the_partial_read_once_is_read_once() -> None:
    final = "But the first Bible actually dated, actually dated, and"
    assert without_unheard_repeats(final, spoken_words("but the first bible actually dated")) == (
        "But the first Bible actually dated, and"
    )
    # the partial, cut off mid-word, heard "date": the same word
    assert without_unheard_repeats(final, spoken_words("but the first bible actually date")) == (
        "But the first Bible actually dated, and"
    )
    # the speaker's: the partial has it twice in a row too
    assert without_unheard_repeats(final, spoken_words(final)) == final
    # the partial did not hear that passage at all: it cannot tell
    assert without_unheard_repeats(final, spoken_words("but the first bible")) == final
    # one word said twice is speech ("no, no"), never cut here
    assert without_unheard_repeats("I said no, no.", ["i", "said", "no"]) == "I said no, no."


def test_punctuation_joins_its_word() -> None:
    words = [WordTiming(w, i, i + 1, 0.9) for i, w in enumerate(["me", ",", "(", "a", ")", "x"])]
    assert [w.word for w in merge_punctuation(words)] == ["me,", "(a)", "x"]


def test_hypotheses_marked_uncommittable_only_set_the_comparison() -> None:
    la = LocalAgreement()
    la.update(["S"], commit=False)
    la.update(["S", "not"], commit=False)
    assert la.committed == [] and la.tail == ["S", "not"]
    la.update(["ask", "not", "what"])  # disagrees with the last one: nothing committed
    assert la.committed == []
    la.update(["ask", "not", "what", "your"])
    assert la.committed == ["ask", "not", "what"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("Go forward, 10 meters.", ["go", "forward", "10", "meters"]),
        ("9-0-2-1-0", ["9", "0", "2", "1", "0"]),
        ("It's one o'clock — twenty past", ["it's", "one", "o'clock", "twenty", "past"]),
        ("fat-mutton pieces, and/or", ["fat", "mutton", "pieces", "and", "or"]),
        ("", []),
    ],
)
def test_spoken_words_splits_what_hyphens_join(text: str, words: list[str]) -> None:
    assert spoken_words(text) == words


@pytest.mark.parametrize(
    "text",
    [
        "My PIN is 0 0 0 0.",
        "zero zero zero zero",
        "The card number is 4444 4444 4444 4444.",
        "My number is 5 5 5 1 2 3 4, that's 5 5 5 1 2 3 4.",
        "So the code is 1 2 3 4 5 and again 1 2 3 4 5",
    ],
)
def test_numbers_said_again_are_speech_not_a_loop(text: str) -> None:
    # trim_loops runs on every decode: these lost their digits ("My PIN is 0")
    assert trim_loops(text.split()) == text.split()


def test_words_loop_as_before_numbers_among_them() -> None:
    assert trim_loops("thank you thank you thank you thank you".split()) == ["thank", "you"]
    text = "In 1465, Swainheim began printing near Rome. In 1465, Swainheim began printing"
    assert trim_loops(text.split()) == text.split()[:7]


def test_combining_marks_tell_words_apart() -> None:
    # Hindi's vowel signs and Thai's tone marks are Unicode category M, which \w leaves out
    assert len({normalize_word(w) for w in ("क", "कि", "की", "के", "को")}) == 5
    assert normalize_word("ที่") != normalize_word("ท")
    assert normalize_word("Cafe\u0301,") == "cafe\u0301" and normalize_word("don't!") == "don't"
    # a different phrase after a Hindi one is not that phrase read again
    text = "मैं घर जा रहा हूँ, मैं घर जा रही हूँ"
    assert trim_loops(text.split()) == text.split()


def _timed(*words: str) -> list[WordTiming]:
    return [WordTiming(w, i * 0.2, i * 0.2 + 0.2, 0.9) for i, w in enumerate(words)]


def test_timings_follow_the_text_that_is_left() -> None:
    words = _timed("the", "earliest", "book,", "the", "earliest", "book,")
    assert timings_in_text(words, "the earliest book,") == words[:3]  # a loop cut off
    assert timings_in_text(words, "the earliest book, the earliest book,") == words
    # written without spaces: one aligned word per character, one "word" to split()
    chars = _timed("我", "们", "明", "天", "见", "。")
    assert timings_in_text(chars, "我们明天见。") == chars
    assert timings_in_text(chars, "我们明天") == chars[:4]


@pytest.mark.parametrize(
    ("text", "echo"),
    [
        ("Captain Ahab spoke to Ishmael and Queequeg on the Pequod.", True),  # all of it
        ("Captain Ahab spoke to Ishmael.", True),  # its start
        ("Ishmael, Queeque", True),  # hotwords read back, the last one cut short
        ("Ishmael, Queer", True),  # ... or garbled
        ("Ishmael", False),  # one word: a speaker may say a name
        ("Ahab went home.", False),  # words of its own
        ("the Pequod sank", False),
        ("Queequeg and Ishmael", False),  # not in the prompt's order
    ],
)
def test_a_decode_that_only_reads_back_its_prompt_is_an_echo(text: str, echo: bool) -> None:
    prompt = "Captain Ahab spoke to Ishmael and Queequeg on the Pequod. Ishmael, Queequeg"
    assert echoes_prompt(text, prompt) is echo


def test_chinese_and_japanese_are_written_without_spaces_between_their_words() -> None:
    """base, decoding a 4 s Chinese final in the server's 10 s window, wrote spaces
    between words that its 30 s window and offline faster-whisper did not (the
    multilingual reviewer)."""
    from asr_server.engine.text import closed_up

    assert closed_up("廣州市 佛地產 中間協會分析", "zh") == "廣州市佛地產中間協會分析"
    assert closed_up("こんにちは 世界。 元気です", "ja") == "こんにちは世界。元気です"
    # beside a Latin word or a digit a space stays; other languages keep theirs
    assert closed_up("我用 iPhone 手机 2 次", "zh") == "我用 iPhone 手机 2 次"
    assert closed_up("สวัสดี ครับ", "th") == "สวัสดี ครับ"
    assert closed_up("中 文", "en") == "中 文"
