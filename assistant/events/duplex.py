"""Events of full duplex: speech over a playing reply, what it was, and the echo canceller's state."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from assistant.events.base import Event


class OverlapVerdict(enum.StrEnum):
    """What speech over a playing reply turned out to be (:class:`OverlapHeard`)."""

    NOISE = "no words"  # a cough, a click, a breath: the reply resumes
    BACKCHANNEL = "backchannel"  # "mm-hmm", "yeah", "okay": the reply resumes
    STOP = "stop"  # "stop", "wait": the reply stops and nothing is answered
    CONTINUATION = "continuation"  # the rest of the question: the reply is dropped, one turn
    BARGE_IN = "barge-in"  # a new question: the reply stops (the part heard is kept)


@dataclass(frozen=True)
class BargeIn(Event):
    """User speech interrupted turn ``turn_id``: playback was stopped at ``t_ns``.

    ``onset_t_ns`` is when the interrupting speech began, so the reaction time is
    ``t_ns - onset_t_ns`` (plus the output device's own buffer, ``device_latency_ms``).
    """

    onset_t_ns: int = 0
    device_latency_ms: float = 0.0


@dataclass(frozen=True)
class ReplyPaused(Event):
    """Speech began over turn ``turn_id``'s reply: playback paused at ``t_ns``.

    ``onset_t_ns`` is when that speech began (so the reaction is ``t_ns - onset_t_ns`` plus
    the device's buffer); ``overlap_turn`` is the turn the speech becomes if it is words.
    What it was is decided from its transcript (:class:`OverlapHeard`).
    """

    onset_t_ns: int = 0
    overlap_turn: int = 0
    device_latency_ms: float = 0.0


@dataclass(frozen=True)
class OverlapHeard(Event):
    """Speech over turn ``turn_id``'s reply was transcribed as ``text``: ``verdict`` says what it was."""

    overlap_turn: int = 0
    text: str = ""
    verdict: OverlapVerdict = OverlapVerdict.NOISE


@dataclass(frozen=True)
class ReplyResumed(Event):
    """The reply paused for speech that had no words for it plays on where it stopped."""

    paused_ms: float = 0.0


@dataclass(frozen=True)
class EchoState(Event):
    """Whether the microphone is heard while replies play (not a turn event).

    ``full_duplex``: echo cancellation is active and converged, so VAD, Smart Turn and ASR hear
    the echo-cancelled microphone during replies; else the microphone is gated while a reply
    plays, as half-duplex assistants do. ``reason`` says why, in words for the status bar.
    """

    full_duplex: bool = False
    reason: str = ""
    erle_db: float | None = None
    delay_ms: float | None = None


@dataclass(frozen=True)
class EchoMeasured(Event):
    """The echo canceller over turn ``turn_id``'s reply: ERLE (dB) and the echo's delay (ms)."""

    erle_db: float | None = None
    delay_ms: float | None = None
