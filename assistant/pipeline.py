"""The voice loop: the only module that knows every stage.

utterance (VAD) -> ASR -> decoder token stream -> sentence splitter -> TTS -> output,
with a typed, timestamped event for every step (``assistant.events``) and a latency record
per turn (``assistant.latency``). TTS runs on its own thread, so the first sentence is
spoken while the rest of the reply is still being generated.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from assistant.audio import Microphone
from assistant.dialogue import Dialogue
from assistant.events import (
    AudioReady,
    AudioStarted,
    BargeIn,
    Event,
    MicLevel,
    PlaybackEnded,
    PromptSubmitted,
    SentenceReady,
    SpeechEnded,
    SpeechOnset,
    SpeechStarted,
    TokenGenerated,
    TranscriptReady,
    TurnCancelled,
    TurnDone,
)
from assistant.latency import TurnRecord, build_record
from assistant.vad import SAMPLE_RATE_HZ, Endpointer

logger = logging.getLogger(__name__)


class AudioSink(Protocol):
    """Where reply audio goes: the speaker, or a buffer written to a WAV file."""

    def play(self, turn_id: int, audio: np.ndarray) -> None:
        """Queue audio behind what is queued."""
        ...

    def stop(self) -> None:
        """Drop what is queued, now."""
        ...

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until everything queued has played."""
        ...


class Transcribes(Protocol):
    """The ASR stage as the pipeline uses it."""

    description: str

    def transcribe(self, audio: np.ndarray) -> object:
        """Return an object with ``text`` and ``asr_ms``."""
        ...


class Synthesizes(Protocol):
    """The TTS stage as the pipeline uses it."""

    def synthesize(self, text: str) -> np.ndarray:
        """16 kHz mono float32 audio of ``text``."""
        ...


class Splits(Protocol):
    """The sentence splitter as the pipeline uses it."""

    def push(self, text: str) -> list[str]:
        """Add text; return completed sentences."""
        ...

    def flush(self) -> list[str]:
        """Return what is left."""
        ...


@dataclass(frozen=True)
class PipelineOptions:
    """Turn-taking behaviour.

    Without ``barge_in`` the microphone is ignored while the assistant speaks (it must not
    hear itself through the speakers). With it (headsets), user speech stops the reply and
    only what was played stays in the conversation.
    """

    barge_in: bool = False
    log_path: Path | None = None


class FileSink:
    """Collects reply audio in memory (file mode); the first sample counts as heard at once."""

    def __init__(self) -> None:
        self.segments: list[np.ndarray] = []
        self.first_audio_t_ns: dict[int, int] = {}
        self.played_samples: dict[int, int] = {}

    def play(self, turn_id: int, audio: np.ndarray) -> None:
        """Append audio."""
        self.first_audio_t_ns.setdefault(turn_id, time.monotonic_ns())
        self.played_samples[turn_id] = self.played_samples.get(turn_id, 0) + audio.size
        self.segments.append(audio)

    def stop(self) -> None:
        """Nothing plays, so nothing to stop."""

    def wait(self, timeout_s: float | None = None) -> bool:
        """Always done."""
        return True

    def audio(self) -> np.ndarray:
        """Everything played so far."""
        return np.concatenate(self.segments) if self.segments else np.zeros(0, np.float32)


