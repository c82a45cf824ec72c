"""Full duplex in the UI: the mode in the status bar, speech over a reply in the breakdown and the pane.

Pilot on the app without a session (fixed events posted as ``PipelineEvent`` messages, as the
snapshot tests do): no models, no devices, no clock.
"""

from __future__ import annotations

import pytest
from rich.text import Text

from assistant.events import (
    AudioStarted,
    BargeIn,
    CancelReason,
    EchoMeasured,
    EchoState,
    Event,
    OverlapHeard,
    OverlapVerdict,
    PlaybackEnded,
    PromptSubmitted,
    ReplyPaused,
    ReplyResumed,
    SentenceReady,
    SpeechEnded,
    SpeechStarted,
    TokenGenerated,
    TranscriptReady,
    TurnCancelled,
)
from assistant.observe.latency import build_record
from assistant.tui.app import AssistantApp
from assistant.tui.breakdown import LatencyBreakdown
from assistant.tui.conversation import Conversation
from assistant.tui.messages import PipelineEvent
from assistant.tui.status import StatusBar
from tests.helpers.screen import screen_text
from tests.helpers.tui import MS, turn_events

WORDS = [" The", " capital", " of", " France", " is", " Paris", "."]


async def post(app, pilot, events: list[Event]) -> None:
    for event in events:
        app.post_message(PipelineEvent(event))
    await pilot.pause()


def reply_text(app, turn: int) -> Text:
    """The conversation's reply line of ``turn`` as rendered (its styles too)."""
    content = app.query_one(Conversation)._reply[turn].content
    assert isinstance(content, Text)
    return content


@pytest.mark.asyncio
async def test_the_status_bar_shows_half_then_full_duplex_and_why():
    app = AssistantApp(None, gpu=False)
    async with app.run_test(size=(200, 30)) as pilot:
        await pilot.pause()
        await post(app, pilot, [EchoState(0, 1 * MS, False, "half duplex until echo cancellation converges")])
        assert "barge-in auto  half duplex until echo cancellation converges" in screen_text(app)
        full = "full duplex: echo cancelled (ERLE 24 dB, echo delay 61 ms)"
        await post(app, pilot, [EchoState(0, 2 * MS, True, full, 24.0, 61.0)])
        screen = screen_text(app)
        assert f"barge-in auto  {full}" in screen and "half duplex" not in screen
        # the mode is no turn: the breakdown does not show a "turn 0" running
        assert "turn 0" not in app.query_one(LatencyBreakdown).plain()


