"""Builds every stage of a voice session once; the UI and the headless modes share it."""

from __future__ import annotations

import functools
import gc
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from assistant.config import Settings
from assistant.events import Event
from assistant.stages.asr import Transcriber, TranscriptResult
from assistant.stages.asr_torch import TorchTranscriber, open_transcriber
from assistant.stages.audio import Microphone
from assistant.stages.devices import AudioDeviceError
from assistant.stages.dialogue import Dialogue
from assistant.stages.echo import echo_canceller
from assistant.stages.endpoint import TurnOptions, describe, end_of_turn_policy, with_partials_resolved
from assistant.stages.llm import load_llm
from assistant.stages.playback import Speaker
from assistant.stages.splitter import SentenceSplitter
from assistant.stages.tts import Synthesizer
from assistant.stages.tts_piper import PiperSynthesizer, open_synthesizer
from assistant.stages.vad import EndOfTurn, Endpointer, FixedSilence, VadOptions
from assistant.turns.duplex import Duplex
from assistant.turns.pipeline import VoicePipeline
from assistant.turns.protocols import PipelineOptions
from engines.progress import EngineProgress, ProgressCallback, Stage
from store.bundled import ModelStore

logger = logging.getLogger(__name__)

Progress = Callable[[str, float], None]
"""``progress(step, fraction_done)``: what is loading now and how far along the whole load is."""

ENGINE_SPAN = (0.05, 0.45)  # the part of the load bar that the LLM backend's start-up fills


class LoadCancelled(Exception):
    """The load was cancelled (the user quit while models were still loading)."""


def _no_progress(_step: str, _fraction: float) -> None:
    pass


