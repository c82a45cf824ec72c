"""The turn engine's rules, driven by scripted timelines: milliseconds, no threads, no devices.

A timeline is speech and silence in 32 ms chunks. A scripted VAD calls a chunk speech when it
is loud, a scripted Smart Turn answers the probabilities it is given, and the real
:class:`~assistant.stages.vad.Endpointer` and :class:`~assistant.stages.endpoint.SmartTurnPolicy`
turn them into events for the real :class:`~assistant.turns.engine.TurnEngine`, called the way
the live loop calls it (:meth:`mic_block` for every block, :meth:`handle` for every event).
The test plays the other threads' part at scripted times: the reply's first audio
(``claim_audio``), its work ending (``ended``), the microphone lost. The timeline is
``tests/helpers/timeline.py``; the rules of speech over a reply (full duplex) are in
``test_full_duplex_turns.py``.
"""

from __future__ import annotations

import pytest

from assistant.config.sections import TurnOptions, VadOptions
from assistant.events import (
    CancelReason,
    DiscardReason,
    SpeculationConfirmed,
    SpeechEnded,
    SpeechOnset,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    TurnCancelled,
    TurnDecision,
)
from assistant.turns.engine import (
    BargeIn,
    Cancel,
    Confirm,
    Discard,
    Emit,
    MicBlock,
    PauseReply,
    Start,
    StopSpeaker,
    TurnEngine,
    TurnRules,
)
from tests.helpers.timeline import Script


def test_a_finished_question_is_speculated_at_the_pause_and_confirmed_at_the_first_score():
    s = Script(probabilities=[0.9]).speak(1000).pause(600)
    (start,) = s.of(Start)
    assert not start.confirmed and isinstance(start.first, SpeechPaused)
    assert s.of(Confirm) == [Confirm(start.attempt)]
    (decision,) = [e for e in s.events if isinstance(e, TurnDecision)]
    assert decision.reason == "model" and decision.silence_ms == pytest.approx(
        224, abs=1
    )  # first chunk >= 200 ms
    (ended,) = [e for e in s.events if isinstance(e, SpeechEnded)]
    assert (ended.t_ns - ended.speech_end_t_ns) / 1e6 == pytest.approx(224 + 50, abs=1)  # pause + inference
    assert any(isinstance(a, Emit) and isinstance(a.event, SpeculationConfirmed) for _, a in s.actions)
    assert s.when(Start)[0] < s.when(Confirm)[0]  # the work began inside the silence wait


def test_a_mid_sentence_pause_waits_and_the_speech_that_comes_back_discards_the_speculation():
    s = Script(probabilities=[0.1, 0.9]).speak(800).pause(400).speak(800).pause(600)
    starts, discards = s.of(Start), s.of(Discard)
    assert [st.turn_id for st in starts] == [1, 1]  # one turn: both halves
    assert discards == [Discard(starts[0].attempt, DiscardReason.SPEECH_RESUMED)]
    assert s.of(Confirm) == [Confirm(starts[1].attempt)]
    assert s.event_kinds().count("SpeechEnded") == 1
    # The second look covered both halves of the utterance, not only the last one.
    assert s.model.scored[-1] > 1.5


def test_without_speculation_nothing_starts_before_the_end_of_the_turn():
    s = Script(rules=TurnRules(speculate=False), probabilities=[0.9]).speak(1000).pause(600)
    (start,) = s.of(Start)
    assert start.confirmed and isinstance(start.first, SpeechEnded) and not s.of(Confirm)


def test_an_unsure_model_ends_the_turn_at_the_silence_cap_not_before():
    s = Script(probabilities=[0.2]).speak(1000).pause(1500)
    decisions = [e for e in s.events if isinstance(e, TurnDecision)]
    assert [d.reason for d in decisions] == ["model", "model", "model", "model", "max silence"]
    assert [round(d.silence_ms) for d in decisions[:2]] == [224, 544]  # scored again every 300 ms
    assert decisions[-1].complete and decisions[-1].silence_ms >= 1200
    assert len(s.of(Confirm)) == 1  # the speculative run, confirmed at the cap


