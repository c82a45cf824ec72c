"""Events of answering a turn: prompt, tokens, sentences, audio, playback, and how the turn ended."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from assistant.events.base import CancelReason, Event

if TYPE_CHECKING:
    from assistant.observe.latency import TurnRecord


@dataclass(frozen=True)
class PromptSubmitted(Event):
    """The prompt went to the decoder (start of TTFT).

    ``network_ms``: with a served decoder (``--llm-server``), the part of TTFT outside the
    server's model (network, gRPC, Triton's queue); ``None`` for a local decoder.
    """

    prompt_tokens: int = 0
    reused_tokens: int = 0
    network_ms: float | None = None


@dataclass(frozen=True)
class TokenGenerated(Event):
    """A reply token reached the host; ``text`` is what it made printable (may be empty)."""

    index: int = 0
    text: str = ""


@dataclass(frozen=True)
class SentenceReady(Event):
    """The splitter completed a sentence of the reply."""

    index: int = 0
    text: str = ""


@dataclass(frozen=True)
class AudioReady(Event):
    """TTS rendered a piece of sentence ``index``; ``audio_ms`` is its length.

    ``part`` counts the pieces of one sentence: a streaming voice (Piper) renders a text of
    several sentences piece by piece, and each piece plays as soon as it is ready.
    """

    index: int = 0
    audio_ms: float = 0.0
    part: int = 0


@dataclass(frozen=True)
class AudioStarted(Event):
    """The first sample of the reply was handed to the output device (or the output file)."""


@dataclass(frozen=True)
class PlaybackEnded(Event):
    """The reply finished playing (or was stopped)."""


@dataclass(frozen=True)
class TurnCancelled(Event):
    """The turn stopped early; ``heard_text`` is the reply as the conversation keeps it.

    ``reason`` (:class:`CancelReason`): ``interrupted`` (barge-in, Ctrl-C: ``heard_text`` is
    the part that was played), ``speaker lost`` (playback given up; the whole reply's text is
    kept), ``microphone lost`` (the speech in progress was dropped; no reply), ``llm server
    lost`` (the text so far is kept), ``no words recognised``.
    """

    reason: CancelReason = CancelReason.INTERRUPTED
    heard_text: str = ""


@dataclass(frozen=True)
class TurnDone(Event):
    """The turn is over; ``record`` is its latency record."""

    record: TurnRecord | None = None
