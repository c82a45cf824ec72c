"""Turn taking: Smart Turn end of turn, speech after a pause or after the endpoint, speculation.

Real Silero VAD, real Smart Turn, real tiny.en and SmolLM2, real audio through the virtual
PulseAudio devices; the questions are espeak-ng speech with a measured mid-sentence pause.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from assistant.events import (
    AudioStarted,
    SpeculationDiscarded,
    SpeculationStarted,
    SpeechEnded,
    SpeechResumed,
    TurnDecision,
)
from assistant.observe.latency import build_record
from assistant.stages.endpoint import SmartTurnPolicy, TurnOptions, end_of_turn_policy
from assistant.stages.vad import Endpointer, FixedSilence, VadOptions
from bench.speech import paused_question, silence, speak, trim, write_wav
from store.bundled import BUNDLED, DEFAULT_TURN, ModelStore
from tests.helpers.turns import converse, kinds

PAUSE_S = 0.7


@pytest.fixture(scope="module")
def audio_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("turns")


@pytest.fixture(scope="module")
def paused(audio_dir) -> np.ndarray:
    """ "I would like to know ... how many days are in a week?" with a 0.7 s pause."""
    return paused_question(audio_dir, "I would like to know", "how many days are in a week?", PAUSE_S)


@pytest.fixture(scope="module")
def complete(audio_dir) -> np.ndarray:
    return np.concatenate([silence(0.3), trim(speak("What is the capital of France?", audio_dir, "q"))])


@pytest.fixture(scope="module")
def smart_turn(store) -> SmartTurnPolicy:
    policy, notice = end_of_turn_policy(TurnOptions(), VadOptions(), store)
    assert isinstance(policy, SmartTurnPolicy), notice
    return policy


# --- the endpointer and its policies, on recorded speech ----------------------------------


def test_a_complete_question_ends_at_the_first_score_not_at_the_silence_cap(smart_turn, complete):
    events = Endpointer(VadOptions(), policy=smart_turn).feed_recording(
        np.concatenate([complete, silence(2)])
    )
    (ended,) = [e for e in events if isinstance(e, SpeechEnded)]
    (decision,) = [e for e in events if isinstance(e, TurnDecision)]
    assert decision.complete and decision.reason == "model" and decision.probability >= 0.5
    # Scored once, after pause_ms (+ one 32 ms VAD chunk), not after max_silence_ms.
    assert decision.silence_ms < TurnOptions().pause_ms + 64
    assert ended.t_ns == decision.t_ns  # the endpoint is when the model had decided
    assert ended.t_ns - ended.speech_end_t_ns < TurnOptions().max_silence_ms * 1e6 / 2


def test_a_mid_sentence_pause_ends_the_turn_only_with_fixed_silence(smart_turn, paused):
    audio = np.concatenate([paused, silence(2)])
    fixed = Endpointer(VadOptions(end_silence_ms=400)).feed_recording(audio)
    ends = [e for e in fixed if isinstance(e, SpeechEnded)]
    assert len(ends) == 2  # cut off inside the pause: the first half alone was a "turn"
    smart = Endpointer(VadOptions(), policy=smart_turn).feed_recording(audio)
    order = kinds(smart)
    assert order.count("SpeechEnded") == 1 and order.index("SpeechResumed") < order.index("SpeechEnded")
    first_scores = [e for e in smart if isinstance(e, TurnDecision)][:1]
    assert first_scores and not first_scores[0].complete  # "I would like to know" is not done


def test_fixed_silence_speech_after_the_endpoint_rejoins_the_turn_until_sealed(paused):
    ep = Endpointer(VadOptions(end_silence_ms=400))
    events = ep.feed_recording(np.concatenate([paused, silence(1)]))
    resumed = [e for e in events if isinstance(e, SpeechResumed)]
    (final,) = [e for e in events if isinstance(e, SpeechEnded)][-1:]
    assert resumed and resumed[-1].after_endpoint and final.turn_id == 1
    assert final.audio.size >= paused.size - 16000  # both halves
    sealed = Endpointer(VadOptions(end_silence_ms=400))
    ends = []
    audio = np.concatenate([paused, silence(1)])
    for start in range(0, audio.size, 512):
        for e in sealed.feed(audio[start : start + 512], (start + 512) * 62_500):
            if isinstance(e, SpeechEnded):
                ends.append(e.turn_id)
                sealed.seal()  # the reply started playing: later speech is a new turn
    assert ends == [1, 2]


def test_missing_or_damaged_model_falls_back_to_fixed_silence_with_a_notice(tmp_path, store):
    folder = tmp_path / "models" / DEFAULT_TURN
    shutil.copytree(store.path(DEFAULT_TURN), folder)
    model = folder / BUNDLED[DEFAULT_TURN].member_prefix.rsplit("/", 1)[-1]
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    policy, notice = end_of_turn_policy(TurnOptions(), VadOptions(end_silence_ms=450), ModelStore(tmp_path))
    assert isinstance(policy, FixedSilence) and policy.end_silence_ms == 450
    assert "damaged" in notice and "assistant models fetch" in notice and "450 ms" in notice
    model.unlink()
    policy, notice = end_of_turn_policy(TurnOptions(), VadOptions(), ModelStore(tmp_path))
    assert isinstance(policy, FixedSilence) and "assistant models fetch" in notice


def test_turn_options_refuse_bad_values_with_the_fix():
    with pytest.raises(ValueError, match="smart-turn, off"):
        TurnOptions(detection="magic")
    with pytest.raises(ValueError, match="max_silence_ms"):
        TurnOptions(pause_ms=2000, max_silence_ms=1000)


def test_partials_auto_is_on_from_two_cpu_cores_and_with_a_cuda_asr(monkeypatch):
    """Measured on 2 cores, partials no longer delay the answer (docs/benchmarks.md); one core has no room."""
    from assistant.stages.endpoint import with_partials_resolved

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    assert with_partials_resolved(TurnOptions(), "cpu").partials == "on"
    assert with_partials_resolved(TurnOptions(partials="off"), "cpu").partials == "off"
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    assert with_partials_resolved(TurnOptions(), "cpu").partials == "off"
    assert with_partials_resolved(TurnOptions(), "cuda").partials == "on"
    assert with_partials_resolved(TurnOptions(partials="on"), "cpu").partials == "on"
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(8)))
    assert with_partials_resolved(TurnOptions(), "cpu").partials == "on"
    assert with_partials_resolved(TurnOptions(partials="off"), "cuda").partials == "off"


# --- the record of a turn whose speculative work was discarded -----------------------------


def test_record_skips_discarded_attempts_and_counts_the_work_done_in_the_wait():
    from assistant.events import (
        PromptSubmitted,
        SentenceReady,
        SpeechPaused,
        TokenGenerated,
        TranscriptReady,
    )

    ms = 1_000_000
    events = [
        SpeechPaused(1, 100 * ms, 0),
        SpeculationStarted(1, 100 * ms, "asr"),
        TranscriptReady(1, 400 * ms, "I would like to know"),
        SpeechResumed(1, 500 * ms),
        SpeculationDiscarded(1, 520 * ms, "speech resumed", 420.0),
        SpeechPaused(1, 2000 * ms, 0),
        SpeculationStarted(1, 2000 * ms, "asr"),
        TranscriptReady(1, 2300 * ms, "I would like to know how many days are in a week."),
        PromptSubmitted(1, 2301 * ms, 50, 40),
        TokenGenerated(1, 2400 * ms, 0, "Seven"),
        TurnDecision(1, 2350 * ms, True, 0.9, 60.0, 224.0, "model"),
        SpeechEnded(1, 2350 * ms, 1900 * ms),
        SentenceReady(1, 2600 * ms, 0, "Seven days."),
        AudioStarted(1, 2620 * ms),
    ]
    rec = build_record(1, events)
    assert rec.transcript.endswith("week.") and rec.discarded == 1 and rec.resumed == 1
    m = rec.metrics
    assert m["endpointing_ms"] == 450 and m["turn_detection_ms"] == 60
    assert m["asr_ms"] == 0  # ready 50 ms before the endpoint: nothing waited for
    assert m["speculated_ms"] == 350  # speculation start -> endpoint (before the first sentence)
    assert m["tts_first_audio_ms"] == 20 and m["voice_to_voice_ms"] == 720
    assert rec.turn_detector == "model 0.90" and rec.turn_probability == 0.9


# --- live, on the virtual devices -----------------------------------------------------------


def answers_the_whole_question(records, turns) -> None:
    (record,) = records
    words = re.sub(r"[^a-z ]", "", record.transcript.lower())
    assert "know" in words and "week" in words, record.transcript  # both halves were heard
    # ... and answered as one question. Whether SmolLM2-135M says "seven" is its business: on
    # "how many days are in that week" (a live capture's transcript) it once apologised instead.
    assert record.reply and not record.cancelled, record
    (turn,) = turns  # one user turn in the history, the whole question
    assert "week" in turn.user.lower()


def test_speech_after_the_endpoint_but_before_the_reply_joins_the_turn(
    live_session, pulse, audio_dir, paused
):
    """Fixed 550 ms silence, no speculation: the endpoint fires inside the 0.7 s pause.

    Before this change the microphone was gated from the endpoint on, so the second half
    was never heard and the reply answered "I would like to know". The reply starts ~0.5 s
    after the endpoint (ASR on the fitted window, 3-word first chunk) and the second half is
    heard ~0.8 s after the first ends, so the endpoint sits between: 550 ms leaves ~0.15 s
    to the second half and ~0.25 s to the reply (at 400 ms the reply won twice in
    two-worker runs, and the question became a continuation). Partials off, as ``auto``
    resolves on 2 cores.
    """
    endpointer = Endpointer(VadOptions(end_silence_ms=550))
    records, events, turns = converse(
        live_session,
        pulse,
        audio_dir,
        paused,
        endpointer,
        TurnOptions(detection="off", speculate=False, partials="off"),
        "rejoin",
    )
    order = kinds(events)
    first_end = order.index("SpeechEnded")
    rejoined = [i for i, e in enumerate(events) if isinstance(e, SpeechResumed) and e.after_endpoint]
    timeline = [(type(e).__name__, round((e.t_ns - events[0].t_ns) / 1e6)) for e in events]
    assert rejoined and first_end < rejoined[0], timeline  # cut off inside the pause, then rejoined
    assert "SpeculationDiscarded" in order  # the pending reply was dropped, unplayed
    answers_the_whole_question(records, turns)
    assert order.count("AudioStarted") == 1


def test_turn_detection_waits_through_the_pause_and_answers_the_whole_question(
    live_session, pulse, audio_dir, paused
):
    session, _ = live_session
    records, events, turns = converse(
        live_session, pulse, audio_dir, paused, session.endpointer(), TurnOptions(), "smart"
    )
    order = kinds(events)
    assert order.index("SpeechResumed") < order.index("SpeechEnded")  # no endpoint in the pause
    assert order.count("SpeechEnded") == 1
    answers_the_whole_question(records, turns)
    decision = records[0].turn_detector
    assert decision.startswith(("model", "question", "max silence")), decision


def test_speech_resumed_during_speculative_generation_discards_it_unplayed(
    live_session, pulse, audio_dir, tmp_path
):
    """A long pause (2.5 s) under a long fixed silence (4 s): the reply is being generated when the
    user goes on. It never plays, the history keeps one user turn, the answer is to the whole question.
    """
    audio = paused_question(tmp_path, "I would like to know", "how many days are in a week?", 2.5)
    endpointer = Endpointer(VadOptions(end_silence_ms=4000), policy=FixedSilence(4000), pause_ms=128)
    records, events, turns = converse(
        live_session, pulse, audio_dir, audio, endpointer, TurnOptions(detection="off"), "speculate"
    )
    order = kinds(events)
    resumed = order.index("SpeechResumed")
    llm = [i for i, e in enumerate(events) if isinstance(e, SpeculationStarted) and e.stage == "llm"]
    assert llm and llm[0] < resumed, order  # generation had begun when the user went on
    assert "SpeculationDiscarded" in order[resumed:]
    ended = next(e for e in events if isinstance(e, SpeechEnded))
    (started,) = [e for e in events if isinstance(e, AudioStarted)]
    assert started.t_ns > ended.t_ns  # nothing played before the end of the whole turn
    answers_the_whole_question(records, turns)
    assert records[0].discarded >= 1


# --- the UI ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_partial_transcript_shows_while_the_user_speaks(pulse, audio_dir, monkeypatch):
    """A 5 s question into the virtual mic: words appear before the final transcript (Pilot)."""
    from assistant.tui.app import AssistantApp
    from tests.helpers.tui import builder, settings, sound_server_env, wait_until

    sound_server_env(monkeypatch, pulse)
    text = "Could you please tell me what the capital city of France is, and why so many people visit it?"
    wav = write_wav(audio_dir / "long.wav", np.concatenate([speak(text, audio_dir, "long"), silence(0.5)]))
    s = settings(**{"decoder.backend": "pytorch", "turn.partials": "on"})  # whatever auto says
    app = AssistantApp(builder(s), settings=s, gpu=False)
    seen: list[tuple[str, bool]] = []  # (the user line, whether the final transcript existed then)

    def answered() -> bool:
        from assistant.tui.conversation import Conversation

        lines = [str(w.render()) for w in app.query_one(Conversation)._user.values()]
        done = bool(app.records) or final()
        seen.extend((line, done) for line in lines)
        return bool(app.records)

    def final() -> bool:
        from assistant.events import TranscriptReady

        return any(isinstance(e, TranscriptReady) for e in app.turn_events.get(1, []))

    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.loop is not None and app.session is not None)
        play = await asyncio.create_subprocess_exec(
            "paplay", "--device=micfeed", str(wav), env={**os.environ, **pulse}
        )
        await wait_until(pilot, answered)
        assert await play.wait() == 0
        (record,) = app.records
        partials = [line for line, done in seen if line.endswith("…") and not done]
        assert partials, seen  # words shown before the final transcript existed
        assert re.search(r"you: \w+", partials[0]), partials
        assert record.partials >= 1 and "capital" in record.transcript.lower()
        await pilot.press("q")
