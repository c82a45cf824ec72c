"""The capture path's echo cancellation (``Duplex``): converging on the start-up probe, the mode it reports.

The real WebRTC canceller; the speaker and microphone are stand-ins that hold blocks the way
the PortAudio callbacks leave them (``Speaker.far_end``, ``Microphone.blocks``), because the
timing is scripted here. The same path on the virtual sound devices is tested in
``tests/integration/test_full_duplex.py``.
"""

from __future__ import annotations

import queue
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import assistant.turns.duplex as duplex_module
from assistant.config.sections import EchoOptions
from assistant.events import EchoState, Event
from assistant.stages.echo import EchoCanceller, load_processor
from assistant.turns.duplex import PROBE_TAIL_NS, Duplex, probe_signal
from assistant.turns.echo_mode import STEADY_MS
from bench.speech import speak

pytest.importorskip("livekit")

BLOCK = 512
BLOCK_NS = BLOCK * 1_000_000_000 // 16000


@dataclass
class ScriptedSpeaker:
    """Plays nothing: notes what was queued; ``far_end`` is filled by the test."""

    rate_hz: int = 16000
    output_latency_ms: float = 0.0
    far_end: deque | None = None
    played: list[np.ndarray] = field(default_factory=list)
    xruns: int = 0  # output underflows its callback reported

    def play(self, turn_id: int, audio: np.ndarray) -> None:
        self.played.append(audio)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Everything queued was written out (by the test, into ``far_end``)."""
        return True


@pytest.fixture
def clock(monkeypatch) -> dict[str, int]:
    """The duplex module's clock, scripted: ``clock["now"]``; sleeping moves it on at once."""
    now = {"now": 10**12}
    monkeypatch.setattr(duplex_module, "_now", lambda: now["now"])
    monkeypatch.setattr(duplex_module, "_sleep_ns", lambda ns: now.__setitem__("now", now["now"] + ns))
    return now


@dataclass
class ScriptedMicrophone:
    """Its queue holds what the test captured; started once."""

    blocks: queue.Queue = field(default_factory=queue.Queue)
    input_latency_ns: int = 0
    starts: int = 0
    xruns: int = 0  # input overflows its callback reported

    def start(self) -> None:
        self.starts += 1

    def read(self, timeout_s: float = 0.1) -> tuple[np.ndarray, int] | None:
        try:
            return self.blocks.get_nowait()
        except queue.Empty:
            return None


def room(far: np.ndarray, delay_ms: float | np.ndarray = 60, gain_db: float = -13) -> np.ndarray:
    """``far`` at the microphone ``delay_ms`` later (one delay, or one per sample: a moving path)."""
    src = np.arange(len(far)) - (np.broadcast_to(delay_ms, far.shape) * 16).astype(int)
    out = np.zeros_like(far)
    ok = src >= 0
    out[ok] = 10 ** (gain_db / 20) * far[src[ok]]
    return out


