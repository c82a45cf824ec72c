"""The base of every event, and the reasons a turn or its speculation stopped early."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CancelReason(enum.StrEnum):
    """Why a turn stopped early (:class:`TurnCancelled`) or its speculation was dropped.

    A ``str``: records, logs and JSON keep the words (``"speaker lost"``), and a member equals
    its word.
    """

    INTERRUPTED = "interrupted"  # barge-in, Ctrl-C: the part played is kept
    NO_WORDS = "no words recognised"  # ASR heard nothing to answer
    SPEAKER_LOST = "speaker lost"  # playback given up; the reply's text is kept
    MICROPHONE_LOST = "microphone lost"  # the speech in progress was dropped; no reply
    # The LLM server (--llm-server) failed mid-reply; the text so far is kept and the next
    # turn connects again.
    LLM_SERVER_LOST = "llm server lost"
    # The user went on with the question while its reply started: the reply is dropped and
    # the question's speech joins the next turn, which answers the whole of it.
    CONTINUED = "continued"
    # The microphone was closed (muted, paused) or gated as a reply began before the speech
    # ended: the speech in progress was dropped; no reply.
    NOT_HEARD = "not heard"


class DiscardReason(enum.StrEnum):
    """Why speculative work was thrown away (:class:`SpeculationDiscarded`)."""

    SPEECH_RESUMED = "speech resumed"  # the user went on after the pause
    CUT_FOR_LENGTH = "cut for length"  # the utterance was cut at ``max_utterance_s``: held, not answered
    MICROPHONE_LOST = "microphone lost"  # the rest of the utterance will not come
    NOT_HEARD = "not heard"  # the microphone was closed or gated: the rest will not be heard


@dataclass(frozen=True)
class Event:
    """Base of every pipeline event."""

    turn_id: int
    t_ns: int
