"""The turns' ASR: one transcription at a time, held speech, partial and overlap words.

A turn's own transcription, the live display's partial transcripts (``partial-asr``) and the
words of speech over a reply (``overlap-asr``) share one Whisper model under :attr:`Hearing.lock`.
Speech cut for length, or a question the user went on with after its reply began, is held
(:class:`HeldSpeech`) and answered with the next turn, as one question.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from assistant.events import Event, OverlapVerdict, PartialTranscript, TurnHeld
from assistant.stages.asr import TranscriptResult, first_clip_end
from assistant.stages.vad import SAMPLE_RATE_HZ
from assistant.turns.overlap_words import judge, rest_after, spotted_stop, stop_candidates, worth_spotting
from assistant.turns.protocols import HeldSpeech, Said, Transcribes

logger = logging.getLogger(__name__)

CONTINUATION_GAP_SAMPLES = SAMPLE_RATE_HZ * 3 // 10  # 0.3 s between a question and its rest
OVERLAP_NO_SPEECH = 0.8  # Whisper's no-speech probability above which speech over a reply had no words


class Hearing:
    """Transcribes turns with ``transcriber`` and keeps the speech held for the next turn.

    ``held`` is touched by the turn threads only, one turn at a time; the partial and overlap
    threads touch only the lock and :meth:`started` turns.
    """

    def __init__(self, transcriber: Transcribes, emit: Callable[[Event], None]) -> None:
        self.transcriber = transcriber
        self.emit = emit
        self.lock = threading.Lock()  # one transcription at a time: a turn's, or a partial one
        self._transcribing: set[int] = set()  # turns whose own ASR has started
        self.held = HeldSpeech()

    def started(self, turn: int) -> None:
        """``turn``'s own ASR begins: a partial transcript finishing now would be stale."""
        self._transcribing.add(turn)

    def finished(self, turn: int) -> None:
        """``turn`` is answered, held or discarded: partial transcripts of later speech again."""
        self._transcribing.discard(turn)

    def transcribe(
        self, audio: np.ndarray, heard: TranscriptResult | None = None
    ) -> tuple[TranscriptResult, str, HeldSpeech, np.ndarray]:
        """A turn's words with the held speech before them.

        Returns the result, the whole text (held clips first), the held speech it answers and
        the audio transcribed (held audio + ``audio``). ``heard``: the transcript of the held
        question joined to ``audio`` (the judge's pass over the reply, the same decoding as
        this one): used when a continued question is held, and then no ASR pass runs.
        """
        held = self.held
        if heard is not None and held.continued:
            return heard, heard.text.strip(), held, np.concatenate([held.audio, audio])
        if held.turns:
            audio = np.concatenate([held.audio, audio])
        with self.lock:
            result = self.transcriber.transcribe(audio, long_form=bool(held.turns) and not held.continued)
        return result, " ".join([*held.texts, result.text.strip()]).strip(), held, audio

    def answered(self, held: HeldSpeech) -> None:
        """The held speech ``held`` was answered: the next long utterance starts afresh."""
        if self.held is held:
            self.held = HeldSpeech()

    def continue_with(self, turn: int, audio: np.ndarray) -> None:
        """The user went on after ``turn``'s reply began: its speech is answered with the rest."""
        self.held = HeldSpeech([turn], [], joined(audio, np.zeros(0, np.float32)), continued=True)

    def hold(self, turn: int, audio: np.ndarray) -> None:
        """Keep a turn cut for length; transcribe the held speech's clips that became final."""
        held = self.held
        held.turns.append(turn)
        held.audio = np.concatenate([held.audio, audio])
        while (end := first_clip_end(held.audio)) is not None:
            with self.lock:
                result = self.transcriber.transcribe(held.audio[:end], long_form=True)
            if text := result.text.strip():
                held.texts.append(text)
            held.audio = held.audio[end:]
        self.finished(turn)
        pending_ms = 1000.0 * held.audio.size / SAMPLE_RATE_HZ
        self.emit(TurnHeld(turn, time.monotonic_ns(), " ".join(held.texts), pending_ms))

    def drop_held(self) -> list[int]:
        """Forget the held speech (the microphone was lost mid-utterance); returns its turns."""
        held, self.held = self.held, HeldSpeech()
        return held.turns

    def partial_transcript(self, turn: int, audio: np.ndarray) -> None:
        """Transcribe the utterance in progress for the live display (``PartialTranscript``).

        Skipped when the turn's own ASR holds the model: the final answer never waits for it
        to start (at most for one partial already running).
        """
        if not self.lock.acquire(blocking=False):
            return
        try:
            result = self.transcriber.transcribe(audio, partial=True)
        finally:
            self.lock.release()
        text = result.text.strip()
        if text and turn not in self._transcribing:
            audio_ms = 1000 * audio.size / SAMPLE_RATE_HZ
            self.emit(PartialTranscript(turn, time.monotonic_ns(), text, audio_ms, result.asr_ms))

    def transcribe_overlap(
        self,
        audio: np.ndarray,
        said: Said | None = None,
        ungated: np.ndarray | None = None,
        short: bool = False,
        raw: np.ndarray | None = None,
    ) -> Overheard:
        """The words of speech over a reply, which decide what the speech was.

        ``said``: the question of the reply, when the speech began in the continuation window
        and may be its rest. Then the question and the speech are transcribed joined, as the
        turn would transcribe them (its beam), and the words after the question's decide (stop
        words count, phrases are not scored); when they are its rest, the joined transcript is
        the turn's (``Overheard.joined``), so it needs no pass of its own. The rest transcribed
        alone read 16.5 % WER against 10.7 % joined (``bench.asr_halves``). Else (later
        speech) greedy, on the speech alone.

        Nothing (``text`` empty) when Whisper itself doubts there was speech
        (``no_speech_prob``): a hum or a cough it would otherwise put words to. Words that
        failed Whisper's checks (left out of the text) still count when they ask to stop:
        "Please stop." over a reply on speakers came out as a doubtful "the top." and the reply
        played on. A few words that are not a stop request are scored against the stop phrases
        (:func:`~assistant.turns.overlap_words.spotted_stop`): the canceller's double-talk suppression
        turned "Please stop." into "Please come.".

        ``ungated``: the same speech with the echo removed by a linear fit alone, nothing
        suppressed (:meth:`~assistant.stages.echo_linear.EchoSpan.cleaned`). A lone "Stop."
        said over the reply has its "s" and "t" under AEC3's suppression and the residual gate,
        and tiny.en hears nothing in the rest; in the linear view it hears "Stop." (AEC3's
        output before the gate, the view before this one, read "Top." or "Up."). So when the
        gated speech has no words, the ungated speech is transcribed too, and counts only as a
        stop request: anything else in it may be the reply's leftover echo, which the gate is
        there to keep out (a resumed reply's echo, paused at a false onset, read "Tell me about
        it." and "That is it." in AEC3's ungated output). Speech too ``short`` to take the
        floor (under the rules' ``min_words_ms``) can only stop the reply or let it go on, so
        it is transcribed ungated alone, and its words count only as a stop request or a
        backchannel (not scored against the stop phrases): gated, a lone "Stop." was also heard
        as "time." (words, so not looked at again) in a user check on the echo rig; when the
        ungated words are neither, the gated ones are transcribed too and count only as a stop
        request.

        ``raw``: the same speech as the microphone heard it, given while the canceller has not
        yet converged on speech (the start of a session): its suppressor then takes the first
        syllables of words said over a reply with the echo ("how many days are in a week?" read
        "Any days are in a week."). Words that may continue the question are judged as above,
        and the question joined to ``raw`` is transcribed again for the turn (``joined``): in
        closed loop it lost 0 of 112 words where the gated speech lost 8, and 1 where it lost
        12 with the echo 10 dB louder (``bench.continuation_closed_loop``).
        """
        if ungated is not None and np.array_equal(ungated, audio):
            ungated = None  # the gate left it alone (a headset): nothing more to hear in it
        with self.lock:
            if short and said is None and ungated is not None:
                # the gated view still counts as a stop request: a lone "Stop." read "Stop."
                # there and "Scott." ungated (a Piper voice on the closed-loop bench)
                words = self._stop_in(ungated, OverlapVerdict.BACKCHANNEL) or self._stop_in(audio, gated=True)
                return Overheard(words)
            if said is not None:
                whole = self.transcriber.transcribe(joined(said.audio, audio))
                text, doubtful = rest_after(said.text, whole.text), False
                if raw is not None and judge(text) is OverlapVerdict.BARGE_IN:
                    whole = self.transcriber.transcribe(joined(said.audio, raw))  # the turn's words
            else:
                whole, result = None, self.transcriber.transcribe(audio, quick=True)
                text, doubtful = result.text.strip(), result.no_speech_prob >= OVERLAP_NO_SPEECH
                if not text and judge(result.left_out) is OverlapVerdict.STOP:
                    text = result.left_out  # a doubtful "the top." is still a request to stop
            if (doubtful or not text) and ungated is not None:
                return Overheard(self._stop_in(ungated))
            if doubtful:
                return Overheard("")
            # Scoring stop phrases is for greedy words of the speech alone, mangled under the reply
            # (measured so): the rest of a joined pass scores poorly on its fragment of audio, and
            # "who wrote", cut by a pause, was once taken for "Hold on." that way.
            if said is None and worth_spotting(text):
                candidates = stop_candidates(text)
                heard, *scores = self.transcriber.phrase_logprobs(audio, [text, *candidates])
                stops = dict(zip(candidates, scores, strict=True))
                stop = spotted_stop(heard, stops)
                best = max(stops, key=stops.__getitem__)
                logger.info(
                    "heard %r over the reply: %r scored %.2f a token against its %.2f (%s)",
                    text, best, stops[best], heard, "a stop request" if stop else "words",
                )  # fmt: skip
                if stop:
                    return Overheard(stop)
        return Overheard(text, whole)

    def _stop_in(self, audio: np.ndarray, *also: OverlapVerdict, gated: bool = False) -> str:
        """The words of ``audio`` if they ask to stop (or are ``also``), else nothing.

        ``gated``: ``audio`` is the residual gate's view (else the linear fit's), for the log.
        The caller holds the lock.
        """
        result = self.transcriber.transcribe(audio, quick=True)
        text = result.text.strip()
        verdict = judge(text)
        stop = result.no_speech_prob < OVERLAP_NO_SPEECH and verdict in (OverlapVerdict.STOP, *also)
        outcome = verdict.value if stop else "ignored"
        view = "after the residual gate" if gated else "with the echo subtracted (linear fit)"
        logger.info("heard %r over the reply %s (%s)", text, view, outcome)
        return text if stop else ""


@dataclass(frozen=True)
class Overheard:
    """What speech over a reply said (``text``), and the question joined to it (``joined``).

    ``joined`` is set when the speech was transcribed after the reply's question
    (:meth:`Hearing.transcribe_overlap`): the transcript of both, for the turn to answer.
    """

    text: str
    joined: TranscriptResult | None = None


def joined(question: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """A question and its rest as the continued turn transcribes them: 0.3 s apart."""
    return np.concatenate([question, np.zeros(CONTINUATION_GAP_SAMPLES, np.float32), rest])
