"""Typed, timestamped pipeline events. Every event has ``turn_id`` and ``t_ns`` (monotonic_ns)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Event:
    """Base of every pipeline event."""

    turn_id: int
    t_ns: int


@dataclass(frozen=True)
class SpeechStarted(Event):
    """VAD saw speech begin; ``t_ns`` is when its first speech sample was captured."""


@dataclass(frozen=True)
class SpeechEnded(Event):
    """An utterance is complete.

    ``t_ns`` is when the endpoint was detected (trailing silence long enough, or the length
    cap reached); ``speech_end_t_ns`` is when the last speech sample was captured, so
    endpointing delay = ``t_ns - speech_end_t_ns``. ``audio`` is 16 kHz mono float32 including
    the pre-roll. ``cut`` is true when the maximum utterance length ended it (the speech
    continues into the next utterance, nothing is dropped).
    """

    speech_end_t_ns: int = 0
    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32), repr=False)
    cut: bool = False

    @property
    def duration_ms(self) -> float:
        """Length of ``audio`` in milliseconds."""
        return 1000.0 * self.audio.size / 16000
