"""Speech over a playing reply (full duplex), driven by scripted timelines: milliseconds, no devices.

The real endpointer, Smart Turn policy and turn engine (``tests/helpers/timeline.py``), with
``echo_ok`` set as the live loop sets it once echo cancellation has converged. The judge
thread's part (the transcript of the speech over the reply) is played by ``Script.judged``.
"""

from __future__ import annotations

import pytest

from assistant.events import (
    OverlapHeard,
    OverlapVerdict,
    ReplyResumed,
    SpeechOnset,
    SpeechResumed,
    TurnCancelled,
)
from assistant.turns.engine import (
    BargeIn,
    Confirm,
    ContinueTurn,
    Discard,
    Emit,
    Judge,
    MicBlock,
    PauseReply,
    ResumeReply,
    Start,
    StopSpeaker,
    TurnRules,
)
from assistant.turns.overlap_words import (
    judge,
    rest_after,
    spotted_stop,
    starts_with_stop,
    stop_candidates,
    worth_spotting,
)
from tests.helpers.timeline import Script


def replying(
    rules: TurnRules | None = None,
    echo_ok: bool = True,
    after_ms: float = 0,
    scores: tuple[float, ...] = (0.9,),
) -> tuple[Script, Start]:
    """A question answered, its reply's first audio playing, then ``after_ms`` of the reply.

    ``scores``: Smart Turn's answers, the question's first (0.9: it is finished).
    """
    s = Script(rules=rules or TurnRules(), probabilities=list(scores))
    s.engine.echo_ok = echo_ok
    s.speak(1000).pause(400)
    first = s.of(Start)[0]
    assert s.plays(first.attempt)
    if after_ms:
        s.pause(after_ms)
    return s, first


def verdicts(s: Script) -> list[OverlapVerdict]:
    return [a.event.verdict for a in s.of(Emit) if isinstance(a.event, OverlapHeard)]


def test_in_full_duplex_the_microphone_is_heard_over_the_reply_and_gated_without_it():
    s, _ = replying(echo_ok=True)
    s.speak(64)
    assert s.blocks[-1] is MicBlock.FEED_OVER_REPLY  # heard: new speech is a new turn
    gated, _ = replying(echo_ok=False)
    gated.speak(64)
    assert gated.blocks[-1] is MicBlock.IGNORE  # half duplex: not heard while the reply plays


def test_soft_speech_is_heard_over_the_reply_that_would_not_begin_a_turn_without_one():
    """Over the reply's echo, AEC3 takes the start of a word: a quick "Stop." peaked at 0.3-0.5.

    The endpointer listens with ``over_reply_threshold`` (0.4) while a reply plays.
    """
    s, _ = replying()
    s.speak_softly(160)
    assert s.blocks[-1] is MicBlock.FEED_OVER_REPLY and SpeechOnset in map(type, s.events)
    quiet = Script()
    quiet.speak_softly(500)
    assert quiet.events == []  # no reply: the same speech is under the threshold


def test_speech_over_the_reply_pauses_it_within_200_ms_of_its_onset_and_decides_nothing_yet():
    s, first = replying()
    s.speak(300)
    onset = next(e for e in s.events if isinstance(e, SpeechOnset) and e.turn_id == 2)
    assert s.of(PauseReply) == [PauseReply(first.attempt, 1, onset.onset_t_ns, 2)]
    assert s.when(PauseReply)[0] - onset.onset_t_ns / 1e6 <= 200
    assert not s.of(BargeIn) and not s.of(ContinueTurn) and len(s.of(Start)) == 1


def test_speech_over_the_reply_gets_no_partial_transcripts_its_judge_transcribes_it():
    """A partial pass would hold the model the overlap's judge waits for, and the CPU AEC3 needs."""
    s, _ = replying(TurnRules(partials=True, partial_interval_ms=300), after_ms=2000)
    assert s.engine.partial_due(700, True)  # the reply plays, nobody speaks over it: due
    s.speak(400)
    assert s.engine.overlap is not None
    assert not s.engine.partial_due(1400, True)


