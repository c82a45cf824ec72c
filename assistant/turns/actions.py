"""What the turn engine (:mod:`assistant.turns.engine`) asks its owner to do.

Each action is data: the live loop (:mod:`assistant.turns.live`) carries it out, the unit
tests read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from assistant.events import DiscardReason, Event


@dataclass(frozen=True)
class Start:
    """Run ``first`` (an utterance, typed text or recorded speech) as ``attempt``'s turn.

    ``heard``: the transcript of the held question and ``first``'s audio when it is known
    already (the judge's, of the rest of a question said over its reply): the run needs no ASR
    pass of its own.
    """

    attempt: int
    turn_id: int
    first: object
    confirmed: bool
    heard: object = None


@dataclass(frozen=True)
class Confirm:
    """The speculative run ``attempt`` is the answer: let it play and enter the history."""

    attempt: int


@dataclass(frozen=True)
class Discard:
    """Drop ``attempt``'s work unheard (nothing of it played) and stop it."""

    attempt: int
    reason: DiscardReason


@dataclass(frozen=True)
class BargeIn:
    """The user spoke over ``attempt``'s reply: stop generating and playing it now.

    ``paused_t_ns``: when its playback was paused for the speech (0: now).
    """

    attempt: int
    turn_id: int
    onset_t_ns: int
    paused_t_ns: int = 0


@dataclass(frozen=True)
class PauseReply:
    """Speech began over ``attempt``'s reply (turn ``turn_id``): hold its playback where it is."""

    attempt: int
    turn_id: int
    onset_t_ns: int
    overlap_turn: int


@dataclass(frozen=True)
class ResumeReply:
    """The speech over ``attempt``'s reply had no words for it: play on where it stopped."""

    attempt: int


@dataclass(frozen=True)
class ContinueTurn:
    """The user went on with ``attempt``'s question: drop its reply (stop it now).

    ``hold``: its speech joins the next turn answered (else the endpointer already joined it).
    """

    attempt: int
    hold: bool


@dataclass(frozen=True)
class Judge:
    """Transcribe ``audio``, the speech of turn ``turn_id`` over a reply, which ends at ``t_ns``.

    Its words go to :meth:`~assistant.turns.engine.TurnEngine.overlap_heard`. ``joined_with``:
    the attempt whose question the speech may continue (0: none); it is transcribed after
    what that attempt said. ``short``: too short to take the floor, so only a stop request
    (or a backchannel) in it matters.
    """

    turn_id: int
    audio: object
    joined_with: int = 0
    t_ns: int = 0
    short: bool = False


@dataclass(frozen=True)
class Cancel:
    """Stop ``attempt``'s work (the part heard stays in the history)."""

    attempt: int


@dataclass(frozen=True)
class StopSpeaker:
    """Stop what the speaker plays now."""


@dataclass(frozen=True)
class Emit:
    """Report ``event``."""

    event: Event


Action = (
    Start | Confirm | Discard | BargeIn | Cancel | StopSpeaker | Emit
    | PauseReply | ResumeReply | ContinueTurn | Judge
)  # fmt: skip
