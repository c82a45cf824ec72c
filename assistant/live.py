"""The live loop: microphone -> endpointer -> turns, one at a time, with barge-in.

Owns the capture thread and the turn thread; ``stop()`` joins both.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from assistant.audio import Microphone
from assistant.events import BargeIn, MicLevel, SpeechEnded, SpeechOnset, SpeechStarted
from assistant.pipeline import AudioSink, VoicePipeline
from assistant.vad import Endpointer


class LiveLoop:
    """Microphone -> endpointer -> turns, on one owned capture thread plus one turn at a time.

    ``listening`` and ``muted`` gate the microphone (both must allow it); ``on_level``
    receives a ``MicLevel`` about every 100 ms while capturing. Typed messages go through
    ``submit_text`` so that they take turns with spoken ones. Without a microphone (and
    endpointer) only typed turns run; without a speaker replies are not spoken.
    """

    def __init__(
        self,
        pipeline: VoicePipeline,
        microphone: Microphone | None,
        speaker: AudioSink | None,
        endpointer: Endpointer | None,
        on_level: Callable[[MicLevel], None] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.mic = microphone
        self.speaker = speaker
        self.endpointer = endpointer
        self.on_level = on_level
        self.listening = True
        self.muted = False
        self.stop_event = threading.Event()
        self.turn_cancel = threading.Event()
        self.turn_thread: threading.Thread | None = None
        self.current_turn = 0
        self._ids = threading.Lock()
        self._next_id = 1  # without an endpointer, turn ids come from here
        self.capture_thread = threading.Thread(target=self._capture, name="capture")

    def start(self) -> None:
        """Start capturing (``stop()`` ends and joins everything)."""
        if self.mic is not None and self.endpointer is not None:
            self.mic.start()
            self.capture_thread.start()

    def busy(self) -> bool:
        """Whether a turn is being answered."""
        return self.turn_thread is not None and self.turn_thread.is_alive()

    def claim_turn_id(self) -> int:
        """A fresh turn id for a turn that does not come from the microphone."""
        with self._ids:
            if self.endpointer is None:
                self._next_id += 1
                return self._next_id - 1
            turn = self.endpointer.next_turn_id
            self.endpointer.next_turn_id += 1
            return turn

    def _capture(self) -> None:
        assert self.mic is not None and self.endpointer is not None  # start() checked
        gated = False
        level_due_ns = 0
        while not self.stop_event.is_set():
            block = self.mic.read(0.1)
            if block is None:
                continue
            if self.on_level is not None and block[1] >= level_due_ns:
                level_due_ns = block[1] + 100_000_000
                rms = float(np.sqrt(np.mean(np.square(block[0])))) if block[0].size else 0.0
                self.on_level(MicLevel(self.current_turn, block[1], 20 * np.log10(max(rms, 1e-6))))
            closed = self.muted or not self.listening
            if closed or (self.busy() and not self.pipeline.options.barge_in):
                gated = True  # muted, or the assistant is speaking: do not listen to ourselves
                continue
            if gated:
                gated = False
                self.endpointer.reset()
                self.mic.drain()
                continue
            with self._ids:
                events = self.endpointer.feed(*block)
            for event in events:
                if isinstance(event, SpeechOnset | SpeechStarted) and self.busy():
                    self._barge_in(event)
                self.pipeline.emit(event)
                if isinstance(event, SpeechEnded):
                    self._start_turn(event.turn_id, self.pipeline.run_turn, event)

    def _barge_in(self, event: SpeechOnset | SpeechStarted) -> None:
        """Stop generation and playback of the turn being answered, now."""
        if self.turn_cancel.is_set():
            return
        self.turn_cancel.set()
        if self.speaker is not None:
            self.speaker.stop()
        onset = event.onset_t_ns if isinstance(event, SpeechOnset) else event.t_ns
        latency_s = getattr(getattr(self.speaker, "stream", None), "latency", 0.0)
        latency_ms = 1000.0 * float(latency_s or 0.0)
        self.pipeline.emit(BargeIn(self.current_turn, time.monotonic_ns(), onset, latency_ms))

    def submit_text(self, text: str) -> int:
        """Answer a typed message after the turn in progress; returns its turn id."""
        turn = self.claim_turn_id()
        self._start_turn(turn, lambda t, s, c: self.pipeline.run_text_turn(turn, t, s, c), text)
        return turn

    def submit_speech(self, audio: np.ndarray, endpointing_ms: float) -> int:
        """Answer recorded speech (a WAV file) as if just spoken; returns its turn id.

        Its speech end is placed ``endpointing_ms`` (the VAD's measured delay) before now.
        """
        turn = self.claim_turn_id()
        now = time.monotonic_ns()
        utterance = SpeechEnded(turn, now, now - int(endpointing_ms * 1e6), audio)
        self._start_turn(turn, self.pipeline.run_turn, utterance)
        return turn

    def _start_turn(self, turn: int, target: Callable[..., object], first: object) -> None:
        if self.turn_thread is not None:
            self.turn_thread.join()
        self.turn_cancel = threading.Event()
        self.current_turn = turn
        self.turn_thread = threading.Thread(
            target=target, args=(first, self.speaker, self.turn_cancel), name=f"turn-{turn}"
        )
        self.turn_thread.start()

    def interrupt(self) -> None:
        """Stop the reply being generated or spoken (the part heard stays in the history)."""
        self.turn_cancel.set()
        if self.speaker is not None:
            self.speaker.stop()

    def stop(self) -> None:
        """Cancel the turn in progress, stop playback, join every thread."""
        self.stop_event.set()
        self.turn_cancel.set()
        if self.speaker is not None:
            self.speaker.stop()
        if self.capture_thread.is_alive():
            self.capture_thread.join()
        if self.turn_thread is not None:
            self.turn_thread.join()