def test_a_backchannel_resumes_the_reply_and_never_becomes_a_turn():
    s, first = replying(after_ms=2000)
    s.speak(400).pause(300)
    (asked,) = s.of(Judge)
    assert asked.turn_id == 2
    actions = s.judged("Mm-hmm.")
    assert ResumeReply(first.attempt) in actions and not s.of(StopSpeaker)
    assert any(isinstance(a, Emit) and isinstance(a.event, ReplyResumed) for a in actions)
    s.pause(800)  # its end comes: nothing to answer
    assert len(s.of(Start)) == 1 and verdicts(s) == [OverlapVerdict.BACKCHANNEL]
    assert s.plays(first.attempt)  # the reply goes on


def test_a_cough_too_short_for_a_turn_resumes_the_reply_once_it_has_no_words():
    s, first = replying(after_ms=500)
    s.speak(160).pause(600)  # an onset, never a turn (min_speech_ms 250)
    assert s.of(PauseReply) and [j.turn_id for j in s.of(Judge)] == [2]  # judged all the same
    assert s.of(Judge)[0].short  # too short to take the floor: only a stop or a backchannel counts
    s.judged("")
    assert s.of(ResumeReply) == [ResumeReply(first.attempt)]
    assert verdicts(s) == [OverlapVerdict.NOISE] and len(s.of(Start)) == 1 and s.engine.overlap is None


def test_a_stop_too_short_for_a_turn_still_stops_the_reply():
    """ "Stop." can be shorter than a turn (250 ms of speech): it is judged by its words all the same."""
    s, first = replying(after_ms=2500)
    s.speak(160).pause(600)
    s.judged("Stop.")
    assert [b.attempt for b in s.of(BargeIn)] == [first.attempt] and verdicts(s) == [OverlapVerdict.STOP]
    assert len(s.of(Start)) == 1 and s.engine.overlap is None


def test_stop_stops_the_reply_and_nothing_is_answered():
    s, first = replying(after_ms=2500)
    s.speak(400).pause(300)
    actions = s.judged("Stop.")
    barge = actions[1]
    assert isinstance(barge, BargeIn) and actions[1:] == [
        BargeIn(first.attempt, 1, barge.onset_t_ns, barge.paused_t_ns),
        StopSpeaker(),
    ]
    s.ends(first.attempt)
    s.pause(800)
    assert len(s.of(Start)) == 1 and verdicts(s) == [OverlapVerdict.STOP]


def test_the_rest_of_the_question_soon_after_the_reply_began_continues_the_turn():
    """ "I would like to know" ... reply starts ... "how many days are in a week": one question."""
    s, first = replying(after_ms=300)
    s.speak(900).pause(140)  # its first pause: judged there
    s.judged("how many days are in a week")
    assert s.of(ContinueTurn) == [ContinueTurn(first.attempt, hold=True)] and s.of(StopSpeaker)
    assert not s.of(BargeIn) and verdicts(s) == [OverlapVerdict.CONTINUATION]
    assert not s.plays(first.attempt)  # the reply to half the question plays no more
    s.ends(first.attempt)
    s.pause(600)
    answer = s.of(Start)[-1]
    assert answer.turn_id == 2 and (answer.confirmed or Confirm(answer.attempt) in s.of(Confirm))


def test_speech_in_the_window_is_judged_joined_to_the_question_and_that_transcript_answers_it():
    """The rest of the question gets the joined transcript (``Start.heard``): no second ASR pass."""
    joined = object()  # the judge's TranscriptResult of question + rest: the engine only hands it on
    s, first = replying(after_ms=300)
    s.speak(900).pause(140)
    assert s.of(Judge)[-1].joined_with == first.attempt
    s.judged("how many days are in a week", joined)
    (answer,) = [a for a in s.of(Start) if a.turn_id == 2]
    assert answer.heard is joined and s.of(ContinueTurn) == [ContinueTurn(first.attempt, hold=True)]


