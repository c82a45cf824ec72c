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
  the assistant does not hear itself. Speech in progress when the microphone stops being heard
  (gated, muted) is dropped (``not heard``), and nothing waits on it (:meth:`TurnEngine.unheard`).
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

import itertools
from dataclasses import dataclass, field

from assistant.events import (
    CancelReason,
    DiscardReason,
    Event,
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
from assistant.turns.overlap import Overlap, OverlapRules
from assistant.turns.rules import Attempt, MicBlock, TurnRules

__all__ = [  # the actions are the engine's vocabulary: importable from here
    "Action", "Attempt", "BargeIn", "Cancel", "Confirm", "ContinueTurn", "Discard", "Emit", "Judge",
    "MicBlock", "PauseReply", "ResumeReply", "Start", "StopSpeaker", "TurnEngine", "TurnRules",
]  # fmt: skip


@dataclass
class TurnEngine(OverlapRules):
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
        """A block was captured; ``closed``: the user muted or paused the microphone.

        The first block not heard is :attr:`MicBlock.CLOSE` (the caller then forgets the speech in
        progress and calls :meth:`unheard`), the next ones :attr:`MicBlock.IGNORE`; the first one
        heard again is :attr:`MicBlock.RESTART`.
        """
        newest = self.attempts[-1] if self.attempts else None
        open_turn = newest is not None and not (newest.discarded or newest.audio_started)
        if closed or (self.speaking() and not self.hears_over_reply()):
            if self._gated:
                return MicBlock.IGNORE
            self._gated = True  # do not listen to ourselves
            return MicBlock.CLOSE
        if self._gated:
            self._gated = False
            return MicBlock.RESTART
        if open_turn:
            return MicBlock.FEED
        return MicBlock.FEED_OVER_REPLY if self.speaking() else MicBlock.FEED_SEALED

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
        return self._drop_speech(speech_turn, held_turns, now_ns, CancelReason.MICROPHONE_LOST)

    def unheard(self, speech_turn: int, now_ns: int) -> list[Action]:
        """The microphone stopped being heard (:attr:`MicBlock.CLOSE`): nothing may wait on it.

        The user closed it (mute, pause), or a reply began in half duplex, also when the echo
        path moved while the user spoke over a reply. The capture thread forgot the speech in
        progress; as with a lost microphone (:meth:`microphone_lost`), a speculative run on it
        is discarded, the turn cancelled (``not heard``) and a reply paused for speech over it
        plays on. Before, that run waited for an end that would not come and the paused reply
        for a verdict, and every later turn waited behind them. Held speech stays held (the
        caller's): it may be the question whose joined answer is about to play.
        """
        return self._drop_speech(speech_turn, [], now_ns, CancelReason.NOT_HEARD)

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
        turn's own work runs: that comes first. Nor over a reply: that speech's own pass judges
        it, and a partial would hold the model it waits for and the CPU the echo canceller needs.
        """
        if not self.rules.partials or not in_speech or self.overlap is not None:
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

    def _drop_speech(
        self, speech_turn: int, held_turns: list[int], now_ns: int, reason: CancelReason
    ) -> list[Action]:
        """The speech in progress and the held speech are gone (``reason``), and work started on them.

        Speech over a reply is no turn until judged words: its reply plays on, nothing is cancelled.
        """
        self._partial_audio_ms = 0.0
        over = self.overlap.turn_id if self.overlap is not None else 0
        turn = speech_turn if speech_turn != over else 0
        turn = turn or (held_turns[-1] if held_turns else 0)
        actions: list[Action] = []
        newest = self.attempts[-1] if self.attempts else None
        if newest is not None and not newest.confirmed and not newest.discarded:
            actions += self._discard(newest, DiscardReason(reason.value))  # the rest will not come
            turn = turn or newest.turn_id
        if turn:
            actions.append(Emit(TurnCancelled(turn, now_ns, reason)))
        return actions + self._let_overlap_go(now_ns)

    def _let_overlap_go(self, now_ns: int) -> list[Action]:
        """Speech over a reply will not be heard further: the reply held for it plays on."""
        ov, self.overlap = self.overlap, None
        if ov is None or ov.ignored:
            return []
        paused = self._find(ov.attempt)
        if paused is None or paused.cancelled:
            return []
        return [
            Emit(OverlapHeard(ov.reply_turn, now_ns, ov.turn_id, "", OverlapVerdict.NOISE)),
            ResumeReply(paused.id),
            Emit(ReplyResumed(ov.reply_turn, now_ns, (now_ns - ov.paused_t_ns) / 1e6)),
        ]

    def _find(self, attempt_id: int) -> Attempt | None:
        return next((a for a in self.attempts if a.id == attempt_id), None)
