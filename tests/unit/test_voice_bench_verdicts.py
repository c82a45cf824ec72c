"""bench/voice.py's verdicts on a paused question: ended early, and whether its rest was lost.

A continued question (the reply begun on the first half dropped, the whole question answered
as one turn) ended early but lost nothing; halves answered apart, or an answered turn whose
speech stopped well before the question's, lost the rest.
"""

from __future__ import annotations

from bench.voice import Question, judge

END_NS = 10_000_000_000
PAUSED = Question("I would like to know how many days are in a week.", "en-us", 160, "q.wav", "days",
                  "how many days are in a week.")  # fmt: skip


def record(transcript: str, speech_end_ns: int, cancelled: str = "") -> dict:
    return {"transcript": transcript, "cancelled": cancelled, "timestamps_ns": {"speech_end": speech_end_ns}}


def verdict(*records: dict) -> dict:
    return judge(PAUSED, {"records": list(records), "events": [], "speech_end_ns": END_NS})


def test_a_continued_question_ended_early_but_lost_nothing():
    v = verdict(
        record("I would like to know", END_NS - 1_900_000_000, "continued"),
        record("I would like to know how many days are in a week.", END_NS - 60_000_000),
    )
    assert v["cut_off"] and not v["lost"]


def test_halves_answered_as_two_turns_lost_the_rest():
    v = verdict(
        record("I would like to know", END_NS - 1_900_000_000),
        record("how many days are in a week.", END_NS),
    )
    assert v["cut_off"] and v["lost"]


def test_an_answered_turn_that_stopped_before_the_rest_lost_it():
    assert verdict(record("I would like to know", END_NS - 1_900_000_000))["lost"]
    whole = "I would like to know how many days are in a week."
    assert not verdict(record(whole, END_NS - 130_000_000))["lost"]