@pytest.mark.asyncio
async def test_on_80_columns_the_status_bar_keeps_the_mode_when_its_reason_does_not_fit():
    app = AssistantApp(None, gpu=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        full = "full duplex: echo cancelled (ERLE 24 dB, echo delay 61 ms)"
        await post(app, pilot, [EchoState(0, 2 * MS, True, full, 24.0, 61.0)])
        first_line = screen_text(app).splitlines()[0].rstrip()
        assert first_line.endswith("barge-in auto  full duplex"), first_line  # not cut mid-reason


@pytest.mark.asyncio
async def test_on_160_columns_a_long_half_duplex_reason_keeps_its_cause():
    """The xrun's notice is 120 characters: the bar said only "half duplex" (a UI check in tmux)."""
    app = AssistantApp(None, gpu=False)
    async with app.run_test(size=(160, 30)) as pilot:
        await pilot.pause()
        why = (
            "half duplex: an audio stream ran late (xrun, 3 so far); the echo path may have moved, until"
            " echo cancellation converges again"
        )
        await post(app, pilot, [EchoState(0, 2 * MS, False, why)])
        first_line = screen_text(app).splitlines()[0].rstrip()
        assert first_line.endswith("barge-in auto  half duplex: an audio stream ran late"), first_line


@pytest.mark.asyncio
async def test_a_reply_resumed_after_a_backchannel_then_interrupted_shows_in_the_breakdown_and_the_pane():
    base = 10_000 * MS
    events = turn_events(1, base, WORDS) + [
        AudioStarted(1, base + 1000 * MS),
        ReplyPaused(1, base + 1530 * MS, base + 1500 * MS, 2),
        OverlapHeard(1, base + 2300 * MS, 2, "Uh-huh.", OverlapVerdict.BACKCHANNEL),
        ReplyResumed(1, base + 2300 * MS, 800.0),
        ReplyPaused(1, base + 3120 * MS, base + 3000 * MS, 2),
        OverlapHeard(1, base + 3900 * MS, 2, "What about Spain?", OverlapVerdict.BARGE_IN),
        BargeIn(1, base + 3120 * MS, base + 3000 * MS, 40.0),
        PlaybackEnded(1, base + 3950 * MS),
        TurnCancelled(1, base + 3950 * MS, CancelReason.INTERRUPTED, "The capital of"),
        EchoMeasured(1, base + 3960 * MS, 24.4, 61.0),
    ]
    app = AssistantApp(None, gpu=False)
    async with app.run_test(size=(200, 40)) as pilot:
        await pilot.pause()
        breakdown = app.query_one(LatencyBreakdown)
        await post(app, pilot, events[:-5])  # paused the second time, being judged
        assert "barge-in" not in breakdown.plain()
        assert app.query_one(StatusBar).state == "hearing"  # the reply holds while the speech is judged
        now = breakdown.plain()
        assert "now: turn 1" in now and "over the reply: backchannel 'Uh-huh.': resumed after 800 ms" in now
        await post(app, pilot, events[-5:])
        app.turn_done(build_record(1, events))
        await pilot.pause()
        shown = breakdown.plain()
        assert "last: turn 1" in shown and "now:" not in shown
        notes = "barge-in 120 ms; backchannel 'Uh-huh.': resumed after 800 ms; barge-in 'What about Spain?'"
        assert f"over the reply: {notes}; ERLE 24 dB, echo delay 61 ms" in shown, shown
        line = reply_text(app, 1)
        assert line.plain == "assistant: The capital of France is Paris. [interrupted]"
        struck = [line.plain[s.start : s.end] for s in line.spans if "strike" in str(s.style)]
        assert struck == [" France is Paris."]  # not played: not in the history either
        assert "interrupted: reply stopped 120 ms" in screen_text(app)


@pytest.mark.asyncio
async def test_speech_over_a_reply_that_is_no_words_or_stop_leaves_no_hearing_line():
    """A cough's "(hearing…)" line goes once judged no words; a stop request shows its words.

    Before, both stayed as "you: (hearing…)" for the rest of the session (seen in the UI).
    """
    base = 10_000 * MS
    events = turn_events(1, base, WORDS) + [
        AudioStarted(1, base + 1000 * MS),
        SpeechStarted(2, base + 1500 * MS),
        ReplyPaused(1, base + 1530 * MS, base + 1500 * MS, 2),
        OverlapHeard(1, base + 2300 * MS, 2, "", OverlapVerdict.NOISE),
        ReplyResumed(1, base + 2300 * MS, 800.0),
        SpeechStarted(3, base + 3000 * MS),
        ReplyPaused(1, base + 3020 * MS, base + 3000 * MS, 3),
    ]
    app = AssistantApp(None, gpu=False)
    async with app.run_test(size=(200, 40)) as pilot:
        await pilot.pause()
        await post(app, pilot, events)
        assert screen_text(app).count("you: (hearing…)") == 1  # the cough's is gone, the stop's shows
        await post(app, pilot, [OverlapHeard(1, base + 3700 * MS, 3, "Please stop.", OverlapVerdict.STOP)])
        shown = screen_text(app)
        assert "(hearing…)" not in shown and "you: Please stop. [stop: not answered]" in shown, shown
        # A lone "Stop." too short to be a turn leaves its number to the next question (a user
        # check: its line was overwritten by that question's words).
        await post(app, pilot, [TranscriptReady(3, base + 9000 * MS, "What about Rome?", 60.0)])
        shown = screen_text(app)
        assert "you: Please stop. [stop: not answered]" in shown and "you: What about Rome?" in shown, shown


@pytest.mark.asyncio
async def test_a_question_continued_over_its_reply_is_marked_and_answered_as_one_turn():
    base = 10_000 * MS
    first = turn_events(1, base, [" The", " largest"]) + [
        AudioStarted(1, base + 1000 * MS),
        SpeechStarted(2, base + 1300 * MS),
        ReplyPaused(1, base + 1330 * MS, base + 1300 * MS, 2),
        OverlapHeard(1, base + 2300 * MS, 2, "the largest ocean on Earth", OverlapVerdict.CONTINUATION),
        PlaybackEnded(1, base + 2310 * MS),
        TurnCancelled(1, base + 2310 * MS, CancelReason.CONTINUED, ""),
    ]
    whole = "What is the largest, the largest ocean on Earth?"
    app = AssistantApp(None, gpu=False)
    async with app.run_test(size=(200, 40)) as pilot:
        await pilot.pause()
        await post(app, pilot, first)
        app.turn_done(build_record(1, first))
        await post(app, pilot, [TranscriptReady(2, base + 4000 * MS, whole, 200.0, held_turns=(1,))])
        screen = screen_text(app)
        assert "continued: you went on, answered with the next turn" in screen
        assert f"you: {whole}" in screen and "you: What is the capital of France?" not in screen
        shown = app.query_one(LatencyBreakdown).plain()
        notes = "continuation 'the largest ocean on Earth'; continued: answered with the next turn"
        assert f"over the reply: {notes}" in shown, shown
        line = reply_text(app, 1)
        struck = [line.plain[s.start : s.end] for s in line.spans if "strike" in str(s.style)]
        assert struck == ["The largest"]  # nothing of it played


@pytest.mark.asyncio
async def test_speech_that_waited_for_the_reply_before_it_shows_the_wait_apart_from_asr():
    """Speech heard over a reply with barge-in off is the next turn, answered after the reply.

    A UI check put that wait into the turn's ASR bar (3.5 s of "ASR"); it is its own piece.
    """
    base = 10_000 * MS
    events = [
        SpeechEnded(2, base + 300 * MS, base),
        TranscriptReady(2, base + 2400 * MS, "And Spain?", 90.0, queued_until_t_ns=base + 2300 * MS),
        PromptSubmitted(2, base + 2404 * MS, 60, 40),
        TokenGenerated(2, base + 2500 * MS, 0, " Madrid"),
        SentenceReady(2, base + 2700 * MS, 0, "Madrid."),
        AudioStarted(2, base + 2800 * MS),
    ]
    record = build_record(2, events)
    assert record.metrics["queued_ms"] == 2000 and record.metrics["asr_ms"] == 100
    app = AssistantApp(None, gpu=False)
    async with app.run_test(size=(200, 30)) as pilot:
        await post(app, pilot, events)
        app.turn_done(record)
        await pilot.pause()
        shown = app.query_one(LatencyBreakdown).plain()
        assert "waited for the turn before 2000 ms" in shown and "ASR 100 ms" in shown, shown
        assert "voice-to-voice 2800 ms" in shown, shown
