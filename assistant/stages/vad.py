"""Streaming endpointing with the Silero VAD v6 model that ships inside faster-whisper."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from assistant.config.sections import VadOptions
from assistant.events import (
    Event,
    OnsetEnded,
    SpeechEnded,
    SpeechOnset,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    TurnDecision,
)
from assistant.stages.silero import CHUNK_MS, CHUNK_NS, CHUNK_SAMPLES, SileroStream
from assistant.stages.streams import SAMPLE_RATE_HZ

CUT_CONTEXT_S = 8  # audio before a length cut that the end-of-turn policy still hears (Smart Turn reads 8 s)
QUIET_SPAN_CHUNKS = 3  # a chunk's quietness: mean energy of it and its neighbours (96 ms, not a stop gap)


class _Closed(NamedTuple):
    """The last turn's utterance, kept until sealed: later speech may still join it."""

    turn_id: int
    chunks: list[np.ndarray]
    flags: list[bool]
    after_cut: bool
    context: list[np.ndarray]


class EndOfTurn(Protocol):
    """Decides, during a pause, whether the speaker is done (:mod:`assistant.stages.endpoint`: the model)."""

    pause_ms: int

    def decide(
        self, turn_id: int, audio: Callable[[], np.ndarray], silence_ms: float, t_ns: int
    ) -> TurnDecision | None:
        """A decision event when it looked at the pause now (``complete`` ends the turn), else None.

        ``audio()`` returns the utterance so far; ``t_ns`` is when its last chunk was captured.
        """
        ...

    def reset(self, paused_t_ns: int = 0) -> None:
        """A new pause begins (its ``SpeechPaused`` at ``paused_t_ns``)."""
        ...

    def transcribed(self, paused_t_ns: int, text: str) -> None:
        """The speculative transcript of the pause at ``paused_t_ns`` (called from any thread)."""
        ...


@dataclass
class FixedSilence:
    """Today's rule: the turn ends after ``end_silence_ms`` of silence, whatever was said."""

    end_silence_ms: int
    pause_ms: int = 200

    def decide(
        self, turn_id: int, audio: Callable[[], np.ndarray], silence_ms: float, t_ns: int
    ) -> TurnDecision | None:
        """Complete once the silence is long enough; nothing to say before."""
        if silence_ms < self.end_silence_ms:
            return None
        return TurnDecision(turn_id, t_ns, True, None, 0.0, silence_ms, "fixed silence")

    def reset(self, paused_t_ns: int = 0) -> None:
        """Nothing to forget."""

    def transcribed(self, paused_t_ns: int, text: str) -> None:
        """Silence alone decides."""


def quiet_cut(chunks: list[np.ndarray], search_ms: float) -> int:
    """How many chunks to keep: through the quietest one among the last ``search_ms``.

    Quietness is the mean energy of a chunk and its neighbours, so the pause between two
    words wins over the short closure before a "t" or "k"; the newest chunk cannot be a
    candidate (no neighbour after it), so with no search window the cut is at the limit.
    """
    n = len(chunks)
    search = min(round(search_ms / CHUNK_MS), n - 2)
    if search < 1:
        return n
    lo = n - 2 - search  # candidates lo+1 .. n-2, each with a neighbour on both sides
    energy = [float(np.mean(np.square(c, dtype=np.float64))) for c in chunks[lo:]]
    quiet = np.convolve(energy, np.ones(QUIET_SPAN_CHUNKS), "valid")  # quiet[j]: chunk lo+j+1
    return lo + int(np.argmin(quiet)) + 2  # keep through the quietest chunk


