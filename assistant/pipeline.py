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

from assistant.dialogue import Dialogue
from assistant.events import (
    AudioReady,
    AudioStarted,
    Event,
    PlaybackEnded,
    PromptSubmitted,
    SentenceReady,
    SpeechEnded,
    TokenGenerated,
    TranscriptReady,
    TurnCancelled,
    TurnDone,
)
from assistant.latency import TurnRecord, build_record
from assistant.vad import SAMPLE_RATE_HZ

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
