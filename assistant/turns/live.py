"""The live loop: microphone -> endpointer -> turns, with speculation, rejoining and barge-in.

Owns the capture thread, the partial-transcript thread, the device watch and the turn threads;
``stop()`` joins them all.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from assistant.events import (
    BargeIn,
    Event,
    MicLevel,
    SpeculationConfirmed,
    SpeechEnded,
    SpeechOnset,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    TurnCancelled,
)
from assistant.stages.audio import AudioSink, Microphone, Speaker
from assistant.stages.devices import DeviceLostError, DeviceWatch
from assistant.stages.endpoint import TurnOptions
from assistant.stages.vad import Endpointer
from assistant.turns.pipeline import VoicePipeline
from assistant.turns.protocols import MICROPHONE_LOST, ReplyGate


@dataclass
class _Attempt:
    """One run of the pipeline for a turn; a speculative one may be discarded."""

    turn_id: int
    thread: threading.Thread
    cancel: threading.Event
    gate: ReplyGate
    audio_started: bool = False  # the reply's first piece went to the speaker: the floor is ours


class LiveLoop:
    """Microphone -> endpointer -> turns, on one owned capture thread plus the turn threads.

    Turn taking: at the first pause (``SpeechPaused``) the turn is transcribed and its reply
    started speculatively (``TurnOptions.speculate``); speech that comes back cancels that
    work, and the end of the turn (``SpeechEnded``) confirms it. Speech that starts after the
    endpoint but before the reply's first audio joins the same turn (the pending reply is
    discarded); from the reply's first audio on, the microphone is ignored (so the assistant
    does not hear itself) unless barge-in is on, in which case speech interrupts the reply.
    A turn cut for length (``SpeechEnded.cut``: the user is still speaking) is not answered:
    its speech is held (``TurnHeld``) and answered with the turn that continues it, so nothing
    plays while the user speaks and the answer is to the whole utterance.

    ``listening`` and ``muted`` gate the microphone (both must allow it); ``on_level``
    receives a ``MicLevel`` about every 100 ms while capturing. Typed messages go through
    ``submit_text`` so that they take turns with spoken ones. Without a microphone (and
    endpointer) only typed turns run; without a speaker replies are not spoken.

    Lost devices (the sound server went away) are reported and reopened by a
    :class:`~assistant.stages.devices.DeviceWatch`. While the microphone is lost nothing is heard
    (speech in progress, and speech held from its length cuts, is dropped: ``TurnCancelled``
    ``microphone lost``); while the speaker is lost, replies are text only. Typed turns
    work throughout.
    """

    def __init__(
        self,
        pipeline: VoicePipeline,
        microphone: Microphone | None,
        speaker: AudioSink | None,
        endpointer: Endpointer | None,
        on_level: Callable[[MicLevel], None] | None = None,
        turn: TurnOptions | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.mic = microphone
        self.speaker = speaker
        self.endpointer = endpointer
        self.on_level = on_level
        self.turn = turn or TurnOptions()
        self.listening = True
        self.muted = False
        self.stop_event = threading.Event()
        self.floor = threading.Lock()  # who speaks next: the reply (audio_started) or the user
        self.attempts: list[_Attempt] = []  # live runs, oldest first; the last is the newest
        self.current_turn = 0
        self._ids = threading.Lock()
        self._next_id = 1  # without an endpointer, turn ids come from here
        self.capture_thread = threading.Thread(target=self._capture, name="capture")
        self.partials: queue.Queue[tuple[int, np.ndarray] | None] = queue.Queue(maxsize=1)
        self.partial_thread = threading.Thread(target=self._partial_worker, name="partial-asr")
        self._partial_audio_ms = 0.0
        # "auto" is resolved by the session (with_partials_resolved); here it counts as on.
        self.partials_on = self.turn.partials != "off" and self.turn.partial_interval_ms > 0
        watched = [d for d in (microphone, speaker) if isinstance(d, Microphone | Speaker)]
        self.watch = DeviceWatch(watched, pipeline.emit, lambda: self.current_turn)

    def start(self) -> None:
        """Start capturing (``stop()`` ends and joins everything)."""
        if self.mic is not None and self.endpointer is not None:
            self.mic.start()
            self.capture_thread.start()
            if self.partials_on:
                self.partial_thread.start()
        self.watch.start()

    def busy(self) -> bool:
        """Whether a turn is being worked on or answered."""
        with self.floor:
            return any(a.thread.is_alive() for a in self.attempts)

    def speaking(self) -> bool:
        """Whether a reply is being played (the floor is the assistant's)."""
        return any(a.audio_started and a.thread.is_alive() for a in self.attempts)

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
        lost = False
        level_due_ns = 0
        while not self.stop_event.is_set():
            try:
                block = self.mic.read(0.1)
            except DeviceLostError:
                if not lost:  # once per loss; the watch reports it and reopens the device
                    lost = True
                    self._drop_speech()
                self.stop_event.wait(0.1)
                continue
            lost = False
            if block is None:
                continue
            if self.on_level is not None and block[1] >= level_due_ns:
                level_due_ns = block[1] + 100_000_000
                rms = float(np.sqrt(np.mean(np.square(block[0])))) if block[0].size else 0.0
                self.on_level(MicLevel(self.current_turn, block[1], 20 * np.log10(max(rms, 1e-6))))
            with self.floor:
                self.attempts = [a for a in self.attempts if a.thread.is_alive()]
                newest = self.attempts[-1] if self.attempts else None
                # The last turn can still take more speech until its reply is heard.
                open_turn = newest is not None and not (newest.gate.discarded or newest.audio_started)
                speaking = self.speaking()
            closed = self.muted or not self.listening
            if closed or (speaking and not self.pipeline.options.barge_in):
                gated = True  # muted, or the assistant is speaking: do not listen to ourselves
                continue
            if gated:
                gated = False
                self.endpointer.reset()
                self.mic.drain()
                continue
            with self._ids:
                if not open_turn:
                    self.endpointer.seal()
                events = self.endpointer.feed(*block)
            for event in events:
                self.pipeline.emit(event)  # first: a turn started for it must find it emitted
                self._handle(event)
            self._maybe_partial()

    def _drop_speech(self) -> None:
        """The microphone was lost: forget the speech in progress and any work started on it.

        Speech held from the utterance's length cuts goes too: the rest of that question will
        not come, and it must not be joined to the next one.
        """
        assert self.endpointer is not None and self.mic is not None
        with self._ids:
            turn = self.endpointer.turn_id
            self.endpointer.reset()
        held = self.pipeline.drop_held()
        turn = turn or (held[-1] if held else 0)
        self.mic.drain()
        self._partial_audio_ms = 0.0
        with self.floor:
            newest = self.attempts[-1] if self.attempts else None
            if newest is not None and newest.thread.is_alive() and not newest.gate.confirmed.is_set():
                newest.gate.discard()  # speculative: the rest of the turn will not come
                newest.cancel.set()
                turn = turn or newest.turn_id
        if turn:
            self.pipeline.emit(TurnCancelled(turn, time.monotonic_ns(), MICROPHONE_LOST))

    def _handle(self, event: Event) -> None:
        """Start, confirm or discard the turn's work for one endpointer event."""
        with self.floor:
            newest = self.attempts[-1] if self.attempts else None
            ours = newest if newest is not None and newest.turn_id == event.turn_id else None
            if ours is not None and (ours.gate.discarded or not ours.thread.is_alive()):
                ours = None
            if isinstance(event, SpeechResumed):
                if ours is not None and not ours.audio_started:
                    ours.gate.discard()  # the user goes on: nothing of this reply plays
                    ours.cancel.set()
                elif ours is not None and self.pipeline.options.barge_in:
                    self._barge_in(ours, event.t_ns)
            elif isinstance(event, SpeechPaused):
                if self.turn.speculate and ours is None:
                    self._start(event.turn_id, self.pipeline.run_turn, event, confirmed=False)
            elif isinstance(event, SpeechEnded):
                self._partial_audio_ms = 0.0
                if event.cut and ours is not None:  # speculation on speech that goes on: drop it
                    ours.gate.discard("cut for length")
                    ours.cancel.set()
                    ours = None
                if ours is not None and not ours.gate.confirmed.is_set():
                    ours.gate.confirm()
                    self.pipeline.emit(SpeculationConfirmed(event.turn_id, time.monotonic_ns()))
                elif ours is None:
                    self._start(event.turn_id, self.pipeline.run_turn, event, confirmed=True)
            elif isinstance(event, SpeechOnset | SpeechStarted) and self.pipeline.options.barge_in:
                for attempt in self.attempts:
                    if attempt.audio_started and not attempt.cancel.is_set():
                        onset = event.onset_t_ns if isinstance(event, SpeechOnset) else event.t_ns
                        self._barge_in(attempt, onset)

    def _barge_in(self, attempt: _Attempt, onset_t_ns: int) -> None:
        """Stop generation and playback of the turn being answered, now (floor lock held)."""
        attempt.cancel.set()
        if self.speaker is not None:
            self.speaker.stop()
        latency_s = getattr(getattr(self.speaker, "stream", None), "latency", 0.0)
        latency_ms = 1000.0 * float(latency_s or 0.0)
        self.pipeline.emit(BargeIn(attempt.turn_id, time.monotonic_ns(), onset_t_ns, latency_ms))

    def _claim_audio(self, attempt: _Attempt) -> bool:
        """The TTS thread asks before playing: the floor is the reply's unless the user took it."""
        with self.floor:
            if attempt.gate.discarded or attempt.cancel.is_set():
                return False
            attempt.audio_started = True
            return True

    def _maybe_partial(self) -> None:
        """Hand the utterance in progress to the partial-transcript thread when it is due."""
        ep = self.endpointer
        interval = self.turn.partial_interval_ms
        if not self.partials_on or ep is None or not ep.turn_id or ep.silence_chunks or not ep.chunks:
            return
        audio_ms = 1000.0 * sum(c.size for c in ep.chunks) / 16000
        if audio_ms - self._partial_audio_ms < interval or self.partials.full():
            return
        with self.floor:
            if any(a.thread.is_alive() and not a.audio_started for a in self.attempts):
                return  # the turn's own ASR/LLM work comes first
        self._partial_audio_ms = audio_ms
        self.partials.put_nowait((ep.turn_id, np.concatenate(ep.chunks)))

    def _partial_worker(self) -> None:
        while (item := self.partials.get()) is not None:
            self.pipeline.partial_transcript(*item)

    def submit_text(self, text: str) -> int:
        """Answer a typed message after the turn in progress; returns its turn id."""
        turn = self.claim_turn_id()

        def run(first: str, sink: AudioSink | None, cancel: threading.Event, _gate: ReplyGate) -> None:
            self.pipeline.run_text_turn(turn, first, sink, cancel)

        with self.floor:
            self._start(turn, run, text, confirmed=True)
        return turn

    def submit_speech(self, audio: np.ndarray, endpointing_ms: float) -> int:
        """Answer recorded speech (a WAV file) as if just spoken; returns its turn id.

        Its speech end is placed ``endpointing_ms`` (the VAD's measured delay) before now.
        """
        turn = self.claim_turn_id()
        now = time.monotonic_ns()
        utterance = SpeechEnded(turn, now, now - int(endpointing_ms * 1e6), audio)
        with self.floor:
            self._start(turn, self.pipeline.run_turn, utterance, confirmed=True)
        return turn

    def _start(self, turn: int, target: Callable[..., object], first: object, confirmed: bool) -> None:
        """Run ``target(first, speaker, cancel, gate)`` after the runs before it (floor lock held)."""
        before = [a.thread for a in self.attempts]
        cancel = threading.Event()
        attempt = _Attempt(turn, threading.Thread(), cancel, ReplyGate(confirmed))
        attempt.gate.claim_audio = lambda: self._claim_audio(attempt)

        def run() -> None:
            for thread in before:  # one turn at a time, in order
                thread.join()
            if not cancel.is_set():
                target(first, self._sink(), cancel, attempt.gate)

        attempt.thread = threading.Thread(target=run, name=f"turn-{turn}")
        self.attempts.append(attempt)
        self.current_turn = turn
        attempt.thread.start()

    def _sink(self) -> AudioSink | None:
        """The speaker, or None (text only) while it is lost."""
        lost = getattr(self.speaker, "lost", None)
        return None if lost is not None and lost.is_set() else self.speaker

    def interrupt(self) -> None:
        """Stop the reply being generated or spoken (the part heard stays in the history)."""
        with self.floor:
            for attempt in self.attempts:
                attempt.cancel.set()
        if self.speaker is not None:
            self.speaker.stop()

    def stop(self) -> None:
        """Cancel the turn in progress, stop playback, join every thread."""
        self.stop_event.set()
        self.interrupt()
        self.watch.stop()
        if self.capture_thread.is_alive():
            self.capture_thread.join()
        if self.partial_thread.is_alive():
            self.partials.put(None)
            self.partial_thread.join()
        for attempt in list(self.attempts):
            attempt.thread.join()