class VoicePipeline:
    """Runs turns through every stage and reports events to ``emit`` (from worker threads)."""

    def __init__(
        self,
        dialogue: Dialogue,
        transcriber: Transcribes,
        synthesizer: Synthesizes | None,
        make_splitter: Callable[[], Splits],
        options: PipelineOptions,
        emit: Callable[[Event], None] | None = None,
        llm_model: str = "",
    ) -> None:
        self.dialogue = dialogue
        self.transcriber = transcriber
        self.synthesizer = synthesizer
        self.make_splitter = make_splitter
        self.options = options
        self._emit_external = emit
        self.llm_model = llm_model
        self.records: list[TurnRecord] = []
        self._events: list[Event] = []

    def emit(self, event: Event) -> None:
        """Record an event and pass it on."""
        self._events.append(event)
        if self._emit_external:
            self._emit_external(event)

    def run_turn(self, utterance: SpeechEnded, sink: AudioSink | None, cancel: threading.Event) -> TurnRecord:
        """Answer one utterance; returns its record once the reply has played (or was cut)."""
        turn = utterance.turn_id
        self._events = [e for e in self._events if e.turn_id == turn]
        if not any(isinstance(e, SpeechEnded) for e in self._events):
            self.emit(utterance)
        result = self.transcriber.transcribe(utterance.audio)
        text = str(getattr(result, "text", "")).strip()
        self.emit(TranscriptReady(turn, time.monotonic_ns(), text, float(getattr(result, "asr_ms", 0.0))))
        if not text:
            self.emit(TurnCancelled(turn, time.monotonic_ns(), "no words recognised"))
            return self._finish(turn)
        return self._answer(turn, text, sink, cancel)

    def run_text_turn(
        self, turn: int, text: str, sink: AudioSink | None, cancel: threading.Event
    ) -> TurnRecord:
        """Answer a typed message: spoken too when ``sink`` is given.

        Its record has no speech stages (endpointing, ASR, voice-to-voice are ``None``);
        the ``TranscriptReady`` it emits carries the typed text.
        """
        self._events = [e for e in self._events if e.turn_id == turn]
        self.emit(TranscriptReady(turn, time.monotonic_ns(), text.strip(), 0.0))
        return self._answer(turn, text.strip(), sink, cancel)

    def _answer(self, turn: int, text: str, sink: AudioSink | None, cancel: threading.Event) -> TurnRecord:
        sentences: queue.Queue[tuple[int, str] | None] = queue.Queue()
        spoken: list[tuple[str, int, int]] = []  # (sentence, turn-relative first sample, samples)
        tts = None
        if self.synthesizer is None:
            sink = None  # text only: nothing to speak with
        if sink is not None:
            tts = threading.Thread(
                target=self._speak, args=(turn, sentences, sink, cancel, spoken), name=f"tts-turn-{turn}"
            )
            tts.start()
        try:
            self._generate(turn, text, sentences, cancel)
        finally:
            sentences.put(None)
            if tts is not None:
                tts.join()
        if sink is not None:
            while not cancel.is_set() and not sink.wait(0.05):
                pass
            if cancel.is_set():
                sink.stop()
            first = getattr(sink, "first_audio_t_ns", {}).get(turn)
            if first:
                self.emit(AudioStarted(turn, first))
        self.emit(PlaybackEnded(turn, time.monotonic_ns()))
        if cancel.is_set():
            played = getattr(sink, "played_samples", {}).get(turn, 0) if sink is not None else None
            heard = self._heard(spoken, played) if played is not None else self.dialogue_reply()
            self.dialogue.revise_last_reply(heard)
            self.emit(TurnCancelled(turn, time.monotonic_ns(), "interrupted", heard))
        return self._finish(turn)

    def dialogue_reply(self) -> str:
        """The last reply as generated (what a reader saw when nothing is spoken)."""
        return self.dialogue.turns[-1].assistant if self.dialogue.turns else ""

    def _generate(
        self, turn: int, text: str, sentences: queue.Queue[tuple[int, str] | None], cancel: threading.Event
    ) -> None:
        reply = self.dialogue.ask(text, cancel)
        splitter = self.make_splitter()
        index = 0
        submitted = False
        for chunk in reply:
            if not submitted:  # the stats know the prompt split only once iteration began
                submitted = True
                s = reply.stats
                self.emit(PromptSubmitted(turn, s.t_submit_ns, s.prompt_tokens, s.reused_tokens))
            if chunk.token_id >= 0:
                self.emit(TokenGenerated(turn, chunk.t_ns, chunk.index, chunk.text))
            for sentence in splitter.push(chunk.text):
                self.emit(SentenceReady(turn, time.monotonic_ns(), index, sentence))
                sentences.put((index, sentence))
                index += 1
        if not submitted:
            s = reply.stats
            self.emit(PromptSubmitted(turn, s.t_submit_ns, s.prompt_tokens, s.reused_tokens))
        if not cancel.is_set():
            for sentence in splitter.flush():
                self.emit(SentenceReady(turn, time.monotonic_ns(), index, sentence))
                sentences.put((index, sentence))
                index += 1

    def _speak(
        self,
        turn: int,
        sentences: queue.Queue[tuple[int, str] | None],
        sink: AudioSink,
        cancel: threading.Event,
        spoken: list[tuple[str, int, int]],
    ) -> None:
        offset = 0
        while (item := sentences.get()) is not None:
            if cancel.is_set():
                continue  # drain without speaking
            index, sentence = item
            assert self.synthesizer is not None  # _answer speaks only with one
            audio = self.synthesizer.synthesize(sentence)
            self.emit(AudioReady(turn, time.monotonic_ns(), index, 1000 * audio.size / SAMPLE_RATE_HZ))
            if cancel.is_set():
                continue
            spoken.append((sentence, offset, audio.size))
            offset += audio.size
            sink.play(turn, audio)

    @staticmethod
    def _heard(spoken: list[tuple[str, int, int]], played_samples: int) -> str:
        """The reply as far as it was played; a partly played sentence keeps its played words."""
        words: list[str] = []
        for sentence, start, size in spoken:
            if played_samples >= start + size:
                words.append(sentence)
            elif played_samples > start:
                parts = sentence.split()
                words.append(" ".join(parts[: int(len(parts) * (played_samples - start) / size)]))
        return " ".join(w for w in words if w)

    def _finish(self, turn: int) -> TurnRecord:
        record = build_record(
            turn,
            self._events,
            backend=self.dialogue.decoder.name,
            llm_model=self.llm_model,
            asr_model=self.transcriber.description,
        )
        self.records.append(record)
        if self.options.log_path:
            with self.options.log_path.open("a") as f:
                f.write(record.to_json() + "\n")
        self.emit(TurnDone(turn, time.monotonic_ns(), record))
        return record


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
