"""Speech over a playing reply: what it was, from its words.

The turn engine pauses a reply when speech begins over it, then asks what the speech was once
it has a transcript (docs/voice.md, "Full duplex"). :func:`judge` is that decision in words
alone: no words (a cough, a click), a backchannel ("mm-hmm", "yeah": the listener is
listening), a request to stop, or words that take the floor. Whether words continue the
question or start a new one depends on when they began, which the engine knows.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace

from assistant.events import (
    Event,
    OnsetEnded,
    OverlapHeard,
    OverlapVerdict,
    ReplyResumed,
    SpeechEnded,
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
from assistant.turns.rules import Attempt, TurnRules

# What listeners say to show they are listening (after normalising: lower case, no
# punctuation, hyphens as spaces). Whisper writes "mm-hmm" as "Mm-hmm.", "Mhm.", "Hmm." ...
BACKCHANNELS = frozenset(
    {
        "mm", "mmm", "hmm", "hm", "mhm", "mm hmm", "mm hm", "uh huh", "uh hu", "uh uh", "um hum", "yeah",
        "yes", "yep", "yup", "ok", "okay", "right", "sure", "i see", "got it", "oh", "ah",
        "aha", "cool", "nice", "alright", "all right", "uh", "um", "huh", "wow", "true",
        "exactly", "indeed", "great", "good", "thanks", "thank you", "thank you very much",
        "thank you so much",
    }
)  # fmt: skip
# What Whisper writes for a hum or a breath it cannot place (its best-known inventions).
INVENTED = frozenset({"thanks for watching", "thank you for watching", "you", "bye", "so", "the"})
# Words that ask the assistant to stop talking, and mean nothing more on their own.
STOPS = frozenset(
    {
        "stop", "wait", "hold on", "hang on", "shut up", "be quiet", "quiet", "enough",
        "pause", "cancel", "never mind", "nevermind", "stop talking", "stop it", "no stop",
        "okay stop", "ok stop", "wait wait", "stop stop", "hold on a second", "wait a second",
        "one moment", "just a moment", "thats enough", "that's enough",
        # "Stop" with its first 100 ms under the reply (paused at its onset): AEC3's suppressor
        # eats the "s" (or the "st") and tiny.en writes "Top." or "Up." (measured on the echo rig).
        "top", "top talking", "top it", "up", "op", "please stop", "stop please",
    }
)  # fmt: skip
# Stop requests as Whisper writes them, scored against short words heard over a reply
# (:func:`spotted_stop`): "Please stop." under the reply came out "Please come." or "Please up".
SPOTTED_STOPS = ("Stop.", "Please stop.", "Stop talking.", "Stop it.", "Wait.", "Hold on.", "That's enough.")
# How far below the heard words' own score (mean log-probability a token) a stop phrase may be
# and still be what was said: mangled "Please stop."s on the echo rig scored 0.06-0.46 under
# their "Please pump.", "Please pop.", "Please up" and 1.70 under "Leave me up." (a CI run
# answered a "Please come." that 1.0 let through); real words ("Please continue.", "What about
# Rome?", "Tell me more.") put every stop phrase 3.4-4.8 below (tiny.en on espeak-ng, clean and
# degraded: python -m bench.stop_spotting). 2.0 lies between, nearer the real words' side.
STOP_SPOT_MARGIN = 2.0
SPOT_CANDIDATES = 2  # the stop phrases closest in letters are scored (a forced decode each: ~14 ms)
MAX_BACKCHANNEL_WORDS = 4  # "oh okay yeah right": longer is more than listening
POLITE = frozenset({"please", "no", "okay", "ok", "oh", "now"})  # words said around "stop"
MAX_STOP_WORDS = 4  # "stop it please": a request to stop; longer ("Stop. What is ...") is a question
_SOUNDS = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*")  # Whisper's "[coughs]", "(laughs)", "*sigh*"
_NOT_WORD = re.compile(r"[^a-z0-9' ]+")


def normalise(text: str) -> str:
    """Lower case, sound labels and punctuation removed, hyphens as spaces, single spaces."""
    text = _SOUNDS.sub(" ", text.lower()).replace("-", " ")
    return " ".join(_NOT_WORD.sub(" ", text).split())


def judge(text: str) -> OverlapVerdict:
    """What a transcript of speech over the reply is: no words, a backchannel, stop, or words.

    Words come back as ``BARGE_IN``; the engine turns that into ``CONTINUATION`` when the
    speech began within the continuation window.
    """
    words = normalise(text)
    if not words or words in INVENTED:
        return OverlapVerdict.NOISE
    if words in STOPS or words.replace("'", "") in STOPS:
        return OverlapVerdict.STOP
    short = len(words.split()) <= MAX_STOP_WORDS
    if short and (starts_with_stop(words) or _ends_with_stop(words)):  # "stop please", "please stop"
        return OverlapVerdict.STOP
    if _all_backchannel(words):
        return OverlapVerdict.BACKCHANNEL
    return OverlapVerdict.BARGE_IN


def rest_after(question: str, text: str) -> str:
    """The words of ``text`` after those of ``question`` (the reply's question, transcribed alone).

    ``text`` is the question and the speech over its reply transcribed together, where Whisper
    may write the question a little differently ("Can you tell me?" becomes "Can you tell me
    what ..."): the rest starts after the last word of ``text`` matched to the question's.
    """
    asked = normalise(question).split()
    words = text.split()
    keys = [normalise(w) for w in words]
    blocks = difflib.SequenceMatcher(a=asked, b=keys, autojunk=False).get_matching_blocks()
    end = max((b.b + b.size for b in blocks if b.size), default=0)
    return " ".join(words[end:]).strip()


def worth_spotting(text: str) -> bool:
    """Whether ``text`` heard over a reply could be a mangled stop request: a few words, not stop."""
    return judge(text) is OverlapVerdict.BARGE_IN and len(normalise(text).split()) <= MAX_STOP_WORDS


def stop_candidates(text: str) -> list[str]:
    """The :data:`SPOT_CANDIDATES` phrases of :data:`SPOTTED_STOPS` closest in letters to ``text``.

    A mangled request keeps most of its letters ("Please up", "Please come." -> "Please stop.";
    "Hold up" -> "Hold on."), so only these are scored.
    """
    words = normalise(text)

    def closeness(stop: str) -> float:
        return difflib.SequenceMatcher(a=words, b=normalise(stop), autojunk=False).ratio()

    return sorted(SPOTTED_STOPS, key=closeness, reverse=True)[:SPOT_CANDIDATES]


def spotted_stop(heard: float, stops: dict[str, float]) -> str | None:
    """The stop phrase that was said, from the scores of forced decoding, or ``None``.

    ``heard``: the mean log-probability a token of the words Whisper wrote; ``stops``: stop
    phrases' scores. A stop phrase within :data:`STOP_SPOT_MARGIN` of the words was as likely
    what the audio said.
    """
    best = max(stops, key=stops.__getitem__, default=None)
    return best if best is not None and stops[best] >= heard - STOP_SPOT_MARGIN else None


def starts_with_stop(text: str) -> bool:
    """Whether the words open with a request to stop ("Stop. What is ...", "wait, no ...").

    Such words interrupt; they are never the rest of the question.
    """
    words = normalise(text).replace("'", "").split()
    return any(words[: len(stop.split())] == stop.replace("'", "").split() for stop in STOPS)


def _ends_with_stop(words: str) -> bool:
    """Whether short words end with a request to stop ("please stop", "no, wait", "the end is top").

    A lone "up" ends a stop request only after a polite word ("please up": "please stop" with
    its "st" taken by the canceller, seen on the echo rig where forced decoding then scored
    "Please stop." more than :data:`STOP_SPOT_MARGIN` below it); "hurry up" is not one.
    """
    parts = words.replace("'", "").split()
    if parts[-1:] == ["up"] and len(parts) > 1 and set(parts[:-1]) <= POLITE:
        return True
    return any(parts[-len(stop.split()) :] == stop.replace("'", "").split() for stop in STOPS if stop != "up")


def _all_backchannel(words: str) -> bool:
    """Whether ``words`` is only backchannels ("oh okay", "yeah yeah", "mm hmm right")."""
    parts = words.split()
    if len(parts) > MAX_BACKCHANNEL_WORDS:
        return False
    i = 0
    while i < len(parts):
        pair = " ".join(parts[i : i + 2])
        if " ".join(parts[i : i + 4]) in BACKCHANNELS:
            i += 4
        elif " ".join(parts[i : i + 3]) in BACKCHANNELS:
            i += 3
        elif pair in BACKCHANNELS:
            i += 2
        elif parts[i] in BACKCHANNELS:
            i += 1
        else:
            return False
    return True


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
            follow = self.handle(ov.pending, now_ns)
            continued = any(isinstance(a, ContinueTurn) and a.hold for a in actions)
            if continued and joined is not None and _same_speech(ov.judged, ov.pending):
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
        if isinstance(event, OnsetEnded) and not ov.ignored:
            # Too short to be a turn: a cough, a click, or a short "stop". Its words decide.
            ov.pending = event
            return [] if ov.judging else self._judge(ov)
        return []

    def _judge(self, ov: Overlap) -> list[Action]:
        assert isinstance(ov.pending, SpeechPaused | SpeechEnded | OnsetEnded)
        ov.judging, ov.judged = True, ov.pending
        # In the window the speech may be the rest of the reply's question (held, unless the
        # endpointer joined it to that turn already): judge it joined to the question.
        joined_with = ov.attempt if ov.continuation and not ov.rejoined else 0
        return [Judge(ov.turn_id, ov.pending.audio, joined_with)]


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
