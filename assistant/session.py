"""Builds every stage of a voice session once; the UI and the headless modes share it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from assistant.asr import Transcriber
from assistant.audio import AudioDeviceError, Microphone, Speaker
from assistant.config import Settings
from assistant.dialogue import Dialogue
from assistant.events import Event
from assistant.llm import load_llm
from assistant.pipeline import PipelineOptions, VoicePipeline
from assistant.tts import SentenceSplitter, Synthesizer
from models.store import ModelStore

logger = logging.getLogger(__name__)

Progress = Callable[[str, float], None]
"""``progress(step, fraction_done)``: what is loading now and how far along the whole load is."""


def _no_progress(_step: str, _fraction: float) -> None:
    pass


@dataclass(frozen=True)
class SessionInfo:
    """Plain facts about a built session (device names empty when absent)."""

    mic: str = ""
    speaker: str = ""
    asr: str = ""
    llm: str = ""
    backend: str = ""
    warm_up_ms: dict[str, float] = field(default_factory=dict)
    load_s: float = 0.0


@dataclass
class Session:
    """The built stages. ``close()`` stops TTS and closes the audio streams (idempotent)."""

    dialogue: Dialogue
    pipeline: VoicePipeline
    transcriber: Transcriber | None = None
    synthesizer: Synthesizer | None = None
    mic: Microphone | None = None
    speaker: Speaker | None = None
    notices: list[str] = field(default_factory=list)
    warm_up_ms: dict[str, float] = field(default_factory=dict)
    load_s: float = 0.0

    def info(self) -> SessionInfo:
        """What the status bar shows about this session."""
        return SessionInfo(
            mic=self.mic.name if self.mic else "",
            speaker=self.speaker.name if self.speaker else "",
            asr=self.transcriber.description if self.transcriber else "",
            llm=self.pipeline.llm_model,
            backend=self.dialogue.decoder.name,
            warm_up_ms=dict(self.warm_up_ms),
            load_s=self.load_s,
        )

    def close(self) -> None:
        """Release the devices and the TTS owner thread."""
        for stage in (self.mic, self.speaker, self.synthesizer):
            if stage is not None:
                stage.close()
        self.mic = self.speaker = None
        self.synthesizer = None


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
) -> Session:
    """Open the devices (when ``devices``) and load and warm up the models.

    ASR loads when ``asr`` is true, or when it is ``None`` and a microphone opened; TTS
    likewise with ``tts`` and the speaker. Failures of the models raise (ModelNotFound,
    AsrLoadError, TtsUnavailable...); a missing audio device only adds a notice.
    """
    start_ns = time.monotonic_ns()
    mic = speaker = None
    notices: list[str] = []
    if devices:
        progress("opening audio devices", 0.02)
        mic, speaker, notice = open_audio(settings)
        if notice:
            notices.append(notice)
    try:
        progress(f"loading LLM {settings.models.llm}", 0.05)
        decoder, tokenizer = load_llm(settings.models, settings.decoder, settings.engine)
        dialogue = Dialogue(
            decoder, tokenizer, settings.dialogue.system_prompt, settings.generation.options()
        )
        transcriber = None
        if asr or (asr is None and mic is not None):
            progress(f"loading ASR {settings.asr.model}", 0.45)
            transcriber = Transcriber(settings.asr, ModelStore(settings.models.store_dir))
        warm: dict[str, float] = {}
        progress("warming up the LLM", 0.6)
        warm["llm"] = dialogue.warm_up()
        if transcriber is not None:
            progress("warming up ASR", 0.8)
            warm["asr"] = transcriber.warm_up()
        synthesizer = None
        if tts or (tts is None and speaker is not None):
            progress("starting TTS", 0.9)
            synthesizer = Synthesizer(settings.tts)
    except BaseException:
        for device in (mic, speaker):
            if device is not None:
                device.close()
        raise
    logger.info("warm-up: %s", ", ".join(f"{k} {v:.0f} ms" for k, v in warm.items()))
    options = PipelineOptions(barge_in=settings.pipeline.barge_in, log_path=log_path)
    pipeline = VoicePipeline(
        dialogue,
        transcriber or _NoAsr(),
        synthesizer,
        SentenceSplitter,
        options,
        emit,
        settings.models.llm,
    )
    progress("ready", 1.0)
    return Session(
        dialogue,
        pipeline,
        transcriber,
        synthesizer,
        mic,
        speaker,
        notices,
        warm,
        (time.monotonic_ns() - start_ns) / 1e9,
    )


class _NoAsr:
    """Stands in when no ASR was loaded (text mode): only typed turns run."""

    description = "none"

    def transcribe(self, audio: object) -> object:
        raise RuntimeError("no ASR model loaded (text mode)")