class ChunkFeeder:
    """Cuts a stream of 16 kHz samples into 32 ms chunks, each with the time it ended.

    Feed it any number of samples with the monotonic time at which the last of them was
    captured; each complete chunk goes to :meth:`_step`, the rest waits for the next feed.
    """

    def __init__(self) -> None:
        self.pending = np.zeros(0, np.float32)

    def feed(self, samples: np.ndarray, t_ns: int) -> list[Event]:
        """Add samples (float32 mono 16 kHz) captured up to ``t_ns``; return finished events."""
        self.pending = np.concatenate([self.pending, samples.astype(np.float32, copy=False)])
        n_chunks = self.pending.size // CHUNK_SAMPLES
        events: list[Event] = []
        # Time of the end of each complete chunk, counting back from the newest sample.
        t_first_end = t_ns - (self.pending.size - CHUNK_SAMPLES) * 1_000_000_000 // SAMPLE_RATE_HZ
        for i in range(n_chunks):
            chunk = self.pending[i * CHUNK_SAMPLES : (i + 1) * CHUNK_SAMPLES]
            events.extend(self._step(chunk, t_first_end + i * CHUNK_NS))
        self.pending = self.pending[n_chunks * CHUNK_SAMPLES :].copy()
        return events

    def feed_recording(self, audio: np.ndarray, t0_ns: int = 0, block: int = CHUNK_SAMPLES) -> list[Event]:
        """Feed a whole recording in ``block``-sample pieces, as if captured from ``t0_ns`` on."""
        events: list[Event] = []
        for start in range(0, audio.size, block):
            piece = audio[start : start + block]
            t_ns = t0_ns + (start + piece.size) * 1_000_000_000 // SAMPLE_RATE_HZ
            events.extend(self.feed(piece, t_ns))
        return events

    def _step(self, chunk: np.ndarray, t_end_ns: int) -> list[Event]:
        """The events of one chunk that ended at ``t_end_ns`` (the subclass's work)."""
        raise NotImplementedError


