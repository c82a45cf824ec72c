"""What a turn of the voice loop works with.

Its stages as it uses them, its options, speech held across length cuts, and the gate that
decides whether a reply may be kept and played. Split from :mod:`assistant.turns.pipeline`,
which runs the turns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from assistant.events import DiscardReason
from assistant.stages.asr import TranscriptResult


class Transcribes(Protocol):
    """The ASR stage as the pipeline uses it."""

    description: str

    def transcribe(
        self, audio: np.ndarray, quick: bool = False, long_form: bool = False, partial: bool = False
    ) -> TranscriptResult:
        """Transcribe 16 kHz mono float32 audio (its ``text`` and ``asr_ms`` are what turns read).

        ``quick``: greedy (words over a reply); ``partial``: greedy and fast, for the live
        transcript (no text rather than a slow second pass); ``long_form``: a clip of longer
        speech (timestamps).
        """
        ...

    def phrase_logprobs(self, audio: np.ndarray, phrases: list[str]) -> list[float]:
        """How likely each phrase is as the transcript of ``audio``: mean log-probability a token."""
        ...


class Synthesizes(Protocol):
    """The TTS stage as the pipeline uses it."""

    @property
    def description(self) -> str:
        """The engine and voice, for the turn record (``piper en_US-joe-medium``)."""
        ...

    def stream(self, text: str) -> Iterator[np.ndarray]:
        """16 kHz mono float32 audio of ``text``, piece by piece as it is rendered (lazy)."""
        ...


class Splits(Protocol):
    """The sentence splitter as the pipeline uses it."""

    def push(self, text: str, left_ms: float | None = None) -> list[str]:
        """Add text; return completed sentences (or words, with under ``left_ms`` left to play)."""
        ...

    def flush(self) -> list[str]:
        """Return what is left."""
        ...


@dataclass(frozen=True)
class PipelineOptions:
    """Turn-taking behaviour.

    ``barge_in``: whether speech over a reply may stop it: ``auto`` while echo cancellation has
    converged (full duplex), ``on`` always (headsets), ``off`` never. Only what was played of
    a stopped reply stays in the conversation.
    """

    barge_in: str = "auto"
    log_path: Path | None = None


@dataclass
class HeldSpeech:
    """Speech of turns cut for length (``SpeechEnded.cut``) that is not answered yet.

    Also the speech of a question the user went on with after its reply had begun
    (``continued``, docs/voice.md "Full duplex"): the next turn answers both as one.

    ``texts`` are the transcripts of its clips that are final, ``audio`` the rest, not yet
    transcribed. A clip is final once the held audio runs past its 30 s window
    (:func:`~assistant.stages.asr.first_clip_end`), so it is transcribed while the user still
    speaks, cut where file mode would cut it; the turn that ends the utterance transcribes
    the rest with its own audio.
    """

    turns: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    continued: bool = False  # a question the user went on with after its reply began (not cut)


@dataclass(frozen=True)
class Said:
    """A turn's speech as transcribed (held speech included) and its words."""

    audio: np.ndarray
    text: str


class ReplyGate:
    """Whether a turn's reply may be kept and played.

    A speculative turn (started at a pause, before the end of the turn was decided) begins
    unconfirmed: ASR and the first sentence of the reply run, but nothing plays and nothing
    enters the conversation until :meth:`confirm`; :meth:`discard` (the user went on) drops
    it all. ``claim_audio`` is asked before each piece of audio is played; False means the
    user has taken the floor back, so the piece is not played.
    """

    def __init__(self, confirmed: bool = True, claim_audio: Callable[[], bool] | None = None) -> None:
        self.confirmed = threading.Event()
        self.discarded = False
        self.joins_next = False  # the user went on with the question: see join_next
        self.hold_speech = False
        self.reason = DiscardReason.SPEECH_RESUMED
        self.claim_audio = claim_audio
        self._free = threading.Event()  # cleared while speech over the reply is judged (hold)
        self._free.set()
        # What the turn said, once transcribed: speech over its reply in the continuation
        # window is judged joined to it (:meth:`~assistant.turns.hearing.Hearing.transcribe_overlap`).
        self.said: Said | None = None
        if confirmed:
            self.confirmed.set()

    def confirm(self) -> None:
        """The turn ended as speculated."""
        self.confirmed.set()

    def discard(self, reason: DiscardReason = DiscardReason.SPEECH_RESUMED) -> None:
        """The user spoke again (or the turn was cut for length): throw the work away."""
        self.reason = reason
        self.discarded = True
        self.confirmed.set()  # wakes the waiters, who then see ``discarded``

    def join_next(self, hold: bool) -> None:
        """The user went on with this turn's question after its reply began.

        The reply (cancelled by the caller) leaves the conversation; with ``hold`` the turn's
        speech is held to be answered with the next turn's, as one question.
        """
        self.joins_next, self.hold_speech = True, hold

    def hold(self) -> None:
        """Speech over the playing reply is being judged: the reply's generation waits.

        On 2 cores the judge's Whisper pass shared the CPU with the reply's LLM and voice, and a
        reply paused for "Okay." stayed silent 2.2 s in a user check; held, the judge has it.
        """
        self._free.clear()

    def release(self) -> None:
        """The speech was judged (no words, a backchannel): the reply's generation goes on."""
        self._free.set()

    def wait(self, cancel: threading.Event) -> bool:
        """Block until confirmed (True) or discarded / cancelled first (False)."""
        while not self.confirmed.wait(0.02):
            if cancel.is_set():
                return False
        return not self.discarded

    def paced(self, cancel: threading.Event) -> bool:
        """Block while :meth:`hold` holds the reply's generation; False once cancelled or discarded.

        Only the generation waits here: a reply stopped while held (cancelled) is still
        confirmed and recorded as interrupted, with what was heard.
        """
        while not self._free.wait(0.02):
            if cancel.is_set() or self.discarded:
                return False
        return True

    def may_play(self) -> bool:
        """Whether the next piece of audio may go to the speaker now."""
        return not self.discarded and (self.claim_audio is None or self.claim_audio())
