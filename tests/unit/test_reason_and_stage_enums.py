"""Cancel reasons and engine-progress stages are enums that keep their words.

Records (``--log``), events (``--events``), the metrics' labels and the UI show the words; the
members must equal them, print as them and serialise as them, so nothing a user or a dashboard
reads changed when the strings became enums.
"""

from __future__ import annotations

import json

import numpy as np

from assistant.app import EngineSteps
from assistant.events import (
    CancelReason,
    DiscardReason,
    SpeechEnded,
    TurnCancelled,
    TurnDone,
)
from assistant.observe.latency import TurnRecord, build_record
from assistant.stages.playback import AudioSink, FileSink
from assistant.turns.protocols import ReplyGate
from engines.progress import CACHES, REBUILD_REASONS, Cache, ConsolePrinter, EngineProgress, Stage

OLD_CANCEL_WORDS = {
    "INTERRUPTED": "interrupted",
    "NO_WORDS": "no words recognised",
    "SPEAKER_LOST": "speaker lost",
    "MICROPHONE_LOST": "microphone lost",
    "LLM_SERVER_LOST": "llm server lost",
    "CONTINUED": "continued",  # new with full duplex: the question went on over its reply
    "NOT_HEARD": "not heard",  # new: the microphone closed or gated before the speech ended
}


def test_every_cancel_reason_is_its_old_word():
    assert {m.name: m.value for m in CancelReason} == OLD_CANCEL_WORDS
    for member in CancelReason:
        assert member == member.value and str(member) == member.value and f"{member}" == member.value
    assert [str(m) for m in DiscardReason] == [
        "speech resumed",
        "cut for length",
        "microphone lost",
        "not heard",
    ]


def test_a_cancelled_turn_is_recorded_with_the_word():
    events = [
        SpeechEnded(1, 2_000, speech_end_t_ns=1_000, audio=np.zeros(1600, np.float32)),
        TurnCancelled(1, 3_000, CancelReason.SPEAKER_LOST, "Paris."),
    ]
    record = build_record(1, events)
    assert record.cancelled == "speaker lost"
    assert json.loads(record.to_json())["cancelled"] == "speaker lost"
    assert isinstance(TurnDone(1, 4_000, record).record, TurnRecord)


def test_a_reply_gate_discarded_without_a_reason_says_speech_resumed():
    gate = ReplyGate(confirmed=False)
    gate.discard()
    assert gate.reason == DiscardReason.SPEECH_RESUMED == "speech resumed"


def test_engine_progress_stages_and_caches_keep_their_words():
    words = "export parse build save cached miss rebuild warmup done convert wait gate"
    assert [str(s) for s in Stage] == words.split()
    assert CACHES == ("onnx_export", "engine", "timing_cache", "runtime_cache", "compile_cache")
    assert REBUILD_REASONS == ("unusable", "incompatible")
    lines: list[str] = []
    printer = ConsolePrinter(lines.append)
    printer(EngineProgress(Stage.CACHED, "engine cache hit", t_ns=printer.start_ns, cache=Cache.ENGINE))
    assert lines == ["[   0.0 s] cached: engine cache hit"]


def test_the_load_bar_jumps_to_the_end_of_its_span_on_a_cache_hit():
    seen: list[tuple[str, float]] = []
    steps = EngineSteps(lambda text, fraction: seen.append((text, fraction)), span=(0.1, 0.5))
    steps(EngineProgress(Stage.BUILD, "Building", phase="Building", step=1, num_steps=4, t_ns=1))
    steps(EngineProgress(Stage.CACHED, "engine cache hit", t_ns=2))
    assert seen == [("building engine: Building", 0.2), ("engine cache hit", 0.5)]


def test_the_file_sink_offers_everything_the_turn_reads():
    sink: AudioSink = FileSink()
    sink.play(3, np.zeros(800, np.float32))
    sink.play(3, np.zeros(800, np.float32))
    assert sink.played_samples == {3: 1600} and 3 in sink.first_audio_t_ns
    assert sink.losses == 0 and not sink.lost.is_set() and sink.output_latency_ms == 0.0
