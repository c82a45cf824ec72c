"""Events of hearing a turn: speech found, paused, resumed, ended; its end decided; its words."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from assistant.events.base import DiscardReason, Event


@dataclass(frozen=True)
class SpeechOnset(Event):
    """VAD has heard ``VadOptions.onset_ms`` of speech: maybe a turn, too early to tell.

    ``t_ns`` is when it was detected, ``onset_t_ns`` when the first speech sample was captured;
    ``turn_id`` is the turn it becomes if it lasts. Barge-in stops the reply here.
    """

    onset_t_ns: int = 0


@dataclass(frozen=True)
class OnsetEnded(Event):
    """Sound that raised ``SpeechOnset`` ended before it was long enough to be a turn.

    ``audio`` is that sound (a cough, a click, or a short word such as "stop").
    """

    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32), repr=False)


@dataclass(frozen=True)
class SpeechStarted(Event):
    """VAD saw speech begin; ``t_ns`` is when its first speech sample was captured."""


@dataclass(frozen=True)
class SpeechEnded(Event):
    """An utterance is complete.

    ``t_ns`` is when the endpoint was detected (trailing silence long enough, or the length
    cap reached); ``speech_end_t_ns`` is when the last speech sample was captured, so
    endpointing delay = ``t_ns - speech_end_t_ns``. ``audio`` is 16 kHz mono float32 including
    the pre-roll. ``cut`` is true when the maximum utterance length ended it at a quiet
    point: the speech continues into the next utterance (nothing is dropped), whose events
    carry ``after_cut``; the reply waits for the end of that (``TurnHeld``). ``audio`` of an
    utterance after a cut that holds no speech is empty.
    """

    speech_end_t_ns: int = 0
    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32), repr=False)
    cut: bool = False
    after_cut: bool = False

    @property
    def duration_ms(self) -> float:
        """Length of ``audio`` in milliseconds."""
        return 1000.0 * self.audio.size / 16000


@dataclass(frozen=True)
class SpeechPaused(Event):
    """The user has been silent ``TurnOptions.pause_ms``: maybe done, maybe thinking.

    ``t_ns`` is when the pause was detected, ``speech_end_t_ns`` when the last speech sample
    was captured; ``audio`` is the utterance so far (what speculative ASR transcribes).
    ``after_cut``: the utterance continues one cut at ``max_utterance_s`` (``SpeechEnded.cut``).
    """

    speech_end_t_ns: int = 0
    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32), repr=False)
    after_cut: bool = False


@dataclass(frozen=True)
class SpeechResumed(Event):
    """The user spoke again after a pause (``after_endpoint``: after the turn had ended).

    The new speech joins turn ``turn_id``; any work started on the shorter utterance is
    discarded. ``t_ns`` is when it was detected.
    """

    after_endpoint: bool = False


@dataclass(frozen=True)
class TurnDecision(Event):
    """The end-of-turn policy looked at a pause.

    ``complete`` ends the turn. ``probability`` is the Smart Turn model's score that the
    speaker is done (``None`` for fixed silence); ``inference_ms`` its features + model time;
    ``silence_ms`` the silence so far; ``reason``: ``model``, ``question`` (the pause's
    speculative transcript ends with "?"), ``max silence`` or ``fixed silence``.
    """

    complete: bool = False
    probability: float | None = None
    inference_ms: float = 0.0
    silence_ms: float = 0.0
    reason: str = ""


@dataclass(frozen=True)
class PartialTranscript(Event):
    """Words of the utterance in progress (re-transcribed while the user speaks)."""

    text: str = ""
    audio_ms: float = 0.0
    asr_ms: float = 0.0


@dataclass(frozen=True)
class SpeculationStarted(Event):
    """Work on a turn began before the turn was confirmed: ``stage`` is ``asr`` or ``llm``."""

    stage: str = ""


@dataclass(frozen=True)
class SpeculationConfirmed(Event):
    """The turn ended as speculated: the work done so far is kept and the reply may play."""


@dataclass(frozen=True)
class SpeculationDiscarded(Event):
    """The user spoke again: the work on the shorter utterance is dropped (nothing played or kept).

    ``work_ms`` is how long it had run.
    """

    reason: DiscardReason = DiscardReason.SPEECH_RESUMED
    work_ms: float = 0.0


@dataclass(frozen=True)
class TranscriptReady(Event):
    """ASR finished; ``t_ns`` is when the text was available.

    ``held_turns`` are the turns cut for length (each ended by ``TurnHeld``) whose speech
    this turn continues: ``text`` is then the whole long utterance, all of it answered once.
    ``asr_window``: ``fit`` or ``full``, the Whisper window that gave the text;
    ``asr_fell_back``: the fitted window's decode looked wrong and the 30 s window took over.
    ``unclear_s``: ``(start_s, end_s)`` stretches that could not be transcribed (left out).
    ``queued_until_t_ns``: when the turns before it were done, if it waited for them (a typed
    question answered first, a reply that played on); 0 when it did not wait.
    """

    text: str = ""
    asr_ms: float = 0.0
    held_turns: tuple[int, ...] = ()
    asr_window: str = ""
    asr_fell_back: bool = False
    unclear_s: tuple[tuple[float, float], ...] = ()
    queued_until_t_ns: int = 0


@dataclass(frozen=True)
class TurnHeld(Event):
    """Turn ``turn_id`` was cut for length while the user went on (``SpeechEnded.cut``).

    Its speech is held, not answered: it is answered together with the speech that continues
    it, once that ends. ``text`` is the held speech transcribed so far (its 30 s clips that
    are final; may be empty), ``pending_ms`` the held audio not transcribed yet. Ends the
    turn without a reply or a record.
    """

    text: str = ""
    pending_ms: float = 0.0
