"""The live loop: microphone -> endpointer -> turn engine -> turn threads.

The adapter around :class:`~assistant.turns.engine.TurnEngine`: it owns the capture thread,
the partial-transcript thread, the device watch and a thread per run of a turn (``stop()``
joins them all), feeds the engine what happens under one lock (the floor) and carries out the
actions it returns. The decisions themselves are the engine's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from assistant.events import Event, MicLevel, SpeechEnded
from assistant.stages.audio import AudioSink, Microphone, Speaker
from assistant.stages.devices import DeviceWatch
from assistant.stages.endpoint import TurnOptions
from assistant.stages.vad import Endpointer
from assistant.turns.capture import Capture
from assistant.turns.carry_out import Carrier
from assistant.turns.duplex import Duplex
from assistant.turns.engine import Action, MicBlock, TurnEngine, TurnRules
from assistant.turns.hearing import Overheard
from assistant.turns.pipeline import VoicePipeline
from assistant.turns.runs import TurnRuns
from assistant.turns.side_asr import SideTranscripts


class LiveLoop:
    """Microphone -> endpointer -> turn engine -> turns, on one capture thread plus the turn threads.

    The rules are the engine's (:mod:`assistant.turns.engine`): speculation at a pause, speech
    that comes back joining the turn until the reply plays, the microphone ignored while the
    reply plays unless barge-in is on, length cuts held. Here they meet the threads: each
    ``Start`` runs the pipeline on a turn thread after the turns before it, the TTS thread asks
    the engine before each piece of audio (:meth:`_claim_audio`), a thread that returns tells it.

    With a :class:`~assistant.turns.duplex.Duplex` the microphone is echo-cancelled before the
    endpointer hears it, and once the canceller has converged it is heard while replies play
    (full duplex): speech over a reply pauses it, and a judge thread transcribes that speech
    for the engine to resume, stop, cut or continue the reply (:class:`Judge`).

    ``listening`` and ``muted`` gate the microphone (both must allow it); the microphone is
    read by a :class:`~assistant.turns.capture.Capture` (``on_level`` gets its levels). Typed
    messages go through ``submit_text`` so that they take turns with spoken ones. Without a
    microphone (and endpointer) only typed turns run; without a speaker replies are not spoken.

    Lost devices are reported and reopened by a :class:`~assistant.stages.devices.DeviceWatch`.
    While the microphone is lost nothing is heard (speech in progress and speech held from its
    length cuts are dropped: ``TurnCancelled`` ``microphone lost``); while the speaker is lost,
    replies are text only. Typed turns work throughout.
    """

    def __init__(
        self,
        pipeline: VoicePipeline,
        microphone: Microphone | None,
        speaker: AudioSink | None,
        endpointer: Endpointer | None,
        on_level: Callable[[MicLevel], None] | None = None,
        turn: TurnOptions | None = None,
        duplex: Duplex | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.speaker = speaker
        self.endpointer = endpointer
        self.turn = turn or TurnOptions()
        self.listening = True
        self.muted = False
        self.stop_event = threading.Event()
        self.engine = TurnEngine(TurnRules.of(pipeline.options.barge_in, self.turn))
        self.duplex = duplex
        if duplex is not None and duplex.canceller is not None:
            pipeline.echo_report = duplex.report
        if endpointer is not None:
            policy = endpointer.policy
            pipeline.pause_transcribed = lambda pause, text: policy.transcribed(pause.t_ns, text)
        self.floor = threading.Lock()  # the engine and the runs: who speaks next
        self.runs = TurnRuns(pipeline, self._sink, self._claim_audio, self._ended)
        self.current_turn = 0
        self._ids = threading.Lock()
        self._next_id = 1  # without an endpointer, turn ids come from here
        self.capture = (
            None
            if microphone is None or endpointer is None
            else Capture(
                microphone,
                endpointer,
                duplex,
                self._ids,
                self.stop_event,
                self._gate,
                self._heard,
                self._mic_lost,
                self._unheard,
                self._maybe_partial,
                lambda: self.current_turn,
                on_level,
            )
        )
        self.side = SideTranscripts(pipeline, self._overlap_heard)
        unsuppressed = duplex.unsuppressed if duplex is not None else None
        self.carrier = Carrier(self.runs, speaker, self.side, pipeline.emit, self._started, unsuppressed)
        watched = [d for d in (microphone, speaker) if isinstance(d, Microphone | Speaker)]
        self.watch = DeviceWatch(watched, pipeline.emit, lambda: self.current_turn)

    def start(self) -> None:
        """Start capturing (``stop()`` ends and joins everything)."""
        if self.capture is not None:
            self.capture.mic.start()
            if self.duplex is not None:  # before the capture thread: it owns the canceller after
                self.duplex.start(self.pipeline.emit)
            self.capture.thread.start()
            self.side.start(self.engine.rules.partials)
        self.watch.start()

    def set_barge_in(self, mode: str) -> None:
        """Change the barge-in mode (``auto``, ``on``, ``off``) of the running loop."""
        with self.floor:
            self.engine.rules = replace(self.engine.rules, barge_in=mode)

    def busy(self) -> bool:
        """Whether a turn is being worked on or answered."""
        with self.floor:
            return self.engine.busy()

    def speaking(self) -> bool:
        """Whether a reply is being played (the floor is the assistant's)."""
        with self.floor:
            return self.engine.speaking()

    def claim_turn_id(self) -> int:
        """A fresh turn id for a turn that does not come from the microphone."""
        with self._ids:
            if self.endpointer is None:
                self._next_id += 1
                return self._next_id - 1
            turn = self.endpointer.next_turn_id
            self.endpointer.next_turn_id += 1
            return turn

    def _gate(self, probing: bool) -> MicBlock:
        """The engine's decision for a microphone block (``probing``: the echo probe is heard)."""
        with self.floor:
            self.engine.echo_ok = self.duplex is not None and self.duplex.full_duplex
            return self.engine.mic_block(closed=self.muted or not self.listening or probing)

    def _heard(self, event: Event) -> None:
        """An endpointer event: emitted first (a turn started for it must find it), then decided."""
        self.pipeline.emit(event)
        with self.floor:
            self._apply(self.engine.handle(event, time.monotonic_ns()))

    def _mic_lost(self, turn: int) -> None:
        """The capture thread forgot turn ``turn``'s speech: drop what is held and work started."""
        held = self.pipeline.hearing.drop_held()
        with self.floor:
            self._apply(self.engine.microphone_lost(turn, held, time.monotonic_ns()))

    def _unheard(self, turn: int) -> None:
        """The microphone stopped being heard (closed, gated): turn ``turn``'s speech was forgotten.

        Held speech stays held (unlike a lost microphone's): it may be the question whose joined
        answer begins to play, and a long utterance cut for length goes on once heard again.
        """
        with self.floor:
            self._apply(self.engine.unheard(turn, time.monotonic_ns()))

    def _apply(self, actions: list[Action]) -> None:
        """Carry out the engine's actions (floor lock held)."""
        self.carrier.apply(actions)

    def _claim_audio(self, attempt: int) -> bool:
        """The TTS thread asks before playing: the floor is the reply's unless the user took it."""
        with self.floor:
            return self.engine.claim_audio(attempt, time.monotonic_ns())

    def _overlap_heard(self, turn: int, overheard: Overheard, now_ns: int) -> None:
        """The words of speech over a reply (``overlap-asr`` thread): the engine decides."""
        with self.floor:
            self._apply(self.engine.overlap_heard(turn, overheard.text, now_ns, overheard.joined))

    def _maybe_partial(self) -> None:
        """Hand the utterance in progress to the partial-transcript thread when it is due."""
        if self.endpointer is not None and self.engine.rules.partials:
            self.side.offer_partial(self.endpointer, self._partial_due)

    def _partial_due(self, audio_ms: float, in_speech: bool) -> bool:
        with self.floor:
            return self.engine.partial_due(audio_ms, in_speech)

    def submit_text(self, text: str) -> int:
        """Answer a typed message after the turn in progress; returns its turn id."""
        turn = self.claim_turn_id()
        with self.floor:
            self._apply([self.engine.submit(turn, text)])
        return turn

    def submit_speech(self, audio: np.ndarray, endpointing_ms: float) -> int:
        """Answer recorded speech (a WAV file) as if just spoken; returns its turn id.

        Its speech end is placed ``endpointing_ms`` (the VAD's measured delay) before now.
        """
        turn = self.claim_turn_id()
        now = time.monotonic_ns()
        utterance = SpeechEnded(turn, now, now - int(endpointing_ms * 1e6), audio)
        with self.floor:
            self._apply([self.engine.submit(turn, utterance)])
        return turn

    def _started(self, turn: int) -> None:
        self.current_turn = turn

    def _ended(self, attempt: int) -> None:
        """A run's thread is done: it no longer holds the floor or the turn."""
        with self.floor:
            self.engine.ended(attempt)
            self.runs.forget(attempt)

    def _sink(self) -> AudioSink | None:
        """The speaker, or None (text only) while it is lost."""
        return None if self.speaker is None or self.speaker.lost.is_set() else self.speaker

    def interrupt(self) -> None:
        """Stop the reply being generated or spoken (the part heard stays in the history)."""
        with self.floor:
            self._apply(self.engine.interrupt())

    def stop_reply(self) -> bool:
        """The user asked to stop (the UI's key): as :meth:`interrupt`; False when nothing ran."""
        with self.floor:
            if not self.engine.busy():
                return False
            self._apply(self.engine.interrupt())
            return True

    def stop(self) -> None:
        """Cancel the turn in progress, stop playback, join every thread."""
        self.stop_event.set()
        self.interrupt()
        self.watch.stop()
        if self.capture is not None and self.capture.thread.is_alive():
            self.capture.thread.join()
        self.side.stop()
        with self.floor:
            threads = self.runs.threads()
        for thread in threads:
            thread.join()
