"""Speech over a reply in the turn record: scripted event lists in, the record's fields out.

Times are in milliseconds (``ms``) turned into the monotonic nanoseconds the events carry.
The lists are in the order the live loop emits them: ``ReplyPaused`` at the speech's onset,
``OverlapHeard`` once its words are judged, then ``ReplyResumed`` / ``BargeIn`` / the cancel.
"""

from __future__ import annotations

import csv
import json

import numpy as np

from assistant.events import (
    AudioStarted,
    BargeIn,
    CancelReason,
    EchoMeasured,
    Event,
    OverlapHeard,
    OverlapVerdict,
    PlaybackEnded,
    ReplyPaused,
    ReplyResumed,
    SpeechEnded,
    TranscriptReady,
    TurnCancelled,
)
from assistant.observe.latency import build_record
from assistant.observe.report import export_report


def ms(value: float) -> int:
    return int(value * 1e6)


def answered(turn: int = 1) -> list[Event]:
    """Turn ``turn``'s question ended at 1000 ms, answered, its first audio at 1800 ms."""
    return [
        SpeechEnded(turn, ms(1000), speech_end_t_ns=ms(600), audio=np.zeros(16000, np.float32)),
        TranscriptReady(turn, ms(1200), "What is the capital of France?"),
        AudioStarted(turn, ms(1800)),
    ]


def test_a_backchannel_and_a_cough_over_the_reply_are_false_barge_ins_that_resumed():
    events = [
        *answered(),
        ReplyPaused(1, ms(3040), onset_t_ns=ms(3000), overlap_turn=2),
        OverlapHeard(1, ms(3840), overlap_turn=2, text="Uh-huh.", verdict=OverlapVerdict.BACKCHANNEL),
        ReplyResumed(1, ms(3840), paused_ms=800.0),
        ReplyPaused(1, ms(5030), onset_t_ns=ms(5000), overlap_turn=2),
        OverlapHeard(1, ms(5200), overlap_turn=2, verdict=OverlapVerdict.NOISE),
        ReplyResumed(1, ms(5200), paused_ms=170.0),
        PlaybackEnded(1, ms(7000)),
        EchoMeasured(1, ms(7001), erle_db=24.5, delay_ms=61.0),
    ]
    record = build_record(1, events)
    assert record.overlaps == 2 and record.false_barge_ins == 2
    assert record.overlap_heard == [
        "backchannel 'Uh-huh.': resumed after 800 ms",
        "no words: resumed after 170 ms",
    ]
    assert record.metrics["barge_in_ms"] is None and not record.continued and record.cancelled == ""
    assert record.metrics["erle_db"] == 24.5 and record.metrics["echo_delay_ms"] == 61.0


def test_a_barge_in_is_recorded_with_its_reaction_from_the_onset_to_the_pause():
    events = [
        *answered(),
        ReplyPaused(1, ms(3120), onset_t_ns=ms(3000), overlap_turn=2),
        OverlapHeard(1, ms(3900), overlap_turn=2, text="What about Spain?", verdict=OverlapVerdict.BARGE_IN),
        BargeIn(1, ms(3120), onset_t_ns=ms(3000), device_latency_ms=40.0),
        PlaybackEnded(1, ms(3950)),
        TurnCancelled(1, ms(3950), CancelReason.INTERRUPTED, "Paris is"),
    ]
    record = build_record(1, events)
    assert record.metrics["barge_in_ms"] == 120.0  # 3000 ms onset -> 3120 ms paused
    assert record.overlaps == 1 and record.false_barge_ins == 0
    assert record.overlap_heard == ["barge-in 'What about Spain?'"]
    assert record.cancelled == "interrupted" and record.reply == "Paris is" and not record.continued
    assert "barge-in 120 ms" in record.summary()
    # the speech that interrupted is the next turn's: its record has no barge-in
    assert build_record(2, events).metrics["barge_in_ms"] is None


def test_a_question_continued_over_its_reply_marks_the_record_continued():
    events = [
        *answered(),
        ReplyPaused(1, ms(2330), onset_t_ns=ms(2300), overlap_turn=2),
        OverlapHeard(1, ms(3300), 2, "the largest ocean on Earth", OverlapVerdict.CONTINUATION),
        PlaybackEnded(1, ms(3310)),
        TurnCancelled(1, ms(3310), CancelReason.CONTINUED, ""),
        TranscriptReady(2, ms(4500), "What is the largest, the largest ocean on Earth?", held_turns=(1,)),
    ]
    first, second = build_record(1, events), build_record(2, events)
    assert first.continued and first.cancelled == "continued"
    assert first.overlap_heard == ["continuation 'the largest ocean on Earth'"]
    assert "continued: answered with the next turn" in first.summary()
    assert second.held_turns == [1] and not second.continued and second.overlaps == 0


def test_a_reply_without_speech_over_it_records_no_overlap_and_no_echo_reading_without_a_canceller():
    record = build_record(1, [*answered(), PlaybackEnded(1, ms(5000))])
    assert (record.overlaps, record.false_barge_ins, record.overlap_heard) == (0, 0, [])
    assert not record.continued
    assert [record.metrics[k] for k in ("barge_in_ms", "erle_db", "echo_delay_ms")] == [None, None, None]
    assert record.duplex_notes() == []


def test_the_duplex_fields_reach_the_json_line_and_the_report(tmp_path):
    events = [
        *answered(),
        ReplyPaused(1, ms(3150), onset_t_ns=ms(3000), overlap_turn=2),
        OverlapHeard(1, ms(3500), overlap_turn=2, text="Stop.", verdict=OverlapVerdict.STOP),
        BargeIn(1, ms(3150), onset_t_ns=ms(3000)),
        TurnCancelled(1, ms(3550), CancelReason.INTERRUPTED, "Paris"),
        EchoMeasured(1, ms(3560), erle_db=18.0, delay_ms=60.0),
    ]
    record = build_record(1, events)
    line = json.loads(record.to_json())
    assert line["overlaps"] == 1 and line["false_barge_ins"] == 0 and line["continued"] is False
    assert line["overlap_heard"] == ["stop 'Stop.'"]
    assert line["metrics"]["barge_in_ms"] == 150.0 and line["metrics"]["erle_db"] == 18.0
    csv_path, json_path = export_report([record], tmp_path, "duplex")
    (row,) = csv.DictReader(csv_path.open())
    assert row["barge_in_ms"] == "150.000" and row["erle_db"] == "18.000" and row["echo_delay_ms"] == "60.000"
    assert row["overlaps"] == "1" and row["overlap_heard"] == "stop 'Stop.'"
    report = json.loads(json_path.read_text())
    assert report["percentiles"]["barge_in_ms"]["p50"] == 150.0
    assert report["percentiles"]["erle_db"]["n"] == 1
    assert "ERLE 18 dB, echo delay 60 ms" in record.summary()