class Endpointer(ChunkFeeder):
    """Turns a stream of 16 kHz samples into speech events.

    It runs the VAD per 32 ms chunk (:class:`ChunkFeeder`) and keeps its own buffers. Events:
    ``SpeechOnset`` (``onset_ms`` of speech), ``SpeechStarted`` (``min_speech_ms``: a turn), ``SpeechPaused``
    (``pause_ms`` of silence, at most the policy's), ``TurnDecision`` (the policy looked), ``SpeechResumed``
    (speech again after a pause, ``onset_ms`` long), ``SpeechEnded`` (the policy said the
    turn is complete, or ``max_utterance_s`` cut it: ``cut``) and ``OnsetEnded`` (an onset that
    ended before it was long enough to be a turn). Until :meth:`seal` is called, speech
    after ``SpeechEnded`` continues that turn (``SpeechResumed(after_endpoint=True)``): the
    reply has not started, so the user has not been answered yet.

    A length cut falls at a quiet chunk near the limit; the audio after it opens the next turn
    (``SpeechStarted`` at the cut), whose ``SpeechPaused``/``SpeechEnded`` say ``after_cut``.
    Silence under way at the cut still counts towards that turn's end, and its end-of-turn
    policy hears the last :data:`CUT_CONTEXT_S` before the cut too.

    While :attr:`over_reply` is set (a reply plays and the microphone is heard over it) speech
    begins at ``over_reply_threshold`` rather than ``threshold``.
    """

    def __init__(
        self,
        options: VadOptions,
        model: SileroStream | None = None,
        policy: EndOfTurn | None = None,
        pause_ms: int | None = None,
    ) -> None:
        super().__init__()
        self.options = options
        self.model = model or SileroStream()
        self.policy: EndOfTurn = policy or FixedSilence(options.end_silence_ms)
        # SpeechPaused (where speculation starts) may come before the policy's first look.
        self.pause_ms = min(pause_ms or self.policy.pause_ms, self.policy.pause_ms)
        pre_chunks = max(1, options.pre_roll_ms * SAMPLE_RATE_HZ // 1000 // CHUNK_SAMPLES)
        self.pre_roll: deque[np.ndarray] = deque(maxlen=pre_chunks)
        self.next_turn_id = 1
        self.closed: _Closed | None = None  # the last turn, until sealed
        self.over_reply = False
        self._reset_utterance()

    def _reset_utterance(self) -> None:
        self.in_speech = False
        self.turn_id = 0  # non-zero once the speech is long enough to be a turn
        self.chunks: list[np.ndarray] = []
        self.flags: list[bool] = []  # per chunk: did the VAD call it speech
        self.after_cut = False  # this utterance continues one cut at max_utterance_s
        self.context: list[np.ndarray] = []  # the cut utterance's end, for the end-of-turn policy
        self.speech_chunks = 0
        self.silence_chunks = 0
        self.onset_sent = False
        self.onset_t_ns = 0
        self.last_speech_t_ns = 0
        self.paused = False  # SpeechPaused was sent for the silence under way
        self.resume_run = 0  # speech chunks in a row since the pause
        self.rejoined = False  # the turn had ended once; this speech went on after its endpoint

    def reset(self) -> None:
        """Drop any partial utterance and VAD state (e.g. after the mic was muted)."""
        self.model.reset()
        self.pending = np.zeros(0, np.float32)
        self.pre_roll.clear()
        self.closed = None
        self._reset_utterance()

    def close(self, t_ns: int) -> SpeechEnded | None:
        """The microphone stops being heard: the speech in progress is forgotten (:meth:`reset`).

        Unless it went on after its turn's endpoint (``SpeechResumed`` ``after_endpoint``):
        that turn was heard to an end once, so it ends here with all of it (returned), rather
        than lose the whole question. A UI check: a question ended while the reply before it
        was cut, the next reply's echo reopened it, the echo path moved and the microphone
        closed, and the question was dropped ("not heard").
        """
        ended = None
        if self.rejoined and self.turn_id:
            audio = self._audio()
            ended = SpeechEnded(self.turn_id, t_ns, self.last_speech_t_ns, audio, after_cut=self.after_cut)
        self.reset()
        return ended

    def seal(self) -> None:
        """The last turn is being answered aloud: later speech starts a new turn."""
        self.closed = None

    def _audio(self) -> np.ndarray:
        """The utterance for ASR: empty when it only continues a cut and holds no speech."""
        if self.after_cut and not any(self.flags):
            return np.zeros(0, np.float32)  # silence alone would only invite Whisper to invent words
        return np.concatenate(self.chunks)

    def _policy_audio(self) -> np.ndarray:
        """What the end-of-turn policy hears: the utterance, after a cut with the audio before it."""
        return np.concatenate(self.context + self.chunks)

    def _step(self, chunk: np.ndarray, t_end_ns: int) -> list[Event]:
        opts = self.options
        prob = self.model(chunk)
        threshold = opts.over_reply_threshold if self.over_reply else opts.threshold
        speech = prob >= threshold or (self.in_speech and prob >= opts.neg_threshold)
        if not self.in_speech:
            if not speech:
                self.pre_roll.append(chunk)
                return []
            self.in_speech = True
            self.onset_t_ns = t_end_ns - CHUNK_NS
            self.chunks = list(self.pre_roll)
            self.flags = [False] * len(self.chunks)
        self.chunks.append(chunk)
        self.flags.append(speech)
        events: list[Event] = []
        onset_chunks = max(1, round(opts.onset_ms / CHUNK_MS))
        if speech and self.paused:  # maybe the user goes on; a breath or click must not count
            self.resume_run += 1
            self.silence_chunks += 1
            if self.resume_run >= onset_chunks:
                self.paused = False
                self.silence_chunks = 0
                self.speech_chunks += self.resume_run
                self.last_speech_t_ns = t_end_ns
                events.append(SpeechResumed(self.turn_id, t_end_ns))
        elif speech:
            self.speech_chunks += 1
            self.silence_chunks = 0
            self.resume_run = 0
            self.last_speech_t_ns = t_end_ns
        else:
            self.silence_chunks += 1
            self.resume_run = 0
        if not self.onset_sent and self.speech_chunks >= onset_chunks:
            self.onset_sent = True
            if self.closed is not None and not self.turn_id:
                # The last turn was not answered aloud yet: this speech is the rest of it.
                closed, self.closed = self.closed, None
                self.turn_id, self.after_cut, self.context = closed.turn_id, closed.after_cut, closed.context
                self.chunks = closed.chunks + self.chunks
                self.flags = closed.flags + self.flags
                self.rejoined = True
                events.append(SpeechResumed(closed.turn_id, t_end_ns, after_endpoint=True))
            else:
                events.append(SpeechOnset(self.turn_id or self.next_turn_id, t_end_ns, self.onset_t_ns))
        if not self.turn_id and self.speech_chunks * CHUNK_NS >= opts.min_speech_ms * 1_000_000:
            # Long enough not to be a click or a cough: from here on it is a turn.
            self.turn_id = self._start_turn(self.onset_t_ns, events)
        if self._decide(t_end_ns, events):
            if self.turn_id:
                end_t_ns = events[-1].t_ns  # the decision's: it includes the model's inference
                turn, speech_end, audio = self.turn_id, self.last_speech_t_ns, self._audio()
                events.append(SpeechEnded(turn, end_t_ns, speech_end, audio, after_cut=self.after_cut))
                self.closed = _Closed(turn, list(self.chunks), list(self.flags), self.after_cut, self.context)
            elif self.onset_sent:  # a click or a cough, over: whatever its onset paused may go on
                events.append(OnsetEnded(self.next_turn_id, t_end_ns, np.concatenate(self.chunks)))
            self._reset_utterance()
            self.pre_roll.clear()
        elif len(self.chunks) * CHUNK_NS >= opts.max_utterance_s * 1e9:
            self._cut(t_end_ns, events)
        return events

    def _cut(self, t_end_ns: int, events: list[Event]) -> None:
        """End the utterance at its quietest recent chunk; the rest opens the next turn at once."""
        keep = quiet_cut(self.chunks, self.options.cut_search_ms)
        rest, rest_flags = self.chunks[keep:], self.flags[keep:]
        cut_t_ns = t_end_ns - len(rest) * CHUNK_NS  # when the last kept sample was captured
        turn = self.turn_id
        if turn:
            self.chunks, self.flags = self.chunks[:keep], self.flags[:keep]
            speech_end = min(self.last_speech_t_ns, cut_t_ns)
            audio = self._audio()
            events.append(SpeechEnded(turn, t_end_ns, speech_end, audio, cut=True, after_cut=self.after_cut))
        context = (self.context + self.chunks)[-round(CUT_CONTEXT_S * 1e9 / CHUNK_NS) :]
        # Silence under way goes on counting: the user has been quiet that long already.
        silence = 0 if self.resume_run else self.silence_chunks
        last_speech_t_ns = self.last_speech_t_ns
        self._reset_utterance()
        self.pre_roll.clear()
        self.in_speech = self.onset_sent = True
        self.after_cut = bool(turn)  # a cut before the speech made a turn (clicks) joins nothing
        self.context = context if turn else []
        self.chunks, self.flags = rest, rest_flags
        self.speech_chunks = sum(rest_flags)
        self.silence_chunks = silence
        self.onset_t_ns, self.last_speech_t_ns = cut_t_ns, last_speech_t_ns
        self.turn_id = self._start_turn(cut_t_ns, events)

    def _decide(self, t_end_ns: int, events: list[Event]) -> bool:
        """Whether the silence under way ends the utterance (pausing and asking the policy)."""
        silence_ms = self.silence_chunks * CHUNK_MS
        if not self.silence_chunks:
            return False
        if not self.turn_id:  # a click or a cough: gone after the usual silence
            return silence_ms >= self.options.end_silence_ms
        if not self.paused and silence_ms >= self.pause_ms:
            self.paused = True
            self.policy.reset(t_end_ns)
            audio = self._audio()
            speech_end = self.last_speech_t_ns
            events.append(SpeechPaused(self.turn_id, t_end_ns, speech_end, audio, after_cut=self.after_cut))
        decision = self.policy.decide(self.turn_id, self._policy_audio, silence_ms, t_end_ns)
        if decision is None:
            return False
        events.append(decision)
        return decision.complete

    def _start_turn(self, onset_t_ns: int, events: list[Event]) -> int:
        turn = self.next_turn_id
        self.next_turn_id += 1
        events.append(SpeechStarted(turn, onset_t_ns))
        return turn
