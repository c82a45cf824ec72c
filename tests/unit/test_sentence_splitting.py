"""Sentence splitting of streamed replies, and the pyttsx3 / espeak-ng synthesizer's audio and threads."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from assistant.stages.splitter import SentenceSplitter, SplitterOptions
from assistant.stages.tts import Synthesizer, TtsError, TtsOptions, TtsUnavailable
from tests.helpers.tts import PARIS

RATE_HZ = 16000


# (reply, its sentences joined by " | ")
CASES = [
    ("The capital of France is Paris. It is big.", "The capital of France is Paris. | It is big."),
    ("Mr. Li met Mrs. Jo and Dr. Who on St. Mark's Rd.", "Mr. Li met Mrs. Jo and Dr. Who on St. Mark's Rd."),
    ("Eat fruit, e.g. apples, i.e. red ones. Rest.", "Eat fruit, e.g. apples, i.e. red ones. | Rest."),
    ("Bring pens, paper, etc. and a bag. Go now.", "Bring pens, paper, etc. and a bag. | Go now."),
    ("Bring pens, paper, etc. The rest is there.", "Bring pens, paper, etc. | The rest is there."),
    ("It is cats vs. dogs. Dogs win.", "It is cats vs. dogs. | Dogs win."),
    ("The U.S. economy grew. So did the U.K. one.", "The U.S. economy grew. | So did the U.K. one."),
    ("I live in the U.S. It is big.", "I live in the U.S. | It is big."),
    ("Pi is 3.14 and the app is v2.5 now. Update it.", "Pi is 3.14 and the app is v2.5 now. | Update it."),
    ("Open at 5 p.m. today. It shuts at 9 p.m. Go.", "Open at 5 p.m. today. | It shuts at 9 p.m. | Go."),
    ("Well... I think so. Wait... what was that?", "Well... | I think so. | Wait... what was that?"),
    ("Really? Yes! Great.", "Really? | Yes! | Great."),
    ('He said "Go home." Then left. (It was late.)', 'He said "Go home." | Then left. | (It was late.)'),
    ("You need: 1. Eggs 2. Milk 3. Bread", "You need: | 1. Eggs | 2. Milk | 3. Bread"),
    ("1. Eggs 2. Milk", "1. Eggs | 2. Milk"),
    ("Buy:\n1. Eggs\n2. Milk, two liters.\n3. Bread", "Buy: | 1. Eggs | 2. Milk, two liters. | 3. Bread"),
    ("I was born in 1990. It was cold.", "I was born in 1990. | It was cold."),
    ("First line\nSecond line\n\nThird line", "First line | Second line | Third line"),
    ("## Tips\n- Drink **water**.\n* Sleep `8` hours.\n---", "Tips | Drink water. | Sleep 8 hours."),
    ("**Paris.** It is lovely.", "Paris. | It is lovely."),
    ("J. R. R. Tolkien wrote it. So did I. The end.", "J. R. R. Tolkien wrote it. | So did I. | The end."),
    ("Visit example.com today.  See you!", "Visit example.com today. | See you!"),
]


FIVE_WORDS = SplitterOptions(first_chunk_words=5)  # the rules below, at the old default
SENTENCES_ONLY = SplitterOptions(first_chunk_words=0)  # CASES check sentence ends, not the first-chunk cut


# Replies that exercise the first chunk's word cut: run-on openings, stop words, numbers,
# spaced punctuation, quotes and brackets, an early clause, an early sentence end.
RUN_ON = [
    "Sure I can help you with that and the answer is that it depends on the day.",
    "Well I am going to the shop and then home, so see you later.",
    "It is a 10 or 20 minute walk from here if you take the bridge.",
    "Well you know what I mean ? It happens to all of us.",
    "Yes I think so , but maybe you should ask someone else about it.",
    'He said "go home now" and then he left (quietly) without a word.',
    "The answer is 3.14159 and that is pi to five decimal places.",
    "Extraordinarily complicated question, but here goes nothing at all.",
    "Call Dr. Who or Mrs. Jo at 5 p.m. tomorrow about the U.S. trip, please.",
    "Hi there. How can I help you today with anything at all?",
]


def split_whole(text: str, options: SplitterOptions | None = None) -> list[str]:
    splitter = SentenceSplitter(options)
    return splitter.push(text) + splitter.flush()


def split_streamed(text: str, seed: int, options: SplitterOptions | None = None) -> list[str]:
    """Push ``text`` in random pieces of 1-8 characters, as an LLM token stream would arrive."""
    rng = random.Random(seed)
    splitter = SentenceSplitter(options)
    sentences, i = [], 0
    while i < len(text):
        n = rng.randint(1, 8)
        sentences += splitter.push(text[i : i + n])
        i += n
    return sentences + splitter.flush()


@pytest.mark.parametrize(("text", "expected"), CASES, ids=[c[0][:30] for c in CASES])
def test_splits_sentences(text, expected):
    assert split_whole(text, SENTENCES_ONLY) == expected.split(" | ")


@pytest.mark.parametrize("words", [None, 0, 1, 2, 3, 5, 8])
@pytest.mark.parametrize("seed", range(20))
def test_streamed_pieces_split_like_the_whole_reply(seed, words):
    options = None if words is None else SplitterOptions(first_chunk_words=words)
    reply = " ".join(text for text, _ in CASES) + " " + "and then " * 40 + "done."
    assert split_streamed(reply, seed, options) == split_whole(reply, options)
    for text in [t for t, _ in CASES] + RUN_ON:
        assert split_streamed(text, seed, options) == split_whole(text, options), text


def test_boundary_is_confirmed_by_the_next_character():
    splitter = SentenceSplitter()
    assert splitter.push("The capital is Paris.") == []
    assert splitter.push(" ") == []
    assert splitter.push("It") == ["The capital is Paris."]
    assert splitter.push(" is 3.") == []
    assert splitter.push("5 km wide") == []
    assert splitter.flush() == ["It is 3.5 km wide"]
    assert splitter.flush() == []  # flush starts over
    assert splitter.push("Next!\n") == ["Next!"]  # a newline needs no look-ahead


def test_long_sentence_without_punctuation_is_cut_early():
    words = [f"word{i}" for i in range(100)]
    text = " ".join(words[:25]) + ", " + " ".join(words[25:])  # the comma is at 164 characters
    splitter = SentenceSplitter(SplitterOptions(max_chars=200, first_clause_chars=0, first_chunk_words=0))
    first = splitter.push(text)
    assert first, "TTS should be able to start before the reply ends"
    parts = first + splitter.flush()
    assert all(len(p) <= 200 for p in parts)
    assert first[0].endswith("word24,")  # cut at the comma past half of max_chars
    assert " ".join(parts).replace(",", "").split() == words  # nothing lost, nothing cut mid-word


def test_a_long_first_sentence_starts_speaking_after_its_first_clause():
    reply = "The best breakfast is a Japanese breakfast, which has rice, fish and soup. Enjoy it, really."
    expected = [
        "The best breakfast is a Japanese breakfast,",  # the first clause: TTS can start here
        "which has rice, fish and soup.",  # later sentences keep their commas
        "Enjoy it, really.",
    ]
    assert split_whole(reply, SENTENCES_ONLY) == expected
    assert all(split_streamed(reply, seed, SENTENCES_ONLY) == expected for seed in range(10))
    # Short openings ("Well, ..."), and numbers like 1,000, are not clause ends.
    assert split_whole("Well, 1,000 people live in this tiny town. Yes.", SENTENCES_ONLY) == [
        "Well, 1,000 people live in this tiny town.",
        "Yes.",
    ]
    never = SplitterOptions(first_clause_chars=0, first_chunk_words=0)
    assert split_whole("The capital of France is Paris, of course.", never) == [
        "The capital of France is Paris, of course."
    ]


def test_a_run_on_opening_starts_speaking_after_its_first_words():
    reply = "Sure I can help you with that and the answer is that it depends on the day. Ask me again."
    expected = [
        "Sure I can help",  # three words ("can" cannot end a phrase: one more): TTS starts here
        "you with that and the answer is that it depends on the day.",
        "Ask me again.",
    ]
    assert split_whole(reply) == expected  # the default is 3 words
    assert all(split_streamed(reply, seed) == expected for seed in range(10))
    assert split_whole(reply, FIVE_WORDS)[0] == "Sure I can help you"
    # Only the reply's first chunk: a run-on second sentence is not cut at its words.
    assert split_whole("Yes. Sure I can help you with that and more.") == [
        "Yes.",
        "Sure I can help you with that and more.",
    ]
    three = SplitterOptions(first_chunk_words=3)
    assert split_whole("Paris has great food and lots of museums.", three) == [
        "Paris has great",
        "food and lots of museums.",
    ]


def test_a_sentence_or_clause_end_before_the_words_wins():
    assert split_whole("Hi there. How can I help you today with anything at all?", FIVE_WORDS) == [
        "Hi there.",
        "How can I help you today with anything at all?",
    ]
    assert split_whole("The capital of France is Paris. It is big.", FIVE_WORDS) == [
        "The capital of France is Paris.",
        "It is big.",
    ]
    assert split_whole("Extraordinarily complicated question, but here goes nothing at all.", FIVE_WORDS) == [
        "Extraordinarily complicated question,",  # a clause end (past 24 characters) after 3 words
        "but here goes nothing at all.",
    ]


def test_the_first_chunk_does_not_end_on_a_word_that_cannot_end_a_phrase():
    # "to" and "the" cannot end a phrase: the cut moves on to the next word that can.
    assert split_whole("Well I am going to the shop and then home.", FIVE_WORDS) == [
        "Well I am going to the shop",
        "and then home.",
    ]
    # Numbers neither ("at 5 | p.m."): "5" and "p.m." are passed over, then the sentence ends.
    assert split_whole("Meet J. Smith at 5 p.m. tomorrow. Okay?", FIVE_WORDS) == [
        "Meet J. Smith at 5 p.m. tomorrow.",
        "Okay?",
    ]
    # At most 3 words further: "is a 10 or" cannot end a phrase, so no word cut at all.
    two = SplitterOptions(first_chunk_words=2)
    assert split_whole("It is a 10 or 20 minute walk from here.", two) == [
        "It is a 10 or 20 minute walk from here."
    ]


def test_a_word_cut_waits_for_the_character_after_the_space():
    def pushes(words: int, *pieces: str) -> list[list[str]]:
        splitter = SentenceSplitter(SplitterOptions(first_chunk_words=words))
        return [splitter.push(piece) for piece in pieces]

    # "France" then ".": no word boundary, the period ends the sentence.
    assert pushes(4, "The capital of France", ".", " It is") == [[], [], ["The capital of France."]]
    # "I" cannot end a phrase; "mean" could, but only if a word follows: never cut before "?".
    assert pushes(5, "Well you know what I mean ", "?", " It happens.") == [
        [],
        [],
        ["Well you know what I mean ?"],
    ]
    # Never inside a number (nor after one): "3" then ".14159".
    assert pushes(4, "The answer is 3", ".14159 and", " that is pi") == [
        [],
        [],
        ["The answer is 3.14159 and that"],
    ]


def test_first_chunk_words_zero_disables_the_word_cut():
    reply = "Sure I can help you with that and the answer is that it depends on the day."
    off = SplitterOptions(first_chunk_words=0)
    assert split_whole(reply, off) == [reply]
    assert all(split_streamed(reply, seed, off) == [reply] for seed in range(5))


def rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))


def refilled(pieces: list[str], left_ms: float | None, options: SplitterOptions | None = None) -> list[str]:
    """Push ``pieces`` (tokens), each with ``left_ms`` of the reply left to play; then flush."""
    splitter = SentenceSplitter(options)
    out: list[str] = []
    for piece in pieces:
        out += splitter.push(piece, left_ms)
    return out + splitter.flush()


RUN_ON_REPLY = (
    "Paris grew from a small fishing village on an island in the river into a great city of "
    "kings and artists and builders over two thousand years."
)


def tokens(text: str) -> list[str]:
    words = text.split()
    return [words[0]] + [" " + w for w in words[1:]]


def test_a_voice_about_to_run_dry_gets_the_words_so_far_at_a_word_a_phrase_may_end_on():
    """With under ``refill_ms`` left to play, a run-on sentence goes out in pieces of 3+ words."""
    pieces = refilled(tokens(RUN_ON_REPLY), left_ms=0.0)
    assert " ".join(pieces).split() == RUN_ON_REPLY.split()  # every word, in order, none cut
    assert len(pieces) > 4, pieces
    for piece in pieces[1:-1]:  # the first chunk has its own rule, the last is the flush
        words = piece.split()
        assert len(words) >= 3, pieces
        assert words[-1].lower() not in {"a", "an", "the", "of", "on", "in", "into", "and", "over"}, pieces


@pytest.mark.parametrize(
    ("left_ms", "options"),
    [(None, None), (300.0, None), (5000.0, None), (0.0, SplitterOptions(refill_ms=0))],
    ids=["not playing in real time", "at the threshold", "plenty left", "refill off"],
)
def test_with_enough_left_to_play_or_no_speaker_the_run_on_sentence_waits_for_its_end(left_ms, options):
    assert refilled(tokens(RUN_ON_REPLY), left_ms, options) == refilled(tokens(RUN_ON_REPLY), None)
    first, rest = refilled(tokens(RUN_ON_REPLY), None)
    assert len(first.split()) <= 6 and rest.endswith("years.")  # the first chunk, then the rest whole


def test_a_long_run_of_digits_is_cut_too_but_short_words_wait_for_the_next_character():
    """ "approximately 14.5199602597220222..." (SmolLM2, 2026-12-06): a silence of 3.9 s before."""
    splitter = SentenceSplitter()
    assert splitter.push("Pi is a number. It", 0.0) == ["Pi is a number."]
    assert splitter.push(" is approximately", 0.0) == []  # "is" cannot end one; "approximately" may go on
    assert splitter.push(" 3.14159265358979323", 0.0) == ["It is approximately"]
    assert splitter.push("8" * 40, 0.0) == ["3.14159265358979323" + "8" * 40]  # a long run, no space: whole
    assert splitter.push(" or so 27182818284590452353602874713526624977572", 0.0) == []
    assert splitter.push("2", 0.0) == ["or so"]  # 48 characters with no word to end on: at the last space
    assert splitter.push(" and", 0.0) == []
    assert splitter.flush() == ["271828182845904523536028747135266249775722 and"]


def test_sentence_becomes_audible_16k_mono_float32(paris_audio):
    assert paris_audio.dtype == np.float32 and paris_audio.ndim == 1
    duration_s = paris_audio.size / RATE_HZ
    assert 0.8 <= duration_s <= 6.0
    assert rms(paris_audio) > 0.02
    assert np.abs(paris_audio).max() <= 1.0


def test_options_change_rate_and_sample_rate():
    with Synthesizer(TtsOptions(voice="en-us")) as synth:
        normal = synth.synthesize(PARIS).size / RATE_HZ
        assert "gmw/en-us" in synth.voices()
    with Synthesizer(TtsOptions(voice="en-us", rate_wpm=110)) as synth:
        slow = synth.synthesize(PARIS).size / RATE_HZ
    with Synthesizer(TtsOptions(voice="en-us", sample_rate_hz=22050)) as synth:
        native = synth.synthesize(PARIS)
    assert slow > 1.3 * normal
    assert native.size / 22050 == pytest.approx(normal, rel=0.05)


def test_blank_text_is_empty_audio():
    with Synthesizer(TtsOptions()) as synth:
        for text in ("", "   ", "\n\t"):
            audio = synth.synthesize(text)
            assert audio.dtype == np.float32 and audio.size == 0


def test_concurrent_callers_each_get_their_own_audio():
    short, long = "Yes.", "This sentence is a good deal longer than the other one, by design."
    with Synthesizer(TtsOptions(voice="en-us")) as synth:
        expected = {short: synth.synthesize(short).size, long: synth.synthesize(long).size}
        results: dict[str, list[int]] = {short: [], long: []}
        errors: list[BaseException] = []

        def speak(text: str) -> None:
            try:
                for _ in range(5):
                    results[text].append(synth.synthesize(text).size)
            except BaseException as e:  # the assertion below reports it
                errors.append(e)

        threads = [threading.Thread(target=speak, args=(t,)) for t in (short, long)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert not errors
    assert expected[long] > 3 * expected[short]
    for text, sizes in results.items():
        assert len(sizes) == 5
        # espeak-ng's closing pause varies by ~40 ms with the sentence before; a mix-up is 5x off.
        assert all(abs(n - expected[text]) <= 0.1 * expected[text] for n in sizes), (text, sizes, expected)


def owner_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tts-owner"]


def test_close_joins_the_owner_thread_and_refuses_more_work():
    synth = Synthesizer(TtsOptions())
    (owner,) = owner_threads()
    assert owner.is_alive()
    synth.close()
    assert not owner.is_alive() and owner_threads() == []
    synth.close()  # idempotent
    with pytest.raises(TtsError, match="closed"):
        synth.synthesize("Hello.")


def test_unknown_voice_is_a_clear_error():
    with pytest.raises(TtsUnavailable, match="no espeak-ng voice matches 'no-such-voice'"):
        Synthesizer(TtsOptions(voice="no-such-voice"))
    assert owner_threads() == []