def capture(
    speaker: ScriptedSpeaker, mic: ScriptedMicrophone, far: np.ndarray, near: np.ndarray, t0: int
) -> None:
    """The speaker's callback and the microphone's, block by block on one clock."""
    assert speaker.far_end is not None
    for i in range(0, len(near) - BLOCK + 1, BLOCK):
        t = t0 + (i // BLOCK) * BLOCK_NS
        speaker.far_end.append((far[i : i + BLOCK], t))
        mic.blocks.put((near[i : i + BLOCK], t + BLOCK_NS))


def cleaned(duplex: Duplex, speaker: ScriptedSpeaker, far: np.ndarray, near: np.ndarray, t0: int) -> None:
    """The speaker's blocks and the microphone's through ``duplex.clean``, block by block on one clock."""
    for b in range(len(near) // BLOCK):
        clean_block(duplex, speaker, far, near, b, t0)


def clean_block(
    duplex: Duplex,
    speaker: ScriptedSpeaker,
    far: np.ndarray,
    near: np.ndarray,
    b: int,
    t0: int,
    late_ns: int = 0,
) -> None:
    """Block ``b`` of the microphone through ``duplex.clean`` (``late_ns``: it came that late).

    The speaker's callback writes each block ahead of when it plays (its output latency): here
    one block ahead of the microphone's.
    """
    assert speaker.far_end is not None
    if b == 0:
        speaker.far_end.append((far[:BLOCK], t0))
    if (ahead := far[(b + 1) * BLOCK : (b + 2) * BLOCK]).size == BLOCK:
        speaker.far_end.append((ahead, t0 + (b + 1) * BLOCK_NS))
    duplex.clean(near[b * BLOCK : (b + 1) * BLOCK], t0 + (b + 1) * BLOCK_NS + late_ns)


def canceller() -> EchoCanceller:
    options = EchoOptions()
    return EchoCanceller(options, load_processor(options))


def test_the_probe_converges_the_canceller_before_listening_and_says_full_duplex(monkeypatch) -> None:
    monkeypatch.setattr(duplex_module, "_sleep_ns", lambda _ns: None)  # its echo is captured already
    speaker, mic, events = ScriptedSpeaker(), ScriptedMicrophone(), []
    duplex = Duplex(canceller(), "on", speaker, mic, probe=True)  # type: ignore[arg-type]
    duplex.play_probe()
    assert mic.starts == 1 and len(speaker.played) == 1 and duplex.probe_until_ns
    probe = np.concatenate([speaker.played[0], np.zeros(8000, np.float32)])
    capture(speaker, mic, probe, room(probe), t0=duplex.probe_until_ns - 2_000_000_000)
    duplex.start(events.append)
    states = [e for e in events if isinstance(e, EchoState)]
    assert [s.full_duplex for s in states] == [False, True] and duplex.full_duplex
    assert "full duplex" in states[-1].reason and states[-1].erle_db is not None and states[-1].erle_db > 10
    assert mic.blocks.empty() and len(speaker.played) == 1  # caught up, the probe played once


def test_without_the_probe_it_stays_half_duplex_until_a_reply_converges_it() -> None:
    speaker, mic, events = ScriptedSpeaker(), ScriptedMicrophone(), []
    duplex = Duplex(canceller(), "on", speaker, mic, probe=False)  # type: ignore[arg-type]
    duplex.start(events.append)
    assert not speaker.played and not duplex.full_duplex
    reply = probe_signal(2.0, -20)
    cleaned(duplex, speaker, reply, room(reply), t0=10**12)
    assert duplex.full_duplex and isinstance(events[-1], EchoState) and events[-1].full_duplex
    erle, _delay = duplex.report()
    assert erle is not None and erle > 10 and duplex.report()[0] is None  # per reply: reset


def test_an_echo_that_appears_mid_session_is_reported_once_cancelled() -> None:
    """Headset first ("no echo heard"), then speakers: the status says the echo is cancelled.

    Before, the first report stood for the whole session: "no echo heard" while the canceller
    was removing a -13 dB echo at 56 dB ERLE (seen in the UI after unplugging a headset).
    """
    speaker, mic, events = ScriptedSpeaker(), ScriptedMicrophone(), []
    duplex = Duplex(canceller(), "on", speaker, mic, probe=False)  # type: ignore[arg-type]
    duplex.start(events.append)
    reply = probe_signal(6.0, -20)
    near = room(reply)
    near[: 3 * 16000] = 0  # a headset for 3 s, then the speakers
    headset = 3 * 16000 // BLOCK * BLOCK  # the blocks before the echo path

    def reasons() -> list[str]:
        return [e.reason for e in events if isinstance(e, EchoState) and e.full_duplex]

    cleaned(duplex, speaker, reply[:headset], near[:headset], t0=10**12)
    assert len(reasons()) == 1 and "no echo heard" in reasons()[0], reasons()
    cleaned(duplex, speaker, reply[headset:], near[headset:], t0=10**12 + headset // BLOCK * BLOCK_NS)
    assert len(reasons()) == 2 and "echo cancelled (ERLE" in reasons()[1], reasons()


def test_a_user_talking_over_replies_on_a_headset_does_not_change_the_report() -> None:
    speaker, mic, events = ScriptedSpeaker(), ScriptedMicrophone(), []
    duplex = Duplex(canceller(), "on", speaker, mic, probe=False)  # type: ignore[arg-type]
    duplex.start(events.append)
    reply = probe_signal(6.0, -20)
    user = np.zeros_like(reply)
    voice = np.random.default_rng(3).standard_normal(len(user) - 3 * 16000)  # not the reply
    user[3 * 16000 :] = 0.1 * np.convolve(voice, np.ones(4) / 4, mode="same")
    cleaned(duplex, speaker, reply, user, t0=10**12)
    reasons = [e.reason for e in events if isinstance(e, EchoState) and e.full_duplex]
    assert len(reasons) == 1 and "no echo heard" in reasons[0], reasons


def test_without_a_canceller_it_is_half_duplex_with_the_reason_and_passes_the_microphone_on() -> None:
    events: list[Event] = []
    duplex = Duplex(None, "echo cancellation needs the livekit package", ScriptedSpeaker(), None)  # type: ignore[arg-type]
    duplex.start(events.append)
    assert events == [
        EchoState(0, events[0].t_ns, False, "half duplex: echo cancellation needs the livekit package")
    ]
    block = np.full(BLOCK, 0.1, np.float32)
    out, t = duplex.clean(block, 123)
    assert out is block and t == 123 and not duplex.probing(0)


def test_while_the_probe_may_be_heard_the_microphone_is_not_the_users() -> None:
    speaker, mic = ScriptedSpeaker(output_latency_ms=50), ScriptedMicrophone()
    duplex = Duplex(canceller(), "on", speaker, mic)  # type: ignore[arg-type]
    duplex.play_probe()
    until = duplex.probe_until_ns
    assert duplex.probing(until - 1) and not duplex.probing(until)


def test_start_returns_once_the_probe_can_no_longer_be_heard(clock: dict[str, int]) -> None:
    """Listening is announced after ``start()``: speech then must not fall under the probe's gate.

    The models can load faster than the probe plays (a warm cache; the UI's tests): the question
    spoken at "listening" lost its first words ("What is the capital of France?" came out as
    "Love friends.").
    """
    speaker, mic = ScriptedSpeaker(output_latency_ms=50), ScriptedMicrophone()
    duplex = Duplex(canceller(), "on", speaker, mic)  # type: ignore[arg-type]
    duplex.play_probe()
    duplex.start(lambda _event: None)
    assert not duplex.probing(clock["now"])


def test_start_waits_for_the_probe_by_when_it_left_the_speaker_not_by_the_reported_latency(
    clock: dict[str, int],
) -> None:
    """A sound server can play later than the stream's reported output latency says.

    Then the probe still played after "listening on", and the canceller suppressed the user's
    first words as its echo ("What is the capital of Italy?" heard as "A capital of Italy.",
    the metrics test in CI). The probe's last sound block in the far end, with the time it left
    the speaker, sets when listening may start.
    """
    speaker, mic = ScriptedSpeaker(output_latency_ms=20), ScriptedMicrophone()
    duplex = Duplex(canceller(), "on", speaker, mic)  # type: ignore[arg-type]
    duplex.play_probe()
    assert speaker.far_end is not None
    late_ns = clock["now"] + 2_000_000_000  # its last sound leaves the speaker 2 s from now
    speaker.far_end.append((np.full(BLOCK, 0.01, np.float32), late_ns))
    speaker.far_end.append((np.zeros(BLOCK, np.float32), late_ns + BLOCK_NS))  # silence after it
    duplex.start(lambda _event: None)
    assert clock["now"] >= late_ns + BLOCK_NS + PROBE_TAIL_NS
    assert not duplex.probing(clock["now"])


def test_start_plays_the_probe_itself_when_it_was_not_played_and_waits_for_it(clock: dict[str, int]) -> None:
    speaker, mic = ScriptedSpeaker(), ScriptedMicrophone()
    duplex = Duplex(canceller(), "on", speaker, mic)  # type: ignore[arg-type]
    duplex.start(lambda _event: None)
    assert len(speaker.played) == 1 and mic.starts == 1 and not duplex.probing(clock["now"])


def modes(events: list[Event]) -> list[tuple[bool, str]]:
    return [(e.full_duplex, e.reason) for e in events if isinstance(e, EchoState)]


def test_an_echo_path_that_moves_goes_half_duplex_until_the_canceller_has_it_again() -> None:
    """60 ms, then slewed to 100 ms over 2 s (as the echo rig's loopback does), then 100 ms.

    AEC3 loses such an echo for seconds (8-16 dB ERLE); full duplex meanwhile, replies paused
    for their own echo in a UI check on the rig. Half duplex until it has converged again.
    """
    speaker, mic, events = ScriptedSpeaker(), ScriptedMicrophone(), []
    duplex = Duplex(canceller(), "on", speaker, mic, probe=False)  # type: ignore[arg-type]
    duplex.start(events.append)
    reply = probe_signal(12.0, -20)
    t = np.arange(len(reply)) / 16000
    near = room(reply, np.clip(60 + (t - 4) * 20, 60, 100))
    moved: list[float] = []  # when each mode change came (s into the reply)
    for b in range(len(reply) // BLOCK):
        before = len(events)
        clean_block(duplex, speaker, reply, near, b, t0=10**12)
        moved += [b * BLOCK / 16000] * (len(events) - before)
    got = modes(events)
    assert [m[0] for m in got] == [False, True, False, True], got
    assert "echo path moved" in got[2][1] and "-> " in got[2][1], got
    assert moved[0] < 4 < moved[1] < 6 < moved[2], moved  # lost during the move, back after it
    assert moved[2] >= 6 + STEADY_MS / 1000, moved  # once the new delay held two seconds
    assert duplex.full_duplex


@pytest.mark.parametrize("stream", ["speaker", "microphone", "stalled"])
def test_a_stream_that_ran_late_goes_half_duplex_at_once_until_the_canceller_has_the_echo_again(
    stream: str,
) -> None:
    """An xrun may move the echo path (97 -> 6 ms after an underrun on a loaded machine).

    Half duplex from the block after the stream reported it, before AEC3 could lose the echo
    and a reply pause for it; full duplex again once converged on half a second of reply (not
    the two seconds a move needs: the first seconds of a reply are when the user goes on with
    the question). ``stalled``: no xrun reported, but the microphone's blocks came 270 ms late
    (the process was held 300 ms: the backlog comes in a burst).
    """
    speaker, mic, events = ScriptedSpeaker(), ScriptedMicrophone(), []
    duplex = Duplex(canceller(), "on", speaker, mic, probe=False)  # type: ignore[arg-type]
    duplex.start(events.append)
    reply = probe_signal(6.0, -20)
    xrun_block = 3 * 16000 // BLOCK
    near = room(reply)
    full: list[bool] = []  # after each block
    for b in range(len(reply) // BLOCK):
        if b == xrun_block and stream != "stalled":
            (speaker if stream == "speaker" else mic).xruns += 1
        late = 270_000_000 if stream == "stalled" and b == xrun_block else 0
        clean_block(duplex, speaker, reply, near, b, t0=10**12, late_ns=late)
        full.append(duplex.full_duplex)
    assert full[xrun_block - 1] and not full[xrun_block]  # at once
    back_s = (full.index(True, xrun_block) - xrun_block) * BLOCK / 16000
    assert 0.5 <= back_s < STEADY_MS / 1000, back_s  # converged on half a second of reply since
    assert [m[0] for m in modes(events)] == [False, True, False, True], modes(events)
    assert ("late" if stream == "stalled" else "xrun") in modes(events)[2][1]


def test_a_stall_that_moved_the_echo_path_waits_until_the_new_delay_holds() -> None:
    """The process held 300 ms and the echo came back 42 ms earlier (60 -> 18 ms).

    A fresh-clone CI run on the echo rig: full duplex again on half a second converged at
    18 ms, then the path went on moving and the reply paused four times for its own echo.
    When the delay reads elsewhere than before the stall, it waits as after a move.
    """
    speaker, mic, events = ScriptedSpeaker(), ScriptedMicrophone(), []
    duplex = Duplex(canceller(), "on", speaker, mic, probe=False)  # type: ignore[arg-type]
    duplex.start(events.append)
    reply = probe_signal(9.0, -20)
    stall_block = 3 * 16000 // BLOCK
    near = np.concatenate([room(reply)[: stall_block * BLOCK], room(reply, 18)[stall_block * BLOCK :]])
    full: list[bool] = []
    for b in range(len(reply) // BLOCK):
        late = 270_000_000 if b == stall_block else 0
        clean_block(duplex, speaker, reply, near, b, t0=10**12, late_ns=late)
        full.append(duplex.full_duplex)
    assert full[stall_block - 1] and not full[stall_block]  # at once
    assert True in full[stall_block:], modes(events)
    back_s = (full.index(True, stall_block) - stall_block) * BLOCK / 16000
    assert back_s >= STEADY_MS / 1000, back_s
    assert [m[0] for m in modes(events)] == [False, True, False, True], modes(events)


REPLY = (
    "The largest ocean on earth is the Pacific Ocean, which covers about a third of the planet"
    " and holds more than half of its free water."
)


@pytest.fixture(scope="module")
def reply_speech(tmp_path_factory) -> np.ndarray:
    """A 21 s reply in espeak-ng's voice (its loudness rises and falls as speech does)."""
    speech = speak(REPLY, tmp_path_factory.mktemp("reply"))
    return np.tile(0.3 * speech / np.max(np.abs(speech)), 3).astype(np.float32)


def mode_changes(reply: np.ndarray, near: np.ndarray) -> list[tuple[float, bool, str]]:
    """(seconds into the reply, full duplex, reason) of each change after the start, block by block."""
    speaker, mic, events = ScriptedSpeaker(), ScriptedMicrophone(), []
    duplex = Duplex(canceller(), "on", speaker, mic, probe=False)  # type: ignore[arg-type]
    duplex.start(events.append)
    when: list[float] = []
    for b in range(len(reply) // BLOCK):
        before = len(events)
        clean_block(duplex, speaker, reply, near, b, t0=10**12)
        when += [b * BLOCK / 16000] * (len(events) - before)
    return [(t, full, reason) for t, (full, reason) in zip(when, modes(events)[1:], strict=True)]


def test_a_canceller_that_lost_an_echo_whose_delay_stayed_goes_half_duplex_until_it_has_it_again(
    reply_speech: np.ndarray,
) -> None:
    """The echo's delay wobbles by 3 ms (a cycle a second) from 6 s to 12 s into the reply.

    Under load the rig's echo delay read -6 ms for eight replies while AEC3 removed 4-8 dB of
    the echo (a fresh-clone CI run): the app stayed full duplex, its replies paused for their
    own echo and the echo was heard as a turn. A wobble within a few milliseconds is what the
    delay estimate cannot see and AEC3 cannot follow. Before, full duplex throughout it.
    """
    t = np.arange(len(reply_speech)) / 16000
    wobble = np.where((t > 6) & (t < 12), 60 + 3 * np.sin(2 * np.pi * (t - 6)), 60)
    changes = mode_changes(reply_speech, room(reply_speech, wobble))
    assert changes[0][1], changes  # converged on the reply's start
    lost = [(at, reason) for at, full, reason in changes if not full]
    assert lost and 6 < lost[0][0] < 9, changes
    assert "lost the echo" in lost[0][1], changes
    assert changes[-1][1] and changes[-1][0] > 12, changes  # back once it has the echo again


@pytest.mark.parametrize("louder_db", [10, 0])
def test_a_voice_over_the_reply_is_not_taken_for_a_lost_echo(
    reply_speech: np.ndarray, louder_db: int, tmp_path: Path
) -> None:
    """Another voice talks over the reply from 6 s on, ``louder_db`` above its echo: full duplex throughout.

    The ERLE falls as when the canceller has lost the echo (the voice is in its output), but
    the microphone's loudness no longer follows the reply's.
    """
    voice = speak(
        "Actually wait, I wanted to ask you about the history of Rome instead.", tmp_path, voice="en-gb"
    )
    near = room(reply_speech, 60)
    start = 6 * 16000
    near[start : start + len(voice)] += 10 ** ((louder_db - 13) / 20) * 0.3 * voice / np.max(np.abs(voice))
    changes = mode_changes(reply_speech, near)
    assert [full for _, full, _ in changes] == [True], changes


@pytest.mark.parametrize("kind", ["user talking over it", "clock drift"])
def test_an_echo_path_that_stays_keeps_full_duplex(kind: str) -> None:
    """The user's voice over a reply does not move the echo's delay; drift is followed."""
    speaker, mic, events = ScriptedSpeaker(), ScriptedMicrophone(), []
    duplex = Duplex(canceller(), "on", speaker, mic, probe=False)  # type: ignore[arg-type]
    duplex.start(events.append)
    reply = probe_signal(12.0, -20)
    t = np.arange(len(reply)) / 16000
    if kind == "clock drift":
        near = room(reply, 60 + t * 0.5)  # 0.5 ms a second: 6 ms over the reply
    else:
        near = room(reply)
        voice = np.random.default_rng(5).standard_normal(6 * 16000)  # not the reply, 2-3x louder
        near[3 * 16000 : 9 * 16000] += 0.1 * np.convolve(voice, np.ones(4) / 4, mode="same")
    cleaned(duplex, speaker, reply, near, t0=10**12)
    assert [m[0] for m in modes(events)] == [False, True], modes(events)


def test_a_word_over_the_reply_is_heard_whole_though_the_speakers_clock_jitters() -> None:
    """``Duplex.unsuppressed``: the echo subtracted, the word kept, with the far end's times off by ms.

    The speaker callback stamps each block with its own clock, off by milliseconds from block to
    block; the canceller's far-end timeline follows those times (AEC3 adapts), but the linear
    fit needs the far end whole to the sample: with the canceller's far frames it removed ~5 dB.
    """
    rng = np.random.default_rng(5)
    duplex = Duplex(canceller(), "on", ScriptedSpeaker(far_end=deque()), ScriptedMicrophone(), probe=False)  # type: ignore[arg-type]
    speaker = duplex.speaker
    assert isinstance(speaker, ScriptedSpeaker) and speaker.far_end is not None
    reply = probe_signal(6.0, -20)
    word = np.zeros_like(reply)
    word[-16000:] = 0.03 * rng.standard_normal(16000).astype(np.float32)
    near, t0 = room(reply) + word, 10**12
    for k, i in enumerate(range(0, len(near) - BLOCK + 1, BLOCK)):
        t = t0 + k * BLOCK_NS
        speaker.far_end.append((reply[i : i + BLOCK], t + (k * 5 % 7 - 3) * 1_000_000))  # -3..3 ms off
        duplex.clean(near[i : i + BLOCK], t + BLOCK_NS)
    done = (len(near) // BLOCK) * BLOCK // 160 * 160  # whole 10 ms frames went through
    span = duplex.unsuppressed(t0 + done * 62_500, 16000)  # the last second, the word
    heard = span.cleaned() if span is not None else None
    assert heard is not None
    said, echo = word[done - 16000 : done], room(reply)[done - 16000 : done]
    assert 10 * np.log10(np.sum(echo**2) / np.sum((heard - said) ** 2)) > 20
    assert np.corrcoef(heard, said)[0, 1] > 0.99


def test_speech_over_the_first_replies_of_a_session_comes_with_the_microphone_as_it_heard_it() -> None:
    """``Duplex.unsuppressed`` marks a span ``settling`` until the canceller has heard enough far end.

    At a session's first reply AEC3 has converged on the probe's hiss alone, and its suppressor
    takes the first syllables of a question's rest said over the reply ("how many" read "Any"),
    which the microphone as it came in keeps (bench.continuation_closed_loop).
    """
    speaker, mic = ScriptedSpeaker(far_end=deque()), ScriptedMicrophone()
    duplex = Duplex(canceller(), "on", speaker, mic, probe=False)  # type: ignore[arg-type]
    reply = probe_signal(duplex_module.SETTLED_FAR_S + 2, -20)
    word = np.zeros_like(reply)
    word[3 * 16000 : 4 * 16000] = 0.03 * np.random.default_rng(3).standard_normal(16000)
    near, t0, blocks = room(reply) + word, 10**12, range(0, len(reply) - BLOCK + 1, BLOCK)
    assert speaker.far_end is not None
    speaker.far_end.extend((reply[i : i + BLOCK], t0 + k * BLOCK_NS) for k, i in enumerate(blocks))
    spans = []
    for k, i in enumerate(blocks):
        duplex.clean(near[i : i + BLOCK], t0 + (k + 1) * BLOCK_NS)
        if (k + 1) * BLOCK in (4 * 16000, len(blocks) * BLOCK):
            done = (k + 1) * BLOCK // 160 * 160  # whole 10 ms frames went through
            spans.append((done, duplex.unsuppressed(t0 + done * 62_500, 16000)))
    (early_at, early), (_, settled) = spans
    assert early is not None and early.settling and settled is not None and not settled.settling
    heard = early.microphone()
    assert heard.size == 16000
    assert np.allclose(heard, near[early_at - 16000 : early_at], atol=2 / 32768)  # as int16 went in
