"""The turn engine: who has the floor, and what each endpointer event does to the turns.

Pure logic: no threads, no devices, no models, no clock. It takes what happened (the
endpointer's events, the TTS asking to play, a turn's work ending, the microphone lost, a
typed message, an interrupt) and returns what to do (:class:`Start`, :class:`Confirm`,
:class:`Discard`, :class:`BargeIn`, :class:`Cancel`, :class:`Emit`). The live loop
(:mod:`assistant.turns.live`) runs it under one lock and carries the actions out; unit tests
drive it with scripted timelines.

The rules (docs/voice.md, "Turn taking" and "Speculation"):

- A pause (``SpeechPaused``) starts a speculative run of the turn when ``speculate`` is on
  and none is running; nothing of it plays until the end of the turn confirms it.
- The end of the turn (``SpeechEnded``) confirms the speculative run, or starts a confirmed
  one. A turn cut for length (``cut``) is never answered on its own: a speculative run on it
  is discarded (``cut for length``) and the cut turn runs only to hold its speech.
- Speech that comes back (``SpeechResumed``, also after the endpoint) discards the run that
  has not played yet (``speech resumed``): the user goes on, so the turn goes on.
- Once the reply's first audio has played it is the assistant's floor. The microphone is
  heard while it plays only when echo cancellation has converged (``echo_ok``, full duplex)
  or barge-in is forced on (headsets); else it is gated (:meth:`TurnEngine.mic_block`), so
  the assistant does not hear itself.
- Speech over the reply (:mod:`assistant.turns.overlap`), when barge-in is on (``auto``: while
  full duplex): its onset pauses the reply (:class:`PauseReply`); its transcript at its first
  pause decides. No words or a backchannel resume the reply where it stopped; "stop" stops it;
  words that began within ``continuation_ms`` of the reply's first audio are the rest of the
  question (:class:`ContinueTurn`: the reply is dropped and the question's speech joins this
  turn); later words interrupt it (:class:`BargeIn`) and are the next turn. With barge-in off,
  speech heard over the reply is the next turn, answered after it.
- The last turn stays open to more speech until its reply plays; after that, the endpointer
  is sealed so that new speech starts a new turn.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from assistant.events import (
    CancelReason,
    DiscardReason,
    Event,
    OnsetEnded,
    OverlapHeard,
    OverlapVerdict,
    ReplyResumed,
    SpeculationConfirmed,
    SpeechEnded,
    SpeechOnset,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    TurnCancelled,
)
from assistant.turns.actions import (
    Action,
    BargeIn,
    Cancel,
    Confirm,
    ContinueTurn,
    Discard,
    Emit,
    Judge,
    PauseReply,
    ResumeReply,
    Start,
    StopSpeaker,
)
from assistant.turns.overlap import Overlap, judge, starts_with_stop

BARGE_IN_MODES = ("auto", "on", "off")
__all__ = [  # the actions are the engine's vocabulary: importable from here
    "Action", "Attempt", "BargeIn", "Cancel", "Confirm", "ContinueTurn", "Discard", "Emit", "Judge",
    "MicBlock", "PauseReply", "ResumeReply", "Start", "StopSpeaker", "TurnEngine", "TurnRules",
]  # fmt: skip


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

    IGNORE = "ignore"  # closed, or the reply is playing and the microphone is gated
    RESTART = "restart"  # listening again: reset the endpointer, drain the microphone, skip this block
    FEED = "feed"  # feed it; the last turn is still open to more speech
    FEED_SEALED = "feed sealed"  # seal the endpointer first: new speech starts a new turn


@dataclass
class TurnEngine:
    """The turn-taking state machine (not thread-safe: its owner calls it under one lock)."""

    rules: TurnRules = field(default_factory=TurnRules)
    attempts: list[Attempt] = field(default_factory=list)  # running, oldest first; the last is the newest
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    echo_ok: bool = False  # echo cancellation converged: the microphone is heard over replies
    overlap: Overlap | None = None  # speech over a reply, until it is judged words or over
    _gated: bool = False
    _partial_audio_ms: float = 0.0

    # What the owner asks

    def busy(self) -> bool:
        """Whether a turn is being worked on or answered."""
        return bool(self.attempts)

    def speaking(self) -> bool:
        """Whether a reply is being played (the floor is the assistant's)."""
        return any(a.audio_started for a in self.attempts)

    def hears_over_reply(self) -> bool:
        """Whether the microphone is heard while a reply plays (full duplex, or a headset)."""
        return self.echo_ok or self.rules.barge_in == "on"

    def interrupts(self) -> bool:
        """Whether speech over a reply may pause and stop it."""
        return self.rules.barge_in == "on" or (self.rules.barge_in == "auto" and self.echo_ok)

    # What happened

    def mic_block(self, closed: bool) -> MicBlock:
        """A block was captured; ``closed``: the user muted or paused the microphone."""
        newest = self.attempts[-1] if self.attempts else None
        open_turn = newest is not None and not (newest.discarded or newest.audio_started)
        if closed or (self.speaking() and not self.hears_over_reply()):
            self._gated = True  # do not listen to ourselves
            return MicBlock.IGNORE
        if self._gated:
            self._gated = False
            return MicBlock.RESTART
        return MicBlock.FEED if open_turn else MicBlock.FEED_SEALED

    def handle(self, event: Event, now_ns: int) -> list[Action]:
        """Start, confirm, discard or interrupt the turn's work for one endpointer event."""
        overlap = self.overlap
        if overlap is not None and overlap.turn_id == event.turn_id:
            return self._overlap_event(overlap, event, now_ns)
        newest = self.attempts[-1] if self.attempts else None
        ours = newest if newest is not None and newest.turn_id == event.turn_id else None
        if ours is not None and (ours.discarded or ours.cancelled):
            ours = None  # its work is being dropped: more of the turn starts afresh
        if isinstance(event, SpeechResumed):
            if ours is not None and not ours.audio_started:
                return self._discard(ours, DiscardReason.SPEECH_RESUMED)
            if ours is not None and self.interrupts() and self.overlap is None:
                # Rejoined the turn as its reply began: the endpointer joined the speech already.
                return self._pause(ours, event.turn_id, event.t_ns, now_ns, rejoined=True)
        elif isinstance(event, SpeechPaused):
            if self.rules.speculate and ours is None:
                return [self._start(event.turn_id, event, confirmed=False)]
        elif isinstance(event, SpeechEnded):
            self._partial_audio_ms = 0.0
            actions: list[Action] = []
            if event.cut and ours is not None:  # speculation on speech that goes on: drop it
                actions += self._discard(ours, DiscardReason.CUT_FOR_LENGTH)
                ours = None
            if ours is not None and not ours.confirmed:
                ours.confirmed = True
                actions += [Confirm(ours.id), Emit(SpeculationConfirmed(event.turn_id, now_ns))]
            elif ours is None:
                actions.append(self._start(event.turn_id, event, confirmed=True))
            return actions
        elif isinstance(event, SpeechOnset | SpeechStarted) and self.interrupts() and self.overlap is None:
            onset = event.onset_t_ns if isinstance(event, SpeechOnset) else event.t_ns
            playing = [a for a in self.attempts if a.audio_started and not a.cancelled]
            if playing:
                return self._pause(playing[-1], event.turn_id, onset, now_ns)
        return []

    def overlap_heard(self, turn_id: int, text: str, now_ns: int) -> list[Action]:
        """The transcript of the speech over the reply (:class:`Judge`): resume, stop, cut or continue."""
        ov = self.overlap
        if ov is None or ov.turn_id != turn_id or not ov.judging:
            return []
        ov.judging = False
        verdict = judge(text)
        spoken_ms = _spoken_ms(ov)
        if verdict is OverlapVerdict.BARGE_IN and spoken_ms < self.rules.min_words_ms:
            verdict = OverlapVerdict.NOISE  # too short to take the floor (Whisper guesses at a hum)
        if isinstance(ov.pending, SpeechEnded) and verdict is not OverlapVerdict.BARGE_IN:
            self.overlap = None  # it is over already: the next speech over a reply is new
        attempt = self._find(ov.attempt)
        live = attempt if attempt is not None and not attempt.cancelled else None
        heard = Emit(OverlapHeard(ov.reply_turn, now_ns, turn_id, text.strip(), verdict))
        if verdict in (OverlapVerdict.NOISE, OverlapVerdict.BACKCHANNEL):
            if ov.stale:  # the user went on meanwhile: judge the longer speech instead
                ov.stale = False
                return self._judge(ov) if ov.pending is not None else []
            ov.ignored = True
            if live is None:
                return [heard]
            paused_ms = (now_ns - ov.paused_t_ns) / 1e6
            return [heard, ResumeReply(live.id), Emit(ReplyResumed(ov.reply_turn, now_ns, paused_ms))]
        if verdict is OverlapVerdict.STOP:
            ov.ignored = True
            return [heard, *(self._barge_in(live, ov) if live is not None else [StopSpeaker()])]
        if ov.continuation and not starts_with_stop(text):
            words = OverlapHeard(ov.reply_turn, now_ns, turn_id, text.strip(), OverlapVerdict.CONTINUATION)
            heard = Emit(words)
            actions: list[Action] = [heard]
            if live is not None:
                live.cancelled = True
                actions += [ContinueTurn(live.id, hold=not ov.rejoined), StopSpeaker()]
        else:
            actions = [heard, *(self._barge_in(live, ov) if live is not None else [])]
        self.overlap = None  # words: from here on an ordinary turn
        if ov.pending is not None:  # its pause or end came while it was judged: act on it now
            assert isinstance(ov.pending, Event)
            actions += self.handle(ov.pending, now_ns)
        return actions

    def claim_audio(self, attempt_id: int, now_ns: int) -> bool:
        """The reply asks to play a piece: the floor is its own unless the user took it back."""
        attempt = self._find(attempt_id)
        if attempt is None or attempt.discarded or attempt.cancelled:
            return False
        if not attempt.audio_started:
            attempt.audio_started, attempt.first_audio_ns = True, now_ns
        return True

    def ended(self, attempt_id: int) -> None:
        """``attempt``'s work finished: it no longer holds the floor or the turn."""
        self.attempts = [a for a in self.attempts if a.id != attempt_id]

    def submit(self, turn_id: int, first: object) -> Start:
        """A typed message or a recorded utterance: answered after the turns before it."""
        return self._start(turn_id, first, confirmed=True)

    def microphone_lost(self, speech_turn: int, held_turns: list[int], now_ns: int) -> list[Action]:
        """The microphone went away: the speech in progress, and work started on it, is gone.

        ``speech_turn`` is the endpointer's turn in progress (0: none), ``held_turns`` those of
        the speech held from length cuts, which is dropped too: the rest of that question will
        not come, and it must not be joined to the next one.
        """
        self._partial_audio_ms = 0.0
        turn = speech_turn or (held_turns[-1] if held_turns else 0)
        actions: list[Action] = []
        newest = self.attempts[-1] if self.attempts else None
        if newest is not None and not newest.confirmed:
            actions += self._discard(
                newest, DiscardReason.MICROPHONE_LOST
            )  # speculative: the rest will not come
            turn = turn or newest.turn_id
        if turn:
            actions.append(Emit(TurnCancelled(turn, now_ns, CancelReason.MICROPHONE_LOST)))
        ov, self.overlap = self.overlap, None
        paused = self._find(ov.attempt) if ov is not None and not ov.ignored else None
        if paused is not None and not paused.cancelled:
            actions.append(ResumeReply(paused.id))  # nothing more will be heard to decide on
        return actions

    def interrupt(self) -> list[Action]:
        """Stop the reply being generated or spoken (the part heard stays in the history)."""
        self.overlap = None
        actions: list[Action] = []
        for attempt in self.attempts:
            attempt.cancelled = True
            actions.append(Cancel(attempt.id))
        return [*actions, StopSpeaker()]

    def partial_due(self, audio_ms: float, in_speech: bool) -> bool:
        """Whether to transcribe the utterance in progress (``audio_ms`` long) for the display.

        Only while the user speaks, every ``partial_interval_ms`` of it, and never while the
        turn's own work runs: that comes first.
        """
        if not self.rules.partials or not in_speech:
            return False
        if audio_ms - self._partial_audio_ms < self.rules.partial_interval_ms:
            return False
        if any(not a.audio_started for a in self.attempts):
            return False
        self._partial_audio_ms = audio_ms
        return True

    # Helpers

    def _start(self, turn_id: int, first: object, confirmed: bool) -> Start:
        attempt = Attempt(next(self._ids), turn_id, confirmed)
        self.attempts.append(attempt)
        return Start(attempt.id, turn_id, first, confirmed)

    def _discard(self, attempt: Attempt, reason: DiscardReason) -> list[Action]:
        attempt.discarded = attempt.cancelled = True
        return [Discard(attempt.id, reason)]

    def _barge_in(self, attempt: Attempt, ov: Overlap) -> list[Action]:
        attempt.cancelled = True
        return [BargeIn(attempt.id, attempt.turn_id, ov.onset_t_ns, ov.paused_t_ns), StopSpeaker()]

    def _pause(
        self, attempt: Attempt, turn_id: int, onset_t_ns: int, now_ns: int, rejoined: bool = False
    ) -> list[Action]:
        """Speech began over ``attempt``'s reply: hold the reply until the speech is judged."""
        window_ns = self.rules.continuation_ms * 1e6
        continuation = rejoined or onset_t_ns - attempt.first_audio_ns <= window_ns
        self.overlap = Overlap(
            attempt.id, attempt.turn_id, turn_id, onset_t_ns, now_ns, continuation, rejoined=rejoined
        )
        return [PauseReply(attempt.id, attempt.turn_id, onset_t_ns, turn_id)]

    def _overlap_event(self, ov: Overlap, event: Event, now_ns: int) -> list[Action]:
        """An endpointer event of the speech over the reply, before it was judged words."""
        if isinstance(event, SpeechPaused | SpeechEnded):
            ov.pending = event
            if ov.ignored:
                if isinstance(event, SpeechEnded):
                    self.overlap = None  # over, and nothing to answer
                return []
            return [] if ov.judging else self._judge(ov)
        if isinstance(event, SpeechResumed):
            ov.pending = None
            if ov.judging:
                ov.stale = True
            elif ov.ignored:  # more after "mm-hmm": hold the reply again and judge it all
                ov.ignored = False
                attempt = self._find(ov.attempt)
                if attempt is not None and not attempt.cancelled:
                    ov.paused_t_ns = now_ns
                    return [PauseReply(attempt.id, attempt.turn_id, event.t_ns, ov.turn_id)]
            return []
        if isinstance(event, OnsetEnded) and not ov.judging and not ov.ignored:
            self.overlap = None  # a click or a cough, too short to be a turn
            attempt = self._find(ov.attempt)
            verdict = Emit(OverlapHeard(ov.reply_turn, now_ns, ov.turn_id, "", OverlapVerdict.NOISE))
            if attempt is None or attempt.cancelled:
                return [verdict]
            paused_ms = (now_ns - ov.paused_t_ns) / 1e6
            return [verdict, ResumeReply(attempt.id), Emit(ReplyResumed(ov.reply_turn, now_ns, paused_ms))]
        return []

    def _judge(self, ov: Overlap) -> list[Action]:
        assert isinstance(ov.pending, SpeechPaused | SpeechEnded)
        ov.judging = True
        return [Judge(ov.turn_id, ov.pending.audio)]

    def _find(self, attempt_id: int) -> Attempt | None:
        return next((a for a in self.attempts if a.id == attempt_id), None)


def _spoken_ms(ov: Overlap) -> float:
    """How long the speech over the reply lasted, onset to its last speech sample so far."""
    end = ov.pending.speech_end_t_ns if isinstance(ov.pending, SpeechPaused | SpeechEnded) else 0
    return max(0.0, (end - ov.onset_t_ns) / 1e6)
