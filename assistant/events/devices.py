"""Events of the sound devices: the microphone's level, a device lost and restored (not turn events)."""

from __future__ import annotations

from dataclasses import dataclass

from assistant.events.base import Event


@dataclass(frozen=True)
class MicLevel(Event):
    """Loudness of the latest microphone block (``level_db``: RMS in dBFS, -120 is silence).

    Sent to the UI about ten times a second; not a turn event (``turn_id`` is the current turn).
    """

    level_db: float = -120.0


@dataclass(frozen=True)
class AudioDeviceLost(Event):
    """An open audio device stopped working; ``kind`` is ``input`` or ``output``.

    Not a turn event (``turn_id`` is the current turn). ``reason`` says how it was noticed:
    the stream stopped by itself (the sound server or the card went away), or it delivered
    no audio for ``AudioOptions.stall_ms``. Reopen attempts follow with backoff.
    """

    kind: str = ""
    device: str = ""
    reason: str = ""


@dataclass(frozen=True)
class AudioDeviceRestored(Event):
    """A lost audio device was opened again (``device``: its name now) after ``down_ms``."""

    kind: str = ""
    device: str = ""
    down_ms: float = 0.0