def test_a_backchannel_in_the_window_is_judged_alone_and_the_reply_resumes():
    """Speech too short to be words ("uh-huh") needs no joined pass: its own greedy words decide."""
    s, first = replying(after_ms=300)
    s.speak(400).pause(140)
    assert s.of(Judge)[-1].joined_with == 0
    s.judged("Uh-huh.")
    assert verdicts(s) == [OverlapVerdict.BACKCHANNEL] and s.of(ResumeReply)
    assert not s.of(ContinueTurn) and s.plays(first.attempt)


def test_later_speech_is_judged_alone_and_its_turn_transcribes_it():
    s, first = replying(after_ms=2500)
    s.speak(900).pause(300)
    assert s.of(Judge)[-1].joined_with == 0
    s.judged("what about germany", object())
    assert s.of(BargeIn) and s.of(Start)[-1].heard is None


def test_words_judged_at_a_pause_the_user_went_on_from_are_not_the_transcript_of_the_longer_speech():
    judged = object()  # question + the rest up to the first pause
    s, first = replying(after_ms=300, scores=(0.9, 0.1, 0.1, 0.9))
    s.speak(600).pause(140)  # judged at this pause...
    s.speak(600).pause(140)  # ...while the user goes on and pauses again
    s.judged("how many days", judged)
    assert s.of(ContinueTurn)
    (answer,) = [a for a in s.of(Start) if a.turn_id == 2]
    assert answer.heard is None  # its run transcribes the whole of it


def test_words_after_the_continuation_window_are_a_barge_in_and_the_next_turn():
    s, first = replying(rules=TurnRules(continuation_ms=1800), after_ms=2000)
    s.speak(900).pause(300)
    s.judged("what about germany")
    assert [a.attempt for a in s.of(BargeIn)] == [first.attempt] and not s.of(ContinueTurn)
    assert verdicts(s) == [OverlapVerdict.BARGE_IN] and s.of(Start)[-1].turn_id == 2


def test_words_opening_with_stop_within_the_window_interrupt_rather_than_continue():
    s, first = replying(after_ms=300)
    s.speak(900).pause(300)
    s.judged("Stop. What is the capital of Germany?")
    assert s.of(BargeIn) and not s.of(ContinueTurn) and s.of(Start)[-1].turn_id == 2


def test_with_barge_in_off_speech_over_the_reply_is_heard_and_answered_after_it():
    s, first = replying(rules=TurnRules(barge_in="off"))
    s.speak(900).pause(600)
    assert not s.of(PauseReply) and not s.of(Judge) and not s.of(BargeIn)
    assert s.of(Start)[-1].turn_id == 2  # never dropped: it waits for the reply (the live loop's order)


def test_words_after_a_backchannel_hold_the_reply_again_and_are_judged_whole():
    s, first = replying(after_ms=2000, scores=(0.9, 0.1, 0.1, 0.9))
    s.speak(400).pause(160)  # a pause (judged), not the end of the turn
    s.judged("Yeah.")
    assert s.of(ResumeReply)
    s.speak(800)
    assert any(isinstance(e, SpeechResumed) and e.turn_id == 2 for e in s.events)
    assert len(s.of(PauseReply)) == 2  # held again
    s.pause(300)
    assert len(s.of(Judge)) == 2
    s.judged("yeah but what about the moon")
    assert [a.attempt for a in s.of(BargeIn)] == [first.attempt] and s.of(Start)[-1].turn_id == 2


