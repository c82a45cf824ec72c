"""Speech over a playing reply: the turn engine's rules for it.

The turn engine pauses a reply when speech begins over it, then asks what the speech was once
it has a transcript (docs/voice.md, "Full duplex"). What the words are is
:func:`~assistant.turns.overlap_words.judge`'s; whether words continue the question or start a
new one depends on when they began, which the engine knows: that, and what each verdict does
to the reply, is here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from assistant.events import (
    Event,
    OnsetEnded,
    OverlapHeard,
    OverlapVerdict,
    ReplyResumed,
    SpeechEnded,
    SpeechOnset,
    SpeechPaused,
    SpeechResumed,
)
from assistant.turns.actions import (
    Action,
    BargeIn,
    ContinueTurn,
    Emit,
    Judge,
    PauseReply,
    ResumeReply,
    Start,
    StopSpeaker,
)
from assistant.turns.overlap_words import judge, starts_with_stop
from assistant.turns.rules import Attempt, TurnRules


@dataclass
class Overlap:
    """Speech over the reply of ``attempt`` (turn ``reply_turn``), not yet judged or let go.

    ``turn_id`` is the endpointer's turn for the speech; ``continuation``: it began within the
    continuation window after the reply's first audio. ``judging``: a transcript is on its
    way. ``ignored``: judged as no words, a backchannel or stop; its later pauses start
    nothing, and speech that comes back in it is judged again. ``pending`` is the last
    ``SpeechPaused``/``SpeechEnded`` of the speech while it was being judged.
    """

    attempt: int
    reply_turn: int
    turn_id: int
    onset_t_ns: int
    paused_t_ns: int
    continuation: bool
    judging: bool = False
    ignored: bool = False
    rejoined: bool = False  # the endpointer joined the speech to the reply's own turn
    stale: bool = False  # speech came back while it was being judged
    pending: object = None
    judged: object = None  # the event whose audio is being (or was last) judged


class OverlapRules:
    """The turn engine's rules for speech over a playing reply (mixed into ``TurnEngine``).

    It keeps :attr:`overlap` (the speech being judged) and uses the engine's runs and rules.
    """

    rules: TurnRules
    attempts: list[Attempt]
    overlap: Overlap | None

    def handle(self, event: Event, now_ns: int) -> list[Action]:
        """The engine's: what one endpointer event does."""
        raise NotImplementedError

    def _find(self, attempt_id: int) -> Attempt | None:
        raise NotImplementedError  # the engine's

    def overlap_heard(self, turn_id: int, text: str, now_ns: int, joined: object = None) -> list[Action]:
        """The transcript of the speech over the reply (:class:`Judge`): resume, stop, cut or continue.

        ``joined``: the question and the speech transcribed together (a ``Judge`` with
        ``joined_with``). When the words continue the question and the user has not gone on
        since the audio judged, the run started for them gets it (``Start.heard``): the whole
        question is known, and the answer waits for no second ASR pass.
        """
        ov = self.overlap
        if ov is None or ov.turn_id != turn_id or not ov.judging:
            return []
        ov.judging = False
        verdict = judge(text)
        spoken_ms = _spoken_ms(ov)
        if verdict is OverlapVerdict.BARGE_IN and spoken_ms < self.rules.min_words_ms:
            verdict = OverlapVerdict.NOISE  # too short to take the floor (Whisper guesses at a hum)
        if isinstance(ov.pending, SpeechEnded | OnsetEnded) and verdict is not OverlapVerdict.BARGE_IN:
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
            # The reply stops; more speech said meanwhile ("Stop. What is ...") is judged next.
            ov.ignored, ov.stale = not ov.stale, False
            return [heard, *(self._barge_in(live, ov) if live is not None else [StopSpeaker()])]
        if ov.continuation and not starts_with_stop(text):
            words = OverlapHeard(ov.reply_turn, now_ns, turn_id, text.strip(), OverlapVerdict.CONTINUATION)
            heard = Emit(words)
            actions: list[Action] = [heard]
            held = live is not None and not ov.rejoined  # its question is held for this turn
            if live is not None:
                live.cancelled = True
                actions += [ContinueTurn(live.id, hold=not ov.rejoined), StopSpeaker()]
        else:
            held = False
            actions = [heard, *(self._barge_in(live, ov) if live is not None else [])]
        self.overlap = None  # words: from here on an ordinary turn
        if ov.pending is not None:  # its pause or end came while it was judged: act on it now
            assert isinstance(ov.pending, Event)
            follow = self.handle(ov.pending, now_ns)
            if held and joined is not None and _same_speech(ov.judged, ov.pending):
                follow = [replace(a, heard=joined) if isinstance(a, Start) else a for a in follow]
            actions += follow
        return actions

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
        # Speech again: after a pause, or after an onset too short to be a turn ("Stop.", then
        # "What is ..."), whose end the endpointer closed and whose next speech is a new onset.
        again = isinstance(event, SpeechOnset) and isinstance(ov.pending, OnsetEnded)
        if isinstance(event, SpeechResumed) or again:
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
        if isinstance(event, OnsetEnded) and not ov.ignored:
            # Too short to be a turn: a cough, a click, or a short "stop". Its words decide.
            ov.pending = event
            return [] if ov.judging else self._judge(ov)
        return []

    def _judge(self, ov: Overlap) -> list[Action]:
        assert isinstance(ov.pending, SpeechPaused | SpeechEnded | OnsetEnded)
        ov.judging, ov.judged = True, ov.pending
        # In the window the speech may be the rest of the reply's question (held, unless the
        # endpointer joined it to that turn already): judge it joined to the question. Speech
        # shorter than ``min_words_ms`` can only be no words, a backchannel or a stop, which
        # its own greedy words tell sooner: a joined pass held the reply ~100 ms longer
        # (``python -m bench.duplex --parts backchannel``: 642 -> 541 ms median).
        words = _spoken_ms(ov) >= self.rules.min_words_ms
        joined_with = ov.attempt if ov.continuation and not ov.rejoined and words else 0
        return [Judge(ov.turn_id, ov.pending.audio, joined_with, ov.pending.t_ns, short=not words)]


def _same_speech(judged: object, pending: object) -> bool:
    """Whether ``pending`` (a pause or end to act on) holds no speech beyond the audio ``judged``.

    A pause and the end after it share their last speech sample; speech that came back in
    between moved it. An end cut for length is held, never answered with judged words.
    """
    if isinstance(pending, SpeechEnded) and pending.cut:
        return False
    return (
        isinstance(judged, SpeechPaused | SpeechEnded)
        and isinstance(pending, SpeechPaused | SpeechEnded)
        and judged.turn_id == pending.turn_id
        and judged.speech_end_t_ns == pending.speech_end_t_ns
    )


def _spoken_ms(ov: Overlap) -> float:
    """How long the speech over the reply lasted, onset to its last speech sample so far."""
    end = ov.pending.speech_end_t_ns if isinstance(ov.pending, SpeechPaused | SpeechEnded) else 0
    return max(0.0, (end - ov.onset_t_ns) / 1e6)