def test_a_question_mark_in_the_speculative_transcript_ends_the_turn_after_half_a_second():
    """Smart Turn called "Can you tell me what the capital of France is?" unfinished (0.11)."""
    s = Script(probabilities=[0.11]).speak(1000).pause(320)
    s.transcribes("Can you tell me what the capital of France is?")
    s.pause(1000)
    decisions = [e for e in s.events if isinstance(e, TurnDecision)]
    assert [(d.reason, d.complete) for d in decisions] == [("model", False), ("question", True)]
    assert decisions[-1].probability == pytest.approx(0.11) and decisions[-1].silence_ms == 512
    assert len(s.of(Confirm)) == 1  # the speculative run, confirmed at the question


def test_without_a_question_mark_an_unsure_turn_still_waits_for_the_cap():
    s = Script(probabilities=[0.11]).speak(1000).pause(320)
    s.transcribes("I was wondering...")
    s.pause(1000)
    assert [e.reason for e in s.events if isinstance(e, TurnDecision) and e.complete] == ["max silence"]


def test_a_short_question_that_may_open_a_longer_one_waits_for_the_model():
    """ "Can you tell me? ... what time it is": Whisper writes the opener as a question."""
    s = Script(probabilities=[0.11]).speak(1000).pause(320)
    s.transcribes("Can you tell me?")
    s.pause(600)
    assert not [e for e in s.events if isinstance(e, TurnDecision) and e.complete]  # listening on
    s.speak(800).pause(320)
    s.transcribes("Can you tell me what time it is?")
    s.pause(600)
    (end,) = [e for e in s.events if isinstance(e, TurnDecision) and e.complete]
    assert end.reason == "question" and s.event_kinds().count("SpeechEnded") == 1


def test_a_late_question_of_an_earlier_pause_does_not_end_the_next_one():
    """The user went on: the discarded run's transcript ("What is the weather?") came late."""
    s = Script(probabilities=[0.11]).speak(1000).pause(320).speak(600).pause(160)
    s.transcribes("What is the weather?", run=0)
    s.pause(1200)
    assert [e.reason for e in s.events if isinstance(e, TurnDecision) and e.complete] == ["max silence"]
    s = Script(probabilities=[0.11], turn=TurnOptions(question_ms=0)).speak(1000).pause(320)
    s.transcribes("What is the weather?")  # and question_ms 0 turns the rule off
    s.pause(1000)
    assert [e.reason for e in s.events if isinstance(e, TurnDecision) and e.complete] == ["max silence"]


def test_speech_after_the_endpoint_but_before_the_reply_rejoins_the_turn():
    s = Script().speak(1000).pause(400)  # ended and confirmed; the reply has not played
    first = s.of(Start)[0]
    s.speak(600).pause(600)
    resumed = [e for e in s.events if isinstance(e, SpeechResumed)]
    assert resumed and resumed[0].after_endpoint and resumed[0].turn_id == 1
    assert Discard(first.attempt, DiscardReason.SPEECH_RESUMED) in s.of(Discard)
    assert [st.turn_id for st in s.of(Start)] == [1, 1]  # answered once, as one turn
    assert not s.plays(first.attempt)  # the discarded reply may not play


def test_a_turn_that_went_on_after_its_endpoint_is_answered_when_the_microphone_closes():
    """It had ended once: closing the microphone (a reply beginning in half duplex) ends it there.

    A UI check: a spoken question waited behind a typed one, the typed reply's echo reopened it
    (``SpeechResumed`` after the endpoint), the echo path moved and the microphone closed: the
    whole question was dropped ("not heard").
    """
    s = Script().speak(1000).pause(400)  # ended and confirmed; its reply has not begun
    first = s.of(Start)[0]
    s.speak(300)  # it goes on: the run is discarded
    assert Discard(first.attempt, DiscardReason.SPEECH_RESUMED) in s.of(Discard)
    s.closed = True
    s.speak(64)
    assert not [e for e in s.of(Emit) if isinstance(e.event, TurnCancelled)], s.actions
    again = s.of(Start)[-1]
    assert again.turn_id == 1 and again.confirmed and again is not first
    assert isinstance(again.first, SpeechEnded) and again.first.duration_ms >= 1300  # all of it