def test_a_no_words_verdict_on_speech_that_went_on_meanwhile_waits_for_the_longer_speech():
    s, first = replying(after_ms=2000, scores=(0.9, 0.1, 0.1, 0.9))
    s.speak(400).pause(160)  # judged at this pause...
    s.speak(600)  # ...while the user goes on
    assert s.judged("") == []  # stale: no resume, nothing decided
    assert not s.of(ResumeReply)
    s.pause(300)
    assert len(s.of(Judge)) == 2


def test_a_lost_microphone_while_the_reply_is_held_lets_it_play_on():
    s, first = replying(after_ms=2000)
    s.speak(400)
    assert s.of(PauseReply)
    actions = s.engine.microphone_lost(speech_turn=2, held_turns=[], now_ns=s.t_ns)
    assert ResumeReply(first.attempt) in actions and s.engine.overlap is None


def test_a_reply_paused_for_speech_over_it_plays_on_when_the_echo_path_moves_and_the_mic_is_gated():
    """Half duplex again mid-speech (the echo path moved): the speech will not be judged.

    Before, the reply stayed paused for a verdict that never came, and every later turn (20
    typed questions on the echo rig) waited behind it.
    """
    s, first = replying(after_ms=2000)
    s.speak(300)
    assert s.of(PauseReply)
    s.engine.echo_ok = False  # the duplex went back to half duplex
    gated = len(s.blocks)
    s.speak(300).pause(1000)
    assert s.blocks[gated:] == [MicBlock.CLOSE] + [MicBlock.IGNORE] * (len(s.blocks) - gated - 1)
    assert ResumeReply(first.attempt) in s.of(ResumeReply) and s.engine.overlap is None
    assert verdicts(s) == [OverlapVerdict.NOISE]  # nothing to answer: its "(hearing...)" line goes
    assert [type(a.event) for a in s.of(Emit)][-1] is ReplyResumed
    assert not [a for a in s.of(Emit) if isinstance(a.event, TurnCancelled)]  # no turn of its own
    assert s.engine.overlap_heard(2, "Mm.", s.t_ns) == []  # a verdict on its way changes nothing


def test_a_discarded_or_cancelled_run_is_not_the_turn_more_speech_joins():
    """After a continuation the same turn's later end starts fresh work (the endpointer joined it)."""
    s, first = replying(rules=TurnRules(barge_in="on"))
    actions = s.engine.handle(SpeechResumed(1, s.t_ns, after_endpoint=True), s.t_ns)
    assert actions == [PauseReply(first.attempt, 1, s.t_ns, 1)]
    assert not [a for a in actions if isinstance(a, Discard)]


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("", OverlapVerdict.NOISE),
        ("[coughs]", OverlapVerdict.NOISE),
        (" (clears throat) ", OverlapVerdict.NOISE),
        ("Mm-hmm.", OverlapVerdict.BACKCHANNEL),
        ("Uh-huh", OverlapVerdict.BACKCHANNEL),
        ("Yeah, yeah.", OverlapVerdict.BACKCHANNEL),
        ("Oh okay.", OverlapVerdict.BACKCHANNEL),
        ("Right.", OverlapVerdict.BACKCHANNEL),
        ("Thank you very much.", OverlapVerdict.BACKCHANNEL),  # also Whisper's guess for a hum
        ("Thanks for watching!", OverlapVerdict.NOISE),  # Whisper's invention for a breath
        ("Stop!", OverlapVerdict.STOP),
        ("Top.", OverlapVerdict.STOP),  # "Stop" whose start AEC3 ate under the reply
        ("Up.", OverlapVerdict.STOP),
        ("Stop, please.", OverlapVerdict.STOP),
        ("Please stop.", OverlapVerdict.STOP),
        ("The end is top.", OverlapVerdict.STOP),  # "Please stop." over the reply, as heard on the rig
        ("What is at the top", OverlapVerdict.BARGE_IN),  # not short: a question
        ("Top please.", OverlapVerdict.STOP),
        ("Please up.", OverlapVerdict.STOP),  # "Please stop." with its "st" taken (echo rig, CI)
        ("No, please up.", OverlapVerdict.STOP),
        ("Oh, shut up.", OverlapVerdict.STOP),
        ("Hurry up.", OverlapVerdict.BARGE_IN),  # words that end in "up" are not a stop request
        ("What's up?", OverlapVerdict.BARGE_IN),
        ("Uh-uh.", OverlapVerdict.BACKCHANNEL),
        ("Wait.", OverlapVerdict.STOP),
        ("Hold on.", OverlapVerdict.STOP),
        ("That's enough.", OverlapVerdict.STOP),
        ("how many days are in a week", OverlapVerdict.BARGE_IN),
        ("Yeah, but what about Mars?", OverlapVerdict.BARGE_IN),
        ("Stop. What is the capital of Germany?", OverlapVerdict.BARGE_IN),
        ("okay okay okay okay okay", OverlapVerdict.BARGE_IN),
        # asking it to go on is listening: the reply resumes, never scored as "Hold on."
        ("Go on.", OverlapVerdict.BACKCHANNEL),
        ("Okay, keep going.", OverlapVerdict.BACKCHANNEL),
        ("Please continue.", OverlapVerdict.BACKCHANNEL),
        ("Yes, go ahead.", OverlapVerdict.BACKCHANNEL),
        ("Go on and tell me about Rome.", OverlapVerdict.BARGE_IN),
        ("Hold on.", OverlapVerdict.STOP),
    ],
)
def test_what_speech_over_a_reply_is_judged_from_its_words(text: str, verdict: OverlapVerdict) -> None:
    assert judge(text) is verdict


