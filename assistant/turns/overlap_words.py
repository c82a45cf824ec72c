"""What words heard over a playing reply are: no words, a backchannel, a request to stop, or words.

:func:`judge` decides in words alone (docs/voice.md, "Full duplex"); the turn engine's rules
for speech over a reply (:mod:`assistant.turns.overlap`) decide what follows from it and from
when the speech began. Here too: stop phrases scored against mangled words
(:func:`spotted_stop`) and the rest of a question transcribed joined to it (:func:`rest_after`).
"""

from __future__ import annotations

import difflib
import re

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
        # Asking it to go on is listening too: the reply resumes ("Go on." was answered as a
        # question, or scored as "Hold on." and stopped, over the reply on the echo rig).
        "go on", "keep going", "continue", "carry on", "go ahead", "please continue",
        "continue please", "please go on", "go on please", "please go ahead",
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
_STOP_PARTS = [stop.replace("'", "").split() for stop in STOPS]  # each as words, apostrophes dropped
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
    return any(words[: len(stop)] == stop for stop in _STOP_PARTS)


def _ends_with_stop(words: str) -> bool:
    """Whether short words end with a request to stop ("please stop", "no, wait", "the end is top").

    A lone "up" ends a stop request only after a polite word ("please up": "please stop" with
    its "st" taken by the canceller, seen on the echo rig where forced decoding then scored
    "Please stop." more than :data:`STOP_SPOT_MARGIN` below it); "hurry up" is not one.
    """
    parts = words.replace("'", "").split()
    if parts[-1:] == ["up"] and len(parts) > 1 and set(parts[:-1]) <= POLITE:
        return True
    return any(parts[-len(stop) :] == stop for stop in _STOP_PARTS if stop != ["up"])


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