def test_once_the_reply_plays_the_microphone_is_not_heard_and_new_speech_is_a_new_turn():
    s = Script().speak(1000).pause(400)
    first = s.of(Start)[0]
    assert s.plays(first.attempt)
    heard = len(s.events)
    s.speak(600)  # the assistant's own voice, heard through the speakers
    assert s.blocks[-19:] == [MicBlock.CLOSE] + [MicBlock.IGNORE] * 18 and len(s.events) == heard
    s.ends(first.attempt)
    s.pause(64).speak(600).pause(600)
    assert MicBlock.RESTART in s.blocks and s.blocks[-1] is MicBlock.FEED
    assert [st.turn_id for st in s.of(Start)][-1] == 2 and not s.of(Discard) and not s.of(BargeIn)


def test_with_barge_in_speech_over_the_reply_stops_it_and_becomes_the_next_turn():
    s = Script(rules=TurnRules(barge_in="on")).speak(1000).pause(400)
    first = s.of(Start)[0]
    assert s.plays(first.attempt)
    s.pause(2000).speak(600)  # after the continuation window
    onset = next(e for e in s.events if isinstance(e, SpeechOnset) and e.turn_id == 2)
    (paused,) = s.of(PauseReply)
    assert paused == PauseReply(first.attempt, 1, onset.onset_t_ns, 2)
    assert s.when(PauseReply)[0] - onset.onset_t_ns / 1e6 <= 200  # within 200 ms of the first speech
    assert not s.of(BargeIn) and not s.of(Start)[1:]  # nothing decided before its words
    s.pause(300)
    assert s.judged("What about Germany?")[1:3] == [
        BargeIn(first.attempt, 1, onset.onset_t_ns, s.when(PauseReply)[0] * 1_000_000),
        StopSpeaker(),
    ]
    assert not s.plays(first.attempt)  # no further piece plays
    # Its end came while it was judged: the answer starts now, confirmed.
    assert s.of(Start)[-1].turn_id == 2 and s.of(Start)[-1].confirmed
    s.ends(first.attempt)


@pytest.mark.parametrize("barge_in", ["off", "on"])
def test_speech_rejoining_a_turn_whose_reply_just_started_playing_never_discards_it(barge_in):
    """The race the floor lock decides: the block was fed as the open turn's, then the reply played."""
    engine = TurnEngine(TurnRules(barge_in=barge_in))
    (start,) = engine.handle(SpeechEnded(1, 10, 5), now_ns=10)
    assert isinstance(start, Start) and engine.claim_audio(start.attempt, 10)
    actions = engine.handle(SpeechResumed(1, 20, after_endpoint=True), now_ns=20)
    assert not [a for a in actions if isinstance(a, Discard)]  # what played stays played
    # With barge-in the reply is held while the speech is judged; it is the turn's own rest.
    assert actions == ([PauseReply(start.attempt, 1, 20, 1)] if barge_in == "on" else [])


def test_a_turn_cut_for_length_drops_its_speculation_and_is_only_held():
    vad = VadOptions(max_utterance_s=3.0, cut_search_ms=0)
    s = Script(vad=vad, probabilities=[0.1]).speak(2700).pause(600).speak(1000).pause(1500)
    ended = [e for e in s.events if isinstance(e, SpeechEnded)]
    assert [e.cut for e in ended] == [True, False] and ended[1].after_cut
    assert isinstance(s.of(Start)[0].first, SpeechPaused)  # speculating when the cut came
    spec = s.of(Start)[0]
    assert Discard(spec.attempt, DiscardReason.CUT_FOR_LENGTH) in s.of(Discard)
    cut_run = next(st for st in s.of(Start) if isinstance(st.first, SpeechEnded) and st.first.cut)
    assert cut_run.confirmed and cut_run.turn_id == 1  # runs only to hold the speech (the pipeline's part)
    assert s.of(Start)[-1].turn_id == 2


