"""Typed, timestamped pipeline events. Every event has ``turn_id`` and ``t_ns`` (monotonic_ns)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from assistant.observe.latency import TurnRecord


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


class OverlapVerdict(enum.StrEnum):
    """What speech over a playing reply turned out to be (:class:`OverlapHeard`)."""

    NOISE = "no words"  # a cough, a click, a breath: the reply resumes
    BACKCHANNEL = "backchannel"  # "mm-hmm", "yeah", "okay": the reply resumes
    STOP = "stop"  # "stop", "wait": the reply stops and nothing is answered
    CONTINUATION = "continuation"  # the rest of the question: the reply is dropped, one turn
    BARGE_IN = "barge-in"  # a new question: the reply stops (the part heard is kept)


class DiscardReason(enum.StrEnum):
    """Why speculative work was thrown away (:class:`SpeculationDiscarded`)."""

    SPEECH_RESUMED = "speech resumed"  # the user went on after the pause
    CUT_FOR_LENGTH = "cut for length"  # the utterance was cut at ``max_utterance_s``: held, not answered
    MICROPHONE_LOST = "microphone lost"  # the rest of the utterance will not come


@dataclass(frozen=True)
class Event:
    """Base of every pipeline event."""

    turn_id: int
    t_ns: int


@dataclass(frozen=True)
class SpeechOnset(Event):
    """VAD has heard ``VadOptions.onset_ms`` of speech: maybe a turn, too early to tell.

    ``t_ns`` is when it was detected, ``onset_t_ns`` when the first speech sample was captured;
    ``turn_id`` is the turn it becomes if it lasts. Barge-in stops the reply here.
    """

    onset_t_ns: int = 0


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


@dataclass(frozen=True)
class OnsetEnded(Event):
    """Sound that raised ``SpeechOnset`` ended before it was long enough to be a turn.

    ``audio`` is that sound (a cough, a click, or a short word such as "stop").
    """

    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32), repr=False)


@dataclass(frozen=True)
class MicLevel(Event):
    """Loudness of the latest microphone block (``level_db``: RMS in dBFS, -120 is silence).

    Sent to the UI about ten times a second; not a turn event (``turn_id`` is the current turn).
    """

    level_db: float = -120.0


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
    ``silence_ms`` the silence so far; ``reason``: ``model``, ``max silence`` or
    ``fixed silence``.
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
    """

    text: str = ""
    asr_ms: float = 0.0
    held_turns: tuple[int, ...] = ()
    asr_window: str = ""
    asr_fell_back: bool = False
    unclear_s: tuple[tuple[float, float], ...] = ()


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