class EngineSteps:
    """Engine events (:class:`~engines.progress.EngineProgress`) as load progress.

    Each top-level TensorRT phase fills ``span`` of the bar by its steps; nested phases
    only change the text. Events come from builder threads many times a second, so
    repeats of the same text within ``interval_ns`` are dropped.
    """

    def __init__(self, progress: Progress, span: tuple[float, float] = ENGINE_SPAN) -> None:
        self.progress = progress
        self.start, self.stop = span
        self.fraction = self.start
        self.top = ""
        self.lock = threading.Lock()
        self.last: tuple[str, int] = ("", 0)
        self.interval_ns = 100_000_000

    def __call__(self, event: EngineProgress) -> None:
        """Forward ``event`` as ``progress(text, fraction)``."""
        with self.lock:
            text = event.message
            if event.stage == Stage.BUILD:
                if not event.parent:
                    self.top = event.phase
                    if event.num_steps:
                        done = min(event.step / event.num_steps, 1.0)
                        self.fraction = max(self.fraction, self.start + (self.stop - self.start) * done)
                text = f"building engine: {self.top}"
                if event.parent and event.num_steps:
                    text += f" / {event.phase} {event.step}/{event.num_steps}"
            elif event.stage == Stage.CONVERT and event.num_steps:  # a GGUF converting into the store
                self.fraction = max(
                    self.fraction, self.start + (self.stop - self.start) * event.step / event.num_steps
                )
            elif event.stage in (Stage.CACHED, Stage.DONE, Stage.WARMUP):
                self.fraction = self.stop
            key = (text, event.t_ns // self.interval_ns)
            if key == self.last and event.stage == Stage.BUILD and not event.finished:
                return
            self.last = key
            self.progress(text, self.fraction)


@dataclass(frozen=True)
class SessionInfo:
    """Plain facts about a built session (device names empty when absent)."""

    mic: str = ""
    speaker: str = ""
    asr: str = ""
    llm: str = ""
    backend: str = ""
    engine: str = ""
    turn: str = ""
    tts: str = ""
    warm_up_ms: dict[str, float] = field(default_factory=dict)
    load_s: float = 0.0


@dataclass
class Session:
    """The built stages. ``close()`` stops TTS and closes the audio streams (idempotent)."""

    dialogue: Dialogue
    pipeline: VoicePipeline
    transcriber: Transcriber | TorchTranscriber | None = None
    synthesizer: Synthesizer | PiperSynthesizer | None = None
    mic: Microphone | None = None
    speaker: Speaker | None = None
    notices: list[str] = field(default_factory=list)
    warm_up_ms: dict[str, float] = field(default_factory=dict)
    load_s: float = 0.0
    turn_policy: EndOfTurn | None = None
    settings_vad: VadOptions = field(default_factory=VadOptions)
    settings_turn: TurnOptions = field(default_factory=TurnOptions)
    duplex: Duplex | None = None  # echo cancellation on the microphone (with a microphone)

    def endpointer(self) -> Endpointer:
        """A streaming endpointer with this session's end-of-turn policy."""
        vad, turn = self.settings_vad, self.settings_turn
        policy = self.turn_policy or FixedSilence(vad.end_silence_ms)
        pause_ms = turn.speculate_after_ms if turn.speculate else None
        return Endpointer(vad, policy=policy, pause_ms=pause_ms)

    def info(self) -> SessionInfo:
        """What the status bar shows about this session."""
        return SessionInfo(
            mic=self.mic.name if self.mic else "",
            speaker=self.speaker.name if self.speaker else "",
            asr=self.transcriber.description if self.transcriber else "",
            llm=self.pipeline.llm_model,
            backend=self.dialogue.decoder.name,
            engine=self.dialogue.decoder.cache_status,
            turn=describe(self.turn_policy) if self.turn_policy else "",
            tts=self.synthesizer.description if self.synthesizer else "",
            warm_up_ms=dict(self.warm_up_ms),
            load_s=self.load_s,
        )

    def close(self) -> None:
        """Release the devices, the TTS owner thread and the decoder (idempotent).

        Closing the decoder frees a TensorRT engine's GPU memory and saves its TensorRT-RTX
        runtime cache, also when warm-up was off.
        """
        for stage in (self.mic, self.speaker, self.synthesizer):
            if stage is not None:
                stage.close()
        self.mic = self.speaker = None
        self.synthesizer = None
        self.dialogue.decoder.close()


def _both(first: ProgressCallback, second: ProgressCallback | None) -> ProgressCallback:
    if second is None:
        return first

    def both(event: EngineProgress) -> None:
        second(event)
        first(event)  # may raise LoadCancelled: counted first

    return both


def open_audio(settings: Settings) -> tuple[Microphone | None, Speaker | None, str]:
    """The microphone and speaker, or ``(None, None, notice)`` when there is no usable pair."""
    mic = None
    try:
        mic = Microphone(settings.audio)
        return mic, Speaker(settings.audio), ""
    except AudioDeviceError as e:
        if mic is not None:
            mic.close()
        return None, None, f"no voice ({e}); text mode: type a message"


def build_session(
    settings: Settings,
    *,
    devices: bool = True,
    asr: bool | None = None,
    tts: bool | None = None,
    emit: Callable[[Event], None] | None = None,
    log_path: Path | None = None,
    progress: Progress = _no_progress,
    cancel: threading.Event | None = None,
    engine_events: ProgressCallback | None = None,
) -> Session:
    """Open the devices (when ``devices``) and load and warm up the models.

    ASR loads when ``asr`` is true, or when it is ``None`` and a microphone opened; TTS
    likewise with ``tts`` and the speaker. Failures of the models raise (ModelNotFound,
    AsrLoadError, TtsUnavailable...); a missing audio device only adds a notice. Setting
    ``cancel`` stops the load at its next step (an engine build at TensorRT's next step)
    with :class:`LoadCancelled`, devices closed. ``engine_events`` hears the decoder's
    start-up events (cache hits and misses, builds) as they are (the metrics count them).
    """
    start_ns = time.monotonic_ns()

    def step(text: str, fraction: float) -> None:
        if cancel is not None and cancel.is_set():
            raise LoadCancelled(f"cancelled while {text}")
        progress(text, fraction)

    mic = speaker = decoder = None
    synthesizer: Synthesizer | PiperSynthesizer | None = None
    policy: EndOfTurn | None = None
    notices: list[str] = []
    duplex: Duplex | None = None
    store = ModelStore(settings.models.store_dir)  # one for the start: LLM, ASR, turn detector, TTS
    if devices:
        step("opening audio devices", 0.02)
        mic, speaker, notice = open_audio(settings)
        if notice:
            notices.append(notice)
    try:
        if mic is not None and speaker is not None:
            echo, echo_reason = echo_canceller(settings.echo)  # "on" and unavailable: raises
            duplex = Duplex(echo, echo_reason, speaker, mic, settings.echo.probe)
            duplex.play_probe()  # converges while the models load
        # The ASR loads on a thread of its own while the LLM loads: each load is mostly one
        # core's work, so on 2 cores "listening on" comes 0.25-0.4 s sooner (docs/benchmarks.md,
        # "Start-up, sixth step"). Leaving the block joins that thread, also when a load fails.
        with ThreadPoolExecutor(1, thread_name_prefix="asr-load") as pool:
            asr_load = None
            if asr or (asr is None and mic is not None):
                asr_load = pool.submit(open_transcriber, settings.asr, store)
            step(f"loading LLM {settings.models.llm}", 0.05)
            decoder, tokenizer = load_llm(
                settings.models,
                settings.decoder,
                settings.engine,
                gate=settings.gate,
                progress=_both(EngineSteps(step), engine_events),
                cancel=cancel,
                notice=notices.append,  # why auto fell back from TensorRT: shown once, as notices are
                store=store,
            )
            transcriber = None
            if asr_load is not None:
                step(f"loading ASR {settings.asr.model}", 0.45)
                transcriber = asr_load.result()
        dialogue = Dialogue(
            decoder, tokenizer, settings.dialogue.system_prompt, settings.generation.options()
        )
        warm: dict[str, float] = {}
        step("warming up the LLM", 0.6)
        warm["llm"] = dialogue.warm_up()
        if transcriber is not None:
            step("warming up ASR", 0.8)
            warm["asr"] = transcriber.warm_up()
            step(f"loading the turn detector ({settings.turn.detection})", 0.85)
            policy, notice = end_of_turn_policy(settings.turn, settings.vad, store)
            if notice:
                notices.append(notice)
        if tts or (tts is None and speaker is not None):
            step(f"starting TTS ({settings.tts.engine})", 0.9)
            synthesizer = open_synthesizer(settings.tts, store, notices.append)  # Piper: else pyttsx3
        step("ready", 1.0)
    except BaseException as e:
        for stage in (mic, speaker, synthesizer):
            if stage is not None:
                stage.close()
        if decoder is not None:
            decoder.close()
        if cancel is not None and cancel.is_set() and not isinstance(e, LoadCancelled):
            raise LoadCancelled(f"cancelled ({e})") from e  # e.g. the engine build it stopped
        raise
    logger.info("warm-up: %s", ", ".join(f"{k} {v:.0f} ms" for k, v in warm.items()))
    options = PipelineOptions(barge_in=settings.pipeline.barge_in, log_path=log_path)
    pipeline = VoicePipeline(
        dialogue,
        transcriber or _NoAsr(),
        synthesizer,
        functools.partial(SentenceSplitter, settings.splitter),
        options,
        emit,
        settings.models.llm,
    )
    session = Session(
        dialogue,
        pipeline,
        transcriber,
        synthesizer,
        mic,
        speaker,
        notices,
        warm,
        (time.monotonic_ns() - start_ns) / 1e9,
        policy,
        settings.vad,
        with_partials_resolved(settings.turn, transcriber.device if transcriber else "cpu"),
        duplex,
    )
    set_aside_from_the_collector()
    return session


def set_aside_from_the_collector(everything: bool = True) -> None:
    """Collect garbage now, then keep what is left out of the collector's later passes.

    A full collection walks every object the collector tracks and holds the GIL throughout:
    with the models and the UI loaded it took 50-76 ms every one or two turns, and an audio
    callback, which needs the GIL for each 32 ms block, kept waiting ~80 ms or more lets
    the 64 ms output underrun (now and then from ~55 ms), which costs a reply its full duplex
    for a moment (``python -m bench.ui``, ``python -m bench.xruns``, docs/benchmarks.md).
    What is alive now is frozen (:func:`gc.freeze`), so later collections walk only what
    came after. ``everything``: first unfreeze, so that what was frozen earlier and has
    become garbage since is collected too (a new session; the UI every
    :data:`~assistant.tui.feed.RECOLLECT_FROZEN_EVERY_TURNS` turns: 200-320 ms on 2 cores,
    at a turn's end, as the screen's removed lines are frozen garbage by then); otherwise the
    collection walks only what is new since the last call (the UI after each turn: 5-15 ms).
    """
    if everything:
        gc.unfreeze()
    gc.collect()
    gc.freeze()


class _NoAsr:
    """Stands in when no ASR was loaded (text mode): only typed turns run."""

    description = "none"

    def transcribe(
        self, audio: np.ndarray, quick: bool = False, long_form: bool = False, partial: bool = False
    ) -> TranscriptResult:
        """Never transcribes: there is no model.

        Raises:
            RuntimeError: Always (only typed turns run in text mode).
        """
        raise RuntimeError("no ASR model loaded (text mode)")

    def phrase_logprobs(self, audio: np.ndarray, phrases: list[str]) -> list[float]:
        """Never scores: there is no model.

        Raises:
            RuntimeError: Always (only typed turns run in text mode).
        """
        raise RuntimeError("no ASR model loaded (text mode)")