def test_a_lost_microphone_drops_the_speculation_and_cancels_the_turn():
    s = Script(probabilities=[0.1]).speak(1000).pause(300)
    spec = s.of(Start)[0]
    actions = s.engine.microphone_lost(speech_turn=1, held_turns=[], now_ns=s.t_ns)
    assert actions[0] == Discard(spec.attempt, DiscardReason.MICROPHONE_LOST)
    assert isinstance(actions[1], Emit) and actions[1].event == TurnCancelled(
        1, s.t_ns, CancelReason.MICROPHONE_LOST
    )


def test_a_lost_microphone_with_only_held_speech_cancels_the_held_turn():
    engine = TurnEngine()
    (action,) = engine.microphone_lost(speech_turn=0, held_turns=[3, 4], now_ns=7)
    assert action == Emit(TurnCancelled(4, 7, CancelReason.MICROPHONE_LOST))
    assert TurnEngine().microphone_lost(0, [], 7) == []


def test_a_closed_microphone_is_ignored_and_listening_again_restarts_the_endpointer():
    s = Script(closed=True).speak(500)
    assert s.blocks[0] is MicBlock.CLOSE and set(s.blocks[1:]) == {MicBlock.IGNORE} and not s.events
    assert not s.actions  # nothing was heard: nothing to drop
    s.closed = False
    s.speak(64)
    assert s.blocks[-2] is MicBlock.RESTART and s.blocks[-1] is MicBlock.FEED_SEALED


def test_a_question_muted_after_its_pause_drops_its_speculation_and_the_next_one_is_answered():
    """Before, the speculative run waited for an end that never came, and every later turn behind it."""
    s = Script(probabilities=[0.1]).speak(1000).pause(300)
    (spec,) = s.of(Start)
    assert not spec.confirmed
    s.closed = True  # the user mutes mid-question
    s.pause(500)
    assert s.of(Discard) == [Discard(spec.attempt, DiscardReason.NOT_HEARD)]
    (cancelled,) = [a.event for a in s.of(Emit) if isinstance(a.event, TurnCancelled)]
    assert (cancelled.turn_id, cancelled.reason) == (1, CancelReason.NOT_HEARD)
    s.ends(spec.attempt)  # its thread sees the discard and returns
    s.closed = False
    s.speak(800).pause(1500)
    nxt = s.of(Start)[-1]
    assert nxt.turn_id == 2 and Confirm(nxt.attempt) in s.of(Confirm)
    assert [a.id for a in s.engine.attempts] == [nxt.attempt]  # nothing left before it to wait on


def test_partials_come_every_interval_while_speaking_and_never_during_the_turns_work():
    engine = TurnEngine(TurnRules(partials=True, partial_interval_ms=700))
    assert [engine.partial_due(ms, True) for ms in (300, 700, 1000, 1400, 1500)] == [
        False,
        True,
        False,
        True,
        False,
    ]
    assert not engine.partial_due(3000, in_speech=False)
    engine.submit(1, "hello")
    assert not engine.partial_due(5000, True)  # the turn's own work comes first
    assert not TurnEngine(TurnRules(partials=False)).partial_due(5000, True)


def test_typed_turns_are_confirmed_and_interrupt_cancels_every_run_and_the_speaker():
    engine = TurnEngine()
    a, b = engine.submit(1, "hi"), engine.submit(2, "there")
    assert a.confirmed and b.confirmed and a.attempt != b.attempt and engine.busy()
    assert engine.interrupt() == [Cancel(a.attempt), Cancel(b.attempt), StopSpeaker()]
    assert not engine.claim_audio(a.attempt, 0)
    engine.ended(a.attempt)
    engine.ended(b.attempt)
    assert not engine.busy() and not engine.speaking()


def test_speech_started_does_not_interrupt_without_barge_in():
    engine = TurnEngine()
    start = engine.submit(1, "hi")
    assert engine.claim_audio(start.attempt, 0) and engine.speaking()
    assert engine.handle(SpeechStarted(2, 5), 6) == []
    assert engine.handle(SpeechOnset(2, 5, 4), 6) == []
