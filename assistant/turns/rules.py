"""What the turn engine is allowed to do, and what it keeps of each run of a turn."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from assistant.config.sections import TurnOptions

BARGE_IN_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class TurnRules:
    """What the engine is allowed to do.

    ``barge_in``: whether user speech may interrupt a reply being played: ``auto`` while echo
    cancellation has converged (full duplex), ``on`` always (headsets: the microphone is heard
    during replies even without echo cancellation), ``off`` never. ``continuation_ms``: words
    over the reply that begin this soon after its first audio continue the question; speech
    over the reply shorter than ``min_words_ms`` only stops it when it says stop.
    ``speculate``: start the turn's work at a pause. ``partials``: transcribe the utterance in
    progress every ``partial_interval_ms`` of speech for the live transcript.
    """

    barge_in: str = "auto"
    speculate: bool = True
    partials: bool = False
    partial_interval_ms: float = 700.0
    continuation_ms: float = 1800.0
    min_words_ms: float = 500.0

    def __post_init__(self) -> None:
        if self.barge_in not in BARGE_IN_MODES:
            raise ValueError(f"barge-in {self.barge_in!r}: use one of {', '.join(BARGE_IN_MODES)}")

    @classmethod
    def of(cls, barge_in: str, turn: TurnOptions) -> TurnRules:
        """The rules of the settings; partials ``auto`` counts as on (the session resolves it)."""
        partials = turn.partials != "off" and turn.partial_interval_ms > 0
        return cls(barge_in, turn.speculate, partials, turn.partial_interval_ms, turn.continuation_ms)


@dataclass
class Attempt:
    """One run of a turn's work; a speculative one may be confirmed or discarded."""

    id: int
    turn_id: int
    confirmed: bool
    discarded: bool = False
    cancelled: bool = False
    audio_started: bool = False  # its first piece of audio went to the speaker: the floor is ours
    first_audio_ns: int = 0


class MicBlock(enum.Enum):
    """What to do with the microphone block just captured (:meth:`TurnEngine.mic_block`)."""

    # The microphone stops being heard (closed, or gated as a reply plays): forget the speech
    # in progress (reset the endpointer) and tell the engine (``TurnEngine.unheard``).
    CLOSE = "close"
    IGNORE = "ignore"  # still closed or gated
    RESTART = "restart"  # listening again: reset the endpointer, drain the microphone, skip this block
    FEED = "feed"  # feed it; the last turn is still open to more speech
    FEED_SEALED = "feed sealed"  # seal the endpointer first: new speech starts a new turn
    FEED_OVER_REPLY = "feed over the reply"  # sealed, and a reply plays: ``Endpointer.over_reply``