@pytest.mark.parametrize(
    ("text", "worth"),
    [
        ("Please come.", True),  # "Please stop." with its "st" under the canceller's suppression
        ("Please up", False),  # judged a stop request by its words already
        ("Hold up", True),
        ("What about Rome?", True),
        ("Please stop.", False),  # already a stop request
        ("Uh-huh.", False),  # a backchannel was heard as one
        ("", False),
        ("Thanks for watching!", False),
        ("What is the capital of Germany?", False),  # more words than a stop request has
        ("Go on.", False),  # heard as said: "Hold on." scored only 1.3-1.8 below it under the echo
    ],
)
def test_only_a_few_words_that_are_not_a_stop_request_are_scored_against_one(text: str, worth: bool) -> None:
    assert worth_spotting(text) is worth


@pytest.mark.parametrize(
    ("question", "text", "rest"),
    [
        (
            "I would like to know",
            "I would like to know how many days are in a week.",
            "how many days are in a week.",
        ),
        (
            "Can you tell me?",
            "Can you tell me what the capital of France is?",
            "what the capital of France is?",
        ),
        ("Tell me about the history of Paris.", "Tell me about the history of Paris. Uh-huh.", "Uh-huh."),
        ("Tell me about the history of Paris.", "Tell me about the history of Paris.", ""),  # a cough
        ("I was wondering...", "I was wondering which planet is closest?", "which planet is closest?"),
        ("What is the largest", "What is the biggest, the largest ocean?", "ocean?"),  # the last match
    ],
)
def test_the_rest_is_the_words_after_the_question(question: str, text: str, rest: str) -> None:
    assert rest_after(question, text) == rest


def test_a_stop_phrase_nearly_as_likely_as_the_heard_words_is_what_was_said() -> None:
    """Scores measured with tiny.en: "Please up" -0.47, "Please stop." -0.88 (bench.stop_spotting)."""
    assert spotted_stop(-0.47, {"Please stop.": -0.88, "Stop it.": -6.0}) == "Please stop."
    # "Please stop." said 3 dB down over a reply on the echo rig, heard "Leave me up." (-v log)
    assert spotted_stop(-1.28, {"Please stop.": -2.98, "Hold on.": -6.0}) == "Please stop."
    assert spotted_stop(-0.24, {"Please stop.": -3.75, "Hold on.": -6.0}) is None  # "Please continue."
    assert spotted_stop(-0.36, {"Please stop.": -3.78}) is None  # the closest real words measured
    assert spotted_stop(-1.0, {"Stop.": -2.1, "Wait.": -1.9}) == "Wait."  # the likelier one
    assert spotted_stop(-1.0, {}) is None


