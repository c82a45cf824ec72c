"""Speech over a playing reply: what it was, from its words.

The turn engine pauses a reply when speech begins over it, then asks what the speech was once
it has a transcript (docs/voice.md, "Full duplex"). :func:`judge` is that decision in words
alone: no words (a cough, a click), a backchannel ("mm-hmm", "yeah": the listener is
listening), a request to stop, or words that take the floor. Whether words continue the
question or start a new one depends on when they began, which the engine knows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from assistant.events import OverlapVerdict

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
        # eats the "s" and tiny.en writes "Top." (measured on the echo rig).
        "top", "top talking", "top it",
    }
)  # fmt: skip
MAX_BACKCHANNEL_WORDS = 4  # "oh okay yeah right": longer is more than listening
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
    if _all_backchannel(words):
        return OverlapVerdict.BACKCHANNEL
    return OverlapVerdict.BARGE_IN


def starts_with_stop(text: str) -> bool:
    """Whether the words open with a request to stop ("Stop. What is ...", "wait, no ...").

    Such words interrupt; they are never the rest of the question.
    """
    words = normalise(text).replace("'", "").split()
    return any(words[: len(stop.split())] == stop.replace("'", "").split() for stop in STOPS)


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
