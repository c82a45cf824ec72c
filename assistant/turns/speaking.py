"""Speaking one reply: a TTS thread renders each sentence and plays it while the rest is generated.

It plays only what the turn's :class:`~assistant.turns.protocols.ReplyGate` allows (nothing of a
speculative reply before it is confirmed, nothing once the user has taken the floor), notes a
lost output device instead of raising, and knows how much of the reply the user heard.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from assistant.events import AudioReady, AudioStarted, Event
from assistant.stages.audio import SAMPLE_RATE_HZ, AudioSink
from assistant.stages.devices import DeviceLostError
from assistant.turns.protocols import ReplyGate, Synthesizes

POLL_S = 0.05  # how often the wait for the end of playback looks at cancel and the device


class ReplyAudio:
    """One reply's speech on its own thread: :meth:`say` each sentence, then :meth:`close`."""

    def __init__(
        self,
        turn: int,
        synthesizer: Synthesizes,
        sink: AudioSink,
        cancel: threading.Event,
        gate: ReplyGate,
        emit: Callable[[Event], None],
    ) -> None:
        self.turn = turn
        self.synthesizer = synthesizer
        self.sink = sink
        self.cancel = cancel
        self.gate = gate
        self.emit = emit
        self.sentences: queue.Queue[tuple[int, str] | None] = queue.Queue()
        self.spoken: list[tuple[str, int, int]] = []  # (sentence, turn-relative first sample, samples)
        self.lost = ""  # why the sink failed (DeviceLostError), from either thread
        self.losses_at_start: int | None = None  # the sink's loss count when this reply first played
        self.said = 0  # sentences given to :meth:`say`
        self.started = False  # ``AudioStarted`` was emitted
        self.rendered = 0  # of those, rendered and queued on the sink (or dropped)
        self.thread = threading.Thread(target=self._run, name=f"tts-turn-{turn}")

    def start(self) -> None:
        """Start the TTS thread (:meth:`close` joins it)."""
        self.thread.start()

    def say(self, index: int, sentence: str) -> None:
        """Speak ``sentence`` (the reply's ``index``-th) after those before it."""
        self.said += 1
        self.sentences.put((index, sentence))

    def left_to_play_ms(self) -> float | None:
        """How much of the reply is left to play, once it plays in real time and nothing is rendering.

        ``None`` before its first sample played, while a sentence is being rendered, and for a
        sink that does not play in real time (a file).
        """
        if self.rendered < self.said or self.turn not in self.sink.first_audio_t_ns:
            return None
        return self.sink.queued_ms()

    def close(self) -> None:
        """No more sentences: let the thread finish rendering and join it."""
        self.sentences.put(None)
        self.thread.join()

    def finish_playing(self) -> str:
        """Wait until the sink has played the reply, or the turn was cancelled; why it was lost, or ''.

        A cancelled or lost reply's queued audio is dropped. Emits ``AudioStarted`` (the time
        the sink played the reply's first sample) if the TTS thread has not yet.
        """
        sink = self.sink
        try:
            while not self.cancel.is_set() and not self.lost and not sink.wait(POLL_S):
                pass
        except DeviceLostError as e:
            self.lost = str(e)
        if not self.lost and self.losses_at_start is not None and sink.losses != self.losses_at_start:
            # Lost and reopened between two looks: what was queued was dropped.
            self.lost = "the output device was lost and reopened during the reply"
        if self.cancel.is_set() or self.lost:
            sink.stop()
        self._note_started()
        return self.lost

    def heard(self) -> str:
        """The reply as far as it was played; a partly played sentence keeps its played words."""
        played = self.sink.played_samples.get(self.turn, 0)
        words: list[str] = []
        for sentence, start, size in self.spoken:
            if played >= start + size:
                words.append(sentence)
            elif played > start:
                parts = sentence.split()
                words.append(" ".join(parts[: int(len(parts) * (played - start) / size)]))
        return " ".join(w for w in words if w)

    def _note_started(self) -> None:
        """Emit ``AudioStarted`` once the sink has played the reply's first sample (once)."""
        first = self.sink.first_audio_t_ns.get(self.turn)
        if first and not self.started:
            self.started = True
            self.emit(AudioStarted(self.turn, first))

    def _next(self) -> tuple[int, str] | None:
        """The next sentence to speak; while waiting for it, tell when the first sample played.

        So the live breakdown shows voice-to-voice once the user hears the reply, not after
        the whole reply has played.
        """
        while True:
            self._note_started()
            try:
                return self.sentences.get(timeout=POLL_S)
            except queue.Empty:
                pass

    def _run(self) -> None:
        """Render and play each sentence; each piece plays as soon as it is rendered."""
        offset = 0
        while (item := self._next()) is not None:
            if not (self.cancel.is_set() or self.gate.discarded or self.lost):  # else drain, unspoken
                offset += self._speak(*item, offset)
            self.rendered += 1

    def _speak(self, index: int, sentence: str, offset: int) -> int:
        """Render and play one sentence from sample ``offset`` of the reply; how much of it played."""
        played = 0
        # Piper renders a piece per sentence it finds; a cancelled reply renders no further piece.
        for part, audio in enumerate(self.synthesizer.stream(sentence)):
            ms = 1000 * audio.size / SAMPLE_RATE_HZ
            self.emit(AudioReady(self.turn, time.monotonic_ns(), index, ms, part))
            if not self.gate.wait(self.cancel) or self.cancel.is_set() or not self.gate.may_play():
                break
            if self.losses_at_start is None:
                self.losses_at_start = self.sink.losses
            try:
                self.sink.play(self.turn, audio)
            except DeviceLostError as e:
                self.lost = str(e)
                break
            played += audio.size
            self._note_started()
        if played:
            self.spoken.append((sentence, offset, played))
        return played