@pytest.mark.parametrize(
    ("text", "closest"),
    [
        ("Please come.", "Please stop."),
        ("Please up", "Please stop."),
        ("Hold up.", "Hold on."),
        ("Way.", "Wait."),
    ],
)
def test_the_stop_phrases_closest_in_letters_are_scored(text: str, closest: str) -> None:
    candidates = stop_candidates(text)
    assert len(candidates) == 2 and candidates[0] == closest


def test_an_interruption_is_recognised_by_its_first_words():
    assert starts_with_stop("Stop. What is the capital of Germany?")
    assert starts_with_stop("wait, no, I meant Austria")
    assert not starts_with_stop("what is the capital of Germany")
    assert not starts_with_stop("waiting times at the airport")


def test_a_backchannel_judged_after_it_ended_leaves_the_next_speech_over_the_reply_heard():
    """The judgement came after the backchannel's end: later speech over the reply pauses it again."""
    s, first = replying(after_ms=2000)
    s.speak(400).pause(600)  # "Okay." and its end, before the transcript is back
    assert [type(e).__name__ for e in s.events].count("SpeechEnded") == 2
    s.judged("Okay.")
    assert s.engine.overlap is None and s.of(ResumeReply)
    s.speak(700)
    assert len(s.of(PauseReply)) == 2  # heard again


def test_speech_too_short_to_take_the_floor_resumes_the_reply_unless_it_says_stop():
    s, first = replying(after_ms=2000, scores=(0.9, 0.1))
    s.speak(320).pause(160)
    s.judged("That's it.")  # Whisper's guess at a short hum
    assert s.of(ResumeReply) and verdicts(s) == [OverlapVerdict.NOISE] and not s.of(BargeIn)
    t, first_t = replying(after_ms=2000, scores=(0.9, 0.1))
    t.speak(320).pause(160)
    t.judged("Stop.")
    assert t.of(BargeIn) and verdicts(t) == [OverlapVerdict.STOP]


def test_speech_that_comes_back_while_a_short_sound_is_judged_holds_the_reply_and_is_judged():
    """ "Stop." (too short to be a turn), then "What is the capital of Germany?" while it is judged.

    A CI run: the short sound was judged "no words" after the question had begun, the reply
    resumed, and the question became a turn that waited for the whole reply (40 s).
    """
    s, first = replying(after_ms=2500, scores=(0.9, 0.1, 0.9))
    s.speak(160).pause(600)  # an onset too short to be a turn: judged
    s.speak(800)  # the question begins while it is judged
    assert s.judged("") == []  # no resume: the speech over the reply goes on
    assert not s.of(ResumeReply)
    s.pause(300)
    assert len(s.of(Judge)) == 2
    s.judged("What is the capital of Germany?")
    assert [a.attempt for a in s.of(BargeIn)] == [first.attempt] and s.of(Start)[-1].turn_id == 2


def test_a_stop_judged_while_a_question_follows_it_stops_the_reply_and_the_question_is_answered():
    """ "Stop." heard alone (its onset), then the rest: the reply stops, the question is answered."""
    s, first = replying(after_ms=2500, scores=(0.9, 0.1, 0.9))
    s.speak(160).pause(600)
    s.speak(800)
    s.judged("Stop.")
    assert [a.attempt for a in s.of(BargeIn)] == [first.attempt]
    s.ends(first.attempt)
    s.pause(300)
    assert len(s.of(Judge)) == 2  # the question after it is judged, not ignored as part of "stop"
    s.judged("What is the capital of Germany?")
    assert s.of(Start)[-1].turn_id == 2
