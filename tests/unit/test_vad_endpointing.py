"""Streaming Silero endpointing on real espeak-ng speech, silence and noise."""

from __future__ import annotations

import numpy as np
import pytest

from assistant.events import OnsetEnded, SpeechEnded, SpeechOnset, SpeechPaused, SpeechStarted, TurnDecision
from assistant.stages.vad import CHUNK_NS, SAMPLE_RATE_HZ, Endpointer, VadOptions
from bench.speech import silence, speak

NS_PER_SAMPLE = 1e9 / SAMPLE_RATE_HZ


def run(endpointer: Endpointer, audio: np.ndarray, block: int = 512, t0_ns: int = 10**12):
    """Turn events of ``audio`` fed in blocks as a capture callback would.

    Onsets (and their end, when too short for a turn), pauses and the fixed-silence decision are
    left out (``test_turn_taking`` and ``test_turn_engine`` have them).
    """
    events = endpointer.feed_recording(audio, t0_ns, block)
    return [e for e in events if not isinstance(e, SpeechOnset | OnsetEnded | SpeechPaused | TurnDecision)]


@pytest.fixture(scope="module")
def question(tmp_path_factory):
    return speak("What is the capital of France?", tmp_path_factory.mktemp("speech"))


def test_one_question_is_one_turn_with_pre_roll_and_timely_endpoint(question):
    opts = VadOptions()
    audio = np.concatenate([silence(1.0), question, silence(1.5)])
    events = run(Endpointer(opts), audio)
    assert [type(e) for e in events] == [SpeechStarted, SpeechEnded]
    started, ended = events
    assert started.turn_id == ended.turn_id == 1
    t0 = 10**12
    onset_s = (started.t_ns - t0) / 1e9
    assert 0.9 <= onset_s <= 1.3  # speech starts just after the 1 s of silence
    delay_ms = (ended.t_ns - ended.speech_end_t_ns) / 1e6
    assert opts.end_silence_ms <= delay_ms <= opts.end_silence_ms + CHUNK_NS / 1e6
    speech_s = question.size / SAMPLE_RATE_HZ
    # The utterance holds all of the speech plus the pre-roll (and the trailing silence).
    assert ended.duration_ms / 1000 >= speech_s - 0.3 + opts.pre_roll_ms / 1000 * 0.8
    assert not ended.cut


def test_block_size_does_not_change_the_result(question):
    audio = np.concatenate([silence(0.5), question, silence(1.0)])
    a = run(Endpointer(VadOptions()), audio, block=512)
    b = run(Endpointer(VadOptions()), audio, block=1234)
    assert [(type(e), e.t_ns) for e in a] == [(type(e), e.t_ns) for e in b]


def test_silence_and_white_noise_start_no_turn():
    rng = np.random.default_rng(0)
    noise = (rng.standard_normal(10 * SAMPLE_RATE_HZ) * 0.1).astype(np.float32)
    hum = 0.2 * np.sin(2 * np.pi * 50 * np.arange(5 * SAMPLE_RATE_HZ) / SAMPLE_RATE_HZ).astype(np.float32)
    for audio in (silence(10), noise, hum):
        assert run(Endpointer(VadOptions()), audio) == []


def test_a_40_second_monologue_is_cut_into_turns_and_nothing_is_lost(tmp_path):
    sentence = "and then we walked along the river while the children talked about the weather "
    monologue = speak(sentence * 9, tmp_path, speed_wpm=150)
    assert monologue.size / SAMPLE_RATE_HZ > 35
    opts = VadOptions(max_utterance_s=15.0, end_silence_ms=1000)
    events = run(Endpointer(opts), np.concatenate([monologue, silence(2.0)]))
    ended = [e for e in events if isinstance(e, SpeechEnded)]
    assert len(ended) >= 3 and ended[0].cut
    assert all(e.duration_ms <= opts.max_utterance_s * 1000 + 40 for e in ended)
    total_s = sum(e.duration_ms for e in ended) / 1000
    assert total_s >= monologue.size / SAMPLE_RATE_HZ - 0.5  # every stretch of speech is in a turn
    assert [e.turn_id for e in ended] == sorted({e.turn_id for e in ended})


def test_a_short_click_is_not_a_turn(question):
    click = question[int(0.3 * SAMPLE_RATE_HZ) : int(0.42 * SAMPLE_RATE_HZ)]  # 120 ms of speech
    endpointer = Endpointer(VadOptions(min_speech_ms=250))
    all_events = endpointer.feed_recording(np.concatenate([silence(1), click, silence(1)]), 10**12)
    assert [type(e) for e in all_events] == [SpeechOnset, OnsetEnded]  # heard, and over: no turn


def test_speech_onset_comes_early_and_names_the_turn_it_becomes(question):
    opts = VadOptions()
    t0 = 10**12
    events = Endpointer(opts).feed_recording(np.concatenate([silence(1.0), question, silence(1.0)]), t0)
    events = [e for e in events if not isinstance(e, SpeechPaused | TurnDecision)]
    assert [type(e) for e in events] == [SpeechOnset, SpeechStarted, SpeechEnded]
    onset, started, _ = events
    assert onset.turn_id == started.turn_id == 1
    assert onset.onset_t_ns == started.t_ns
    # Detected after onset_ms of speech (plus at most one chunk), well before the turn starts.
    assert opts.onset_ms <= (onset.t_ns - onset.onset_t_ns) / 1e6 <= opts.onset_ms + 2 * CHUNK_NS / 1e6
    assert onset.t_ns < started.t_ns + opts.min_speech_ms * 1_000_000


def test_noise_raises_no_speech_onset_either():
    rng = np.random.default_rng(1)
    noise = (rng.standard_normal(5 * SAMPLE_RATE_HZ) * 0.1).astype(np.float32)
    assert Endpointer(VadOptions()).feed_recording(noise) == []
