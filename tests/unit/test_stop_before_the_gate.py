"""Speech over a reply with no words after the residual gate: a stop request is looked for before it.

The echo canceller's residual gate silences the soft start of a word said over the reply, and
tiny.en heard nothing in the rest of a lone "Stop." (the reply played on). The judge then reads
the same speech as the canceller gave it, ungated, and takes it only as a stop request: the rest
may be the reply's own leftover echo (tests/integration/test_stop_over_the_echo.py has the real
canceller, VAD and Whisper).
"""

from __future__ import annotations

import numpy as np
import pytest

from assistant.stages.asr import TranscriptResult
from assistant.stages.echo_linear import AudioTail
from assistant.turns.hearing import Hearing

RATE = 16000
GATED = np.zeros(RATE // 2, np.float32)
UNGATED = np.full(RATE // 2, 0.01, np.float32)


class TwoViews:
    """Writes ``gated`` for the gated audio (all zeros) and ``ungated`` for the other; logs which."""

    description = "two views"

    def __init__(self, gated: str, ungated: str, no_speech: float = 0.1) -> None:
        self.gated, self.ungated, self.no_speech = gated, ungated, no_speech
        self.heard: list[str] = []

    def transcribe(self, audio, quick=False, long_form=False, partial=False) -> TranscriptResult:
        view = "ungated" if np.any(audio) else "gated"
        self.heard.append(view)
        text = self.ungated if view == "ungated" else self.gated
        return TranscriptResult(text, 1000.0, 5.0, "en", self.no_speech if view == "gated" else 0.1)

    def phrase_logprobs(self, audio, phrases):
        if np.any(audio):
            raise AssertionError("ungated words are never scored against the stop phrases")
        return [-0.5, *(-8.0 for _ in phrases[1:])]  # the words heard score best


@pytest.mark.parametrize(
    ("gated", "ungated", "heard"),
    [
        ("", "Top.", "Top."),  # the lone "Stop." with its start under the gate
        ("", "Stop.", "Stop."),
        ("", "That is it.", ""),  # leftover echo of a resumed reply: not a word of it counts
        ("", "Tell me about Paris.", ""),
        ("", "", ""),
    ],
)
def test_no_words_after_the_gate_are_a_stop_request_only_if_the_ungated_speech_is_one(gated, ungated, heard):
    asr = TwoViews(gated, ungated)
    assert Hearing(asr, lambda _e: None).transcribe_overlap(GATED, None, UNGATED).text == heard
    assert asr.heard == ["gated", "ungated"]


def test_doubtful_gated_speech_is_looked_at_ungated_too():
    """Whisper's no-speech probability over the gated "Stop." was 0.70-0.84 on the echo rig."""
    asr = TwoViews("Oh.", "Stop.", no_speech=0.85)
    assert Hearing(asr, lambda _e: None).transcribe_overlap(GATED, None, UNGATED).text == "Stop."


@pytest.mark.parametrize("gated", ["Uh-huh.", "Stop.", "What about Rome?"])
def test_words_heard_after_the_gate_decide_alone(gated):
    asr = TwoViews(gated, "Stop.")
    assert Hearing(asr, lambda _e: None).transcribe_overlap(GATED, None, UNGATED).text == gated
    assert asr.heard == ["gated"]


def test_without_the_ungated_speech_no_words_are_no_words():
    """A headset, or speech no longer kept: as before the gate's audio was kept."""
    asr = TwoViews("", "Stop.")
    assert Hearing(asr, lambda _e: None).transcribe_overlap(GATED, None, None).text == ""
    assert asr.heard == ["gated"]


@pytest.mark.parametrize(
    ("gated", "ungated", "heard"),
    [
        ("time.", "Stop.", "Stop."),  # a user check: the gated "Stop." read "time." (words)
        ("Okay.", "Okay.", "Okay."),  # a backchannel stays one
    ],
)
def test_speech_too_short_to_take_the_floor_is_judged_ungated_first(gated, ungated, heard):
    asr = TwoViews(gated, ungated)
    assert Hearing(asr, lambda _e: None).transcribe_overlap(GATED, None, UNGATED, short=True).text == heard
    assert asr.heard == ["ungated"]


@pytest.mark.parametrize(
    ("gated", "ungated", "heard"),
    [
        ("Stop.", "Scott.", "Stop."),  # a Piper "Stop." on the closed-loop bench
        ("Stop.", "", "Stop."),
        ("", "That is it.", ""),  # leftover echo: no words, and never scored as "Stop it."
        ("Tell me.", "Tell me about it.", ""),
        ("Okay.", "", ""),  # the gated view counts only as a stop request: the reply resumes either way
    ],
)
def test_short_speech_with_no_verdict_ungated_is_a_stop_request_only_if_the_gated_words_are_one(
    gated, ungated, heard
):
    asr = TwoViews(gated, ungated)
    assert Hearing(asr, lambda _e: None).transcribe_overlap(GATED, None, UNGATED, short=True).text == heard
    assert asr.heard == ["ungated", "gated"]


def test_speech_the_gate_left_alone_is_not_transcribed_twice():
    """A headset (no echo path): the microphone passed as it was, the views are the same."""
    asr = TwoViews("", "")
    assert Hearing(asr, lambda _e: None).transcribe_overlap(UNGATED, None, UNGATED.copy()).text == ""
    assert asr.heard == ["ungated"]  # one pass


def test_the_tail_gives_the_samples_ending_at_a_time():
    tail = AudioTail(seconds=1)
    block_ns = 512 * 1_000_000_000 // RATE
    for i in range(40):  # 1.28 s of blocks numbered 0..39, each ending i * 32 ms after 1 s
        tail.add(np.full(512, i, np.float32), 10**9 + i * block_ns)
    got = tail.span(10**9 + 38 * block_ns, 1024)  # the two blocks before the newest
    assert got is not None and list(np.unique(got)) == [37, 38]
    assert tail.span(10**9 + 39 * block_ns + 10**7, 512) is not None  # a decision's time after the newest
    assert tail.span(10**9 + 39 * block_ns, 2 * RATE) is None  # older than it keeps
