"""Full duplex on the echo rig: the app keeps listening while it speaks, and its own echo is not the user.

The real app (``assistant run --no-tui``), real models and the virtual PulseAudio with the
speaker fed back into the microphone (60 ms, -13 dB, two reflections: ``bench.echo_rig``). The
user is espeak-ng played into the microphone on top of the echo. One app run serves the
spoken scenarios in order (``spoken``); each test checks one behaviour of it.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.duplex_rig import LiveApp, burst, next_turn, reply_playing, settle, utterance
from bench.echo_rig import echo_path

pytest.importorskip("livekit")
# The scenarios with echo cancellation on run alone (``quiet``, tests/helpers/quiet.py); the
# half-duplex ones do not depend on it and run beside the compute lanes.
quiet = pytest.mark.quiet

LONG_QUESTION = "Tell me about the history of Paris."
# The spoken scenarios' replies are spoken at twice espeak-ng's default rate: no rule there
# depends on it (the overlaps begin 0.2-2.6 s into replies that last 4 s or more), and the
# module's real time is what the quiet tests cost the suite (they run alone). The echo-only
# replies keep the default rate: with 350 wpm a fresh-clone run heard three onsets in the
# first replies (paused, "no words", resumed), which no run at the default rate had shown.
FAST = ("--tts-rate", "350")
REPLIES_ECHO_ONLY = 20
AFTER_WINDOW_S = 2.6  # past the 1.8 s continuation window (from the reply's first audio)
UPSET = re.compile("ran late|blocks came|echo path moved|lost the echo")  # half-duplex notices: path upset


def typed_replies(
    pulse: dict[str, str], folder: Path, count: int, *args: str, until: str = "TurnDone"
) -> tuple[LiveApp, str]:
    """``count`` short typed questions answered aloud with the echo path on; nobody speaks.

    Returns once ``count`` turns are done, or as soon as an ``until`` event other than
    ``TurnDone`` appears.
    """
    app = LiveApp(pulse, folder, "--max-new-tokens", "8", *args)
    try:
        app.wait_line("listening on")
        for i in range(count):
            app.ask(f"Name a colour, number {i + 1}.")
        deadline = time.monotonic() + 40 + 6 * count

        def finished() -> bool:
            kinds = [e["event"] for e in app.events()]
            return kinds.count("TurnDone") >= count or (until != "TurnDone" and until in kinds)

        while not finished() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stderr = app.stop()
    return app, stderr


@pytest.fixture(scope="module")
def echo_only(pulse, tmp_path_factory) -> tuple[LiveApp, str]:
    with echo_path(pulse, delay_ms=60, gain_db=-13, reflections=2):
        return typed_replies(pulse, tmp_path_factory.mktemp("echo-only"), REPLIES_ECHO_ONLY)


@quiet
def test_echo_alone_never_interrupts_and_is_never_transcribed(echo_only) -> None:
    """20 replies play with their echo in the microphone: no barge-in, no word of theirs heard.

    Nor a pause, unless an audio stream ran late (an xrun, a stall) or the echo path moved just
    before it, which a loaded machine can do to the test: then the reply resumes. The same for
    a reply's ERLE under 10 dB (a project CI run: 8.2 dB for one of 20, the others 47-59), or
    one measured while the app was still half duplex after such an upset (the microphone gated:
    under load the canceller took 10 replies to converge on a moved path, and 7 dB came then).
    """
    app, stderr = echo_only
    assert any("full duplex" in line for line in app.lines), app.lines  # it was listening
    events = app.events()
    done = [e for e in events if e["event"] == "TurnDone"]
    assert len(done) == REPLIES_ECHO_ONLY, "".join(app.lines) + stderr
    kinds = [e["event"] for e in events]
    assert not set(kinds) & {"SpeechStarted", "BargeIn"}, "".join(app.lines) + stderr
    upsets = [e["t_ns"] for e in events if e["event"] == "EchoState" and UPSET.search(e["reason"])]
    for paused in (e for e in events if e["event"] == "ReplyPaused"):
        assert any(0 <= paused["t_ns"] - t < 10**10 for t in upsets), "".join(app.lines) + stderr
    assert kinds.count("ReplyPaused") == kinds.count("ReplyResumed"), "".join(app.lines)
    assert all(e["verdict"] == "no words" for e in events if e["event"] == "OverlapHeard")
    spoken = [
        e for e in events if e["event"] == "TranscriptReady" and not e["text"].startswith("Name a colour")
    ]
    assert spoken == []  # no transcript but the typed questions
    assert all(r["cancelled"] == "" for r in app.records().values())
    measured = [e for e in events if e["event"] == "EchoMeasured" and e["erle_db"] is not None]
    assert measured, "".join(app.lines)
    for low in (e for e in measured if e["erle_db"] <= 10):  # the canceller lost a moved path for a while
        # ... and the app knew: it went half duplex just before, or it still was (the echo unheard)
        modes = [e for e in events if e["event"] == "EchoState" and e["t_ns"] <= low["t_ns"]]
        half = bool(modes) and not modes[-1]["full_duplex"]
        assert half or any(0 <= low["t_ns"] - t < 10**10 for t in upsets), "".join(app.lines) + stderr


STALLS = 4


@quiet
def test_an_app_stalled_mid_reply_goes_half_duplex_and_answers_every_question(pulse, tmp_path) -> None:
    """The app held 300 ms (SIGSTOP) 0.8 s into each of 4 replies, as on a machine that stalls.

    The streams run late (an underrun, the microphone's backlog in a burst) and the echo path
    moves for seconds after. The app goes half duplex at once and waits until the delay holds.
    Before, replies paused for their own echo (6 of 8) and one that went half duplex before
    its pause was judged stayed paused, every later question behind it (7 of 12 answered).
    """
    with echo_path(pulse, delay_ms=60, gain_db=-13, reflections=2):
        app = LiveApp(pulse, tmp_path, "--max-new-tokens", "12")
        try:
            app.wait_line("listening on")
            for i in range(STALLS):
                mark = len(app.events())
                question = f"Tell me one fact about the number {i + 1}."
                app.ask(question)
                # Its turn by its text: an echo heard as the user's onset takes a number too.
                turn = app.wait_event("TranscriptReady", after=mark, text=question, timeout_s=60)["turn_id"]
                app.wait_event("AudioStarted", turn=turn, after=mark, timeout_s=60)
                time.sleep(0.8)
                os.kill(app.proc.pid, signal.SIGSTOP)
                time.sleep(0.3)
                os.kill(app.proc.pid, signal.SIGCONT)
                app.wait_event("TurnDone", turn=turn, after=mark, timeout_s=60)
        finally:
            stderr = app.stop()
    events = app.events()
    assert [e["event"] for e in events].count("TurnDone") == STALLS, "".join(app.lines) + stderr  # no other
    reasons = [e["reason"] for e in events if e["event"] == "EchoState"]
    assert any("late" in r for r in reasons), reasons  # the stall was seen
    kinds = [e["event"] for e in events]
    assert kinds.count("ReplyPaused") == kinds.count("ReplyResumed"), "".join(app.lines)  # none held
    assert "BargeIn" not in kinds and all(r["cancelled"] == "" for r in app.records().values())


@pytest.mark.parametrize("barge_in", ["auto", "on"])
def test_without_echo_cancellation_the_microphone_is_gated_or_hears_the_echo(
    pulse, tmp_path, barge_in
) -> None:
    """Half duplex: the microphone is gated while replies play (typed ones too), as before.

    Forcing barge-in on without the canceller shows why: the reply pauses for its own echo
    (the check of the echo-only test above can fail).
    """
    with echo_path(pulse, delay_ms=60, gain_db=-13, reflections=2):
        until = "ReplyPaused" if barge_in == "on" else "TurnDone"  # it paused: shown, no need to wait on
        app, stderr = typed_replies(pulse, tmp_path, 3, "--echo", "off", "--barge-in", barge_in, until=until)
    assert any("half duplex: echo cancellation off" in line for line in app.lines), app.lines
    kinds = {e["event"] for e in app.events()}
    if barge_in == "auto":
        assert not kinds & {"SpeechStarted", "ReplyPaused"}, "".join(app.lines) + stderr
    else:
        assert "ReplyPaused" in kinds, "".join(app.lines) + stderr


@dataclass
class Spoken:
    """What happened in each spoken scenario: its question's turn and its events."""

    app: LiveApp
    turns: dict[str, int] = field(default_factory=dict)
    overlap_turns: dict[str, int] = field(default_factory=dict)
    stderr: str = ""
    replayed: list[str] = field(default_factory=list)  # scenarios played again, and why

    def of(self, name: str, scenario: str) -> list[dict]:
        turn = self.turns[scenario]
        return [e for e in self.app.events() if e["event"] == name and e["turn_id"] == turn]


def play_scenarios(pulse: dict[str, str], folder: Path, scenarios: list[tuple[str, Path, float]]) -> Spoken:
    """Each scenario in turn in one app on the echo rig: the long question (the first half for
    ``continuation``), then its overlap ``after_s`` into the reply.

    A scenario during which the app went half duplex for a stream that ran late or an echo path
    that moved is played once more: the microphone is then gated for 2-3 s by design, and words
    said over the reply meanwhile are not heard (docs/voice.md, "Always listening"). A fresh-clone
    run of 2026-12-07 lost "how many days are in a" so: the delay read 9 -> -12 ms 0.26 s into
    the continuation's reply, from its first frames alone (read from enough far end since,
    5d934c3); a stream that runs late on a loaded machine does the same. Twice in one scenario
    fails the test as any lost word does.
    """
    long_q = utterance(folder, LONG_QUESTION, "long")
    first_half = utterance(folder, "I would like to know", "first")
    with echo_path(pulse, delay_ms=60, gain_db=-13, reflections=2):
        app = LiveApp(pulse, folder, "--max-new-tokens", "40", *FAST)
        run = Spoken(app)
        try:
            app.wait_line("listening on")
            for scenario, overlap, after_s in scenarios:
                for attempt in (1, 2):
                    mark = len(app.events())
                    app.say(first_half if scenario == "continuation" else long_q)
                    turn = run.turns[scenario] = next_turn(app, mark)
                    reply_playing(app, turn, mark)
                    time.sleep(after_s)
                    app.say(overlap)
                    settle(app)
                    events = app.events()[mark:]
                    answered = [e["turn_id"] for e in events if e["event"] == "TranscriptReady"]
                    run.overlap_turns[scenario] = answered[-1] if answered[-1] != turn else 0
                    upsets = [
                        e["reason"] for e in events if e["event"] == "EchoState" and UPSET.search(e["reason"])
                    ]
                    if not upsets:
                        break
                    run.replayed.append(f"{scenario} (attempt {attempt}): {upsets[0]}")
                    print(f"{scenario}, attempt {attempt}: the app went half duplex: {upsets[0]}")
        finally:
            run.stderr = app.stop()
    return run


@pytest.fixture(scope="module")
def spoken(pulse, tmp_path_factory) -> Spoken:
    folder = tmp_path_factory.mktemp("spoken")
    return play_scenarios(
        pulse,
        folder,
        [
            ("backchannel", utterance(folder, "Uh-huh.", "uhhuh"), 1.0),
            ("cough", burst(folder), 1.0),
            ("barge-in", utterance(folder, "What is the capital of Germany?", "germany"), AFTER_WINDOW_S),
            ("continuation", utterance(folder, "how many days are in a week?", "rest"), 0.2),
        ],
    )


@pytest.fixture(scope="module")
def stop_request(pulse, tmp_path_factory) -> Spoken:
    """ "Please stop." over the reply, in an app of its own: a fresh conversation.

    Late in one long conversation SmolLM2's replies grew too short to speak over (the reply
    ended before the request), and a request heard wrongly ("being up.") was answered as a
    question, which shortened the replies after it. Said firmly (4 dB up, as people do to stop
    a talker) so AEC3's double-talk suppression takes less of it. A lone "Stop." stops about
    three replies in four on the rig (``bench.stop_requests``: 15 of 19, docs/benchmarks.md):
    too few for a test that must not flake, so the lone word is checked on recorded audio
    through the same canceller, VAD and judge (tests/integration/test_stop_over_the_echo.py).
    """
    folder = tmp_path_factory.mktemp("stop")
    stop = utterance(folder, "Please stop.", "stop", gain_db=4)
    return play_scenarios(pulse, folder, [("stop", stop, AFTER_WINDOW_S)])


@quiet
def test_a_backchannel_over_the_reply_lets_it_play_on(spoken: Spoken) -> None:
    assert spoken.of("ReplyPaused", "backchannel"), "".join(spoken.app.lines)
    heard = spoken.of("OverlapHeard", "backchannel")[0]
    assert heard["verdict"] in ("backchannel", "no words"), (heard["text"], heard["verdict"])
    assert spoken.of("ReplyResumed", "backchannel") and not spoken.of("BargeIn", "backchannel")
    record = spoken.app.records()[spoken.turns["backchannel"]]
    assert record["cancelled"] == "", record  # the reply played to its end
    assert heard["overlap_turn"] not in spoken.app.records()  # "uh-huh" was not answered


@quiet
def test_a_cough_over_the_reply_lets_it_play_on(spoken: Spoken) -> None:
    assert not spoken.of("BargeIn", "cough")
    if spoken.of("ReplyPaused", "cough"):  # heard as the start of speech: paused, then resumed
        assert spoken.of("ReplyResumed", "cough")
    assert spoken.app.records()[spoken.turns["cough"]]["cancelled"] == ""


@quiet
def test_stop_stops_the_reply_and_is_not_answered(stop_request: Spoken) -> None:
    heard = stop_request.of("OverlapHeard", "stop")[-1]
    assert heard["verdict"] == "stop", (heard["text"], heard["verdict"], stop_request.stderr[-1500:])
    assert stop_request.of("BargeIn", "stop")
    assert stop_request.app.records()[stop_request.turns["stop"]]["cancelled"] == "interrupted"
    assert heard["overlap_turn"] not in stop_request.app.records()


@quiet
def test_speech_over_the_reply_pauses_it_at_its_onset_and_is_answered(spoken: Spoken) -> None:
    """The reply pauses at the speech's onset, before its words are known, then stops.

    How soon (the issue's goal: 200 ms) is the benchmark's to measure, on a quiet machine:
    ``python -m bench.duplex`` (docs/benchmarks.md, median 116 ms, P95 153 ms); a test on a
    shared machine asserts no wall-clock limit (one CI run saw 226 ms).
    """
    (barge,) = spoken.of("BargeIn", "barge-in")
    (paused,) = [e for e in spoken.of("ReplyPaused", "barge-in") if e["onset_t_ns"] == barge["onset_t_ns"]]
    overlap = spoken.overlap_turns["barge-in"]
    heard = [e for e in spoken.of("OverlapHeard", "barge-in") if e["overlap_turn"] == overlap][-1]
    assert paused["onset_t_ns"] < paused["t_ns"] < heard["t_ns"]  # paused before its words were known
    assert abs(barge["t_ns"] - paused["t_ns"]) < 1_000_000  # the reply stopped where it paused
    records = spoken.app.records()
    assert records[spoken.turns["barge-in"]]["cancelled"] == "interrupted"
    answer = records[spoken.overlap_turns["barge-in"]]
    assert "germany" in answer["transcript"].lower() and answer["cancelled"] == "", answer


@quiet
def test_a_question_continued_after_its_reply_began_is_answered_as_one_turn(spoken: Spoken) -> None:
    """ "I would like to know" ... the reply starts ... "how many days are in a week?" """
    records = spoken.app.records()
    first, rest = records[spoken.turns["continuation"]], records[spoken.overlap_turns["continuation"]]
    assert first["cancelled"] == "continued", f"{first}\n{''.join(spoken.app.lines)}\n{spoken.replayed}"
    transcript = rest["transcript"].lower()
    assert "know" in transcript and "week" in transcript, rest  # both halves, one user turn
    assert rest["cancelled"] == "", rest
    assert spoken.of("OverlapHeard", "continuation")[-1]["verdict"] == "continuation"
