"""Speech to text with faster-whisper (CTranslate2), loaded once and warmed up before the first turn."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from assistant.config.sections import AsrOptions
from assistant.stages.asr_fit import (
    FitWindow,
    decode_fit,
    encode_fit,
    phrase_logprobs,
    problem,
    silent,
    unclear,
)
from assistant.stages.streams import SAMPLE_RATE_HZ
from store.bundled import BUNDLED, ModelStore

logger = logging.getLogger(__name__)

MIN_AUDIO_S = 0.1  # shorter than this holds no word; skip the model
WINDOW_S = 30  # Whisper's input window: longer audio is transcribed in clips of at most this
CUT_SEARCH_S = 5.0  # a clip ends at the quietest point of the last 5 s before its window ends
QUIET_FRAME_SAMPLES = 512  # 32 ms frames for the loudness search
QUIET_SPAN_FRAMES = 5  # quietness of a frame = mean energy of the 160 ms around it (not a stop gap)
FETCH_HINT = "run 'assistant models fetch'"
HUB_HINT = " (a size name downloads from the Hugging Face hub: online only)"


class AsrModelNotFound(FileNotFoundError):
    """The configured ASR model is not in the store, not a folder and not a known size name."""


class AsrLoadError(RuntimeError):
    """The ASR model exists but CTranslate2 could not load it (device, compute type, files)."""


@dataclass(frozen=True)
class TranscriptResult:
    """One utterance's transcript.

    ``asr_ms`` is wall time from calling the model to the last segment decoded
    (``time.monotonic_ns``). ``no_speech_prob`` is the maximum over segments (the most
    doubtful part decides), 1.0 when the audio was too short to transcribe. ``clips`` is
    how many pieces the audio was transcribed in (1 up to :data:`WINDOW_S`). ``window`` is
    ``fit`` when the window fitted to the speech gave the text, ``full`` for Whisper's 30 s
    window; ``fell_back`` is true when the fitted window's decode looked wrong and the full
    window transcribed instead. ``unclear`` holds the ``(start_s, end_s)`` stretches that
    could not be transcribed (every decode failed Whisper's checks): their text is left out.
    """

    text: str
    audio_ms: float
    asr_ms: float
    language: str
    no_speech_prob: float
    clips: int = 1
    window: str = "full"
    fell_back: bool = False
    unclear: tuple[tuple[float, float], ...] = ()
    left_out: str = ""  # the text of the ``unclear`` stretches, which ``text`` leaves out


def _usable_cores() -> int:
    # The affinity mask honours taskset/cgroup cpusets (Linux only); cpu_count counts the host.
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def quiet_point(samples: np.ndarray, end: int, search_s: float = CUT_SEARCH_S) -> int:
    """The quietest place in the ``search_s`` before sample ``end``: a sample offset to cut at.

    Quietness is the mean energy of the :data:`QUIET_SPAN_FRAMES` 32 ms frames around a frame,
    so the pause between sentences or words wins over a stop consonant's short closure.
    """
    frame, span = QUIET_FRAME_SAMPLES, QUIET_SPAN_FRAMES
    start = max(end - int(search_s * SAMPLE_RATE_HZ), frame)
    n = (end - start) // frame
    if n < 1:
        return end
    energy = np.square(samples[start : start + n * frame].astype(np.float64)).reshape(n, frame).mean(axis=1)
    if n >= span:  # "valid" smoothing: no zero padding that would make the edges look quiet
        quiet = int(np.argmin(np.convolve(energy, np.ones(span), "valid"))) + span // 2
    else:
        quiet = int(np.argmin(energy))
    return start + quiet * frame + frame // 2


def first_clip_end(samples: np.ndarray) -> int | None:
    """Where the first clip of long speech ends, or None while it fits one window.

    At the :func:`quiet_point` of the last :data:`CUT_SEARCH_S` before the 30 s window ends,
    so a clip rarely starts or ends inside a word. It depends only on the first 30 s of
    audio: once speech runs past the window, the clip is final even while more arrives.
    """
    window = WINDOW_S * SAMPLE_RATE_HZ
    return None if samples.size <= window else quiet_point(samples, window)


def quiet_clips(samples: np.ndarray) -> list[int]:
    """Sample offsets ``[0, cut_1, ..., len]`` of ``samples``' clips, each one window at most."""
    cuts = [0]
    while (end := first_clip_end(samples[cuts[-1] :])) is not None:
        cuts.append(cuts[-1] + end)
    cuts.append(samples.size)
    return cuts


def _resolve(model: str, store: ModelStore) -> str:
    """Folder (or size name) to hand to ``WhisperModel``."""
    if store.is_present(model):
        return str(store.path(model))
    if model in BUNDLED:
        raise AsrModelNotFound(f"ASR model {model!r} is not in the store {store.models_dir}: {FETCH_HINT}")
    local = Path(model).expanduser()
    if local.is_dir():
        if not (local / "model.bin").is_file():
            raise AsrModelNotFound(f"{local} is not a CTranslate2 Whisper folder (no model.bin)")
        return str(local)
    from faster_whisper.utils import available_models

    if model in available_models():
        return model
    raise AsrModelNotFound(
        f"no ASR model {model!r}: not in the store, not a folder, not a faster-whisper size name; "
        f"{FETCH_HINT} and use 'whisper-tiny.en'"
    )


class Transcriber:
    """A loaded faster-whisper model; ``transcribe`` blocks until the text is complete."""

    def __init__(self, options: AsrOptions, store: ModelStore) -> None:
        """Resolve and load the model.

        Raises:
            AsrModelNotFound: The store name was not fetched, or the name is unknown.
            AsrLoadError: CTranslate2 failed to load it (or the hub download failed).
        """
        import ctranslate2

        from assistant.stages.asr_guard import GuardedWhisper

        self.options = options
        self.fit = FitWindow(floor_s=options.floor_s)
        self.fallbacks = 0  # fitted-window decodes that looked wrong (the full window took over)
        self._encoded: tuple[bytes, tuple[Any, int]] | None = None  # the last fitted encoding, by audio
        source = _resolve(options.model, store)
        device = options.device
        if device == "auto":
            device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        compute_type = options.compute_type
        if compute_type == "auto":
            compute_type = "float16" if device == "cuda" else "int8"
        threads = options.cpu_threads or min(_usable_cores(), 4)
        start_ns = time.monotonic_ns()
        try:
            self.model = GuardedWhisper(source, device=device, compute_type=compute_type, cpu_threads=threads)
        except Exception as e:  # CTranslate2 and the hub raise RuntimeError, ValueError, OSError...
            hub = HUB_HINT if source == options.model else ""
            raise AsrLoadError(
                f"cannot load ASR model {options.model!r} on {device} {compute_type}{hub}: {e}"
            ) from e
        self.load_ms = (time.monotonic_ns() - start_ns) / 1e6
        self.device = device
        self.compute_type = compute_type
        self.description = f"{Path(options.model).name} {device} {compute_type}"
        # (seconds transcribed, seconds of audio) after each segment, when set (run --input of a
        # long file: assistant.stages.audio_file.stderr_progress)
        self.progress: Callable[[float, float], None] | None = None
        logger.info("loaded ASR %s from %s (%d threads)", self.description, source, threads)

    def warm_up(self) -> float:
        """Transcribe 1 s of faint noise so the first real turn is not slower; returns ms.

        On the path a turn takes (the fitted window by default: 55 ms, where the 30 s window
        took 280 ms of every start; the first question after either took 77-88 ms).
        """
        noise = np.random.default_rng(0).standard_normal(SAMPLE_RATE_HZ).astype(np.float32) * 0.003
        start_ns = time.monotonic_ns()
        self.transcribe(noise)
        return (time.monotonic_ns() - start_ns) / 1e6

    def transcribe(
        self, audio: np.ndarray, quick: bool = False, long_form: bool = False, partial: bool = False
    ) -> TranscriptResult:
        """Transcribe one utterance of 16 kHz mono float32 samples in [-1, 1].

        Audio shorter than 0.1 s returns an empty transcript without running the model.
        ``quick`` decodes greedily (beam 1). ``partial`` too, for the live transcript of speech
        in progress, and a fitted-window decode that looks wrong gives no text instead of the
        30 s window's: a partial of speech cut mid-word often looks wrong, and its 30 s pass
        (~450 ms on 2 cores, against ~100) ran on into the pause where the turn's own ASR starts.
        Audio longer than Whisper's 30 s window is cut at quiet points into clips
        (:func:`quiet_clips`) decoded with timestamps, so nothing between windows is dropped;
        shorter audio takes the faster path without timestamps, unless ``long_form`` says it
        is a clip of longer speech (then a decode that stops short resumes after its last
        complete segment instead of dropping the clip's end). With ``window = "fit"`` the
        faster path encodes only ``max(floor_s, speech + margin)`` (:mod:`.asr_fit`) and falls
        back to the 30 s window when that decode looks wrong (``fell_back``, ``fallbacks``).
        """
        samples = np.ascontiguousarray(audio, dtype=np.float32).squeeze()
        if samples.ndim > 1:
            raise ValueError(f"ASR takes mono audio, got shape {audio.shape}")
        samples = samples.reshape(-1)  # a 0-d array from squeezing one sample
        audio_ms = 1000.0 * samples.size / SAMPLE_RATE_HZ
        if samples.size < MIN_AUDIO_S * SAMPLE_RATE_HZ:
            return TranscriptResult("", audio_ms, 0.0, self.options.language or "", 1.0)
        start_ns = time.monotonic_ns()
        long_form = long_form or samples.size > WINDOW_S * SAMPLE_RATE_HZ
        beam_size = 1 if quick or partial else self.options.beam_size
        fell_back = False
        if self.options.window == "fit" and not long_form and self.fit.frames(samples.size) < 3000:
            decode = decode_fit(
                self.model, samples, beam_size, self.fit, self.options.language, self._encode(samples)
            )
            why = problem(decode)
            if why is None or partial:
                text = "" if why is not None or silent(decode) else decode.text
                asr_ms = (time.monotonic_ns() - start_ns) / 1e6
                language = self.options.language or "en"
                return TranscriptResult(text, audio_ms, asr_ms, language, decode.no_speech_prob, window="fit")
            self.fallbacks += 1
            fell_back = True
            logger.info(
                "ASR fitted window (%d frames) %s: the 30 s window transcribes instead (fallback %d): %r",
                decode.frames,
                why,
                self.fallbacks,
                decode.text[:80],
            )
        cuts = quiet_clips(samples) if long_form else None
        segments, info = self._run(samples, beam_size, cuts)
        asr_ms = (time.monotonic_ns() - start_ns) / 1e6
        lost = [s for s in segments if unclear(s)]
        for s in lost:
            logger.warning(
                "ASR could not transcribe %.1f-%.1f s: every decode failed Whisper's checks (%r left out)",
                s.start,
                s.end,
                s.text[:80],
            )
        text = "".join(s.text for s in segments if not any(s is x for x in lost)).strip()
        no_speech = max((s.no_speech_prob for s in segments), default=1.0)
        clips = len(cuts) - 1 if cuts else 1
        spans = tuple((float(s.start), float(s.end)) for s in lost)
        left_out = " ".join(s.text.strip() for s in lost)
        return TranscriptResult(
            text, audio_ms, asr_ms, info.language, float(no_speech), clips, "full", fell_back, spans, left_out
        )

    def phrase_logprobs(self, audio: np.ndarray, phrases: list[str]) -> list[float]:
        """How likely each of ``phrases`` is as the transcript of ``audio`` (mean log-probability a token).

        Forced decoding (:func:`~assistant.stages.asr_fit.phrase_logprobs`) on the fitted
        window; ``-inf`` for audio too short to hold a word.
        """
        samples = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
        if samples.size < MIN_AUDIO_S * SAMPLE_RATE_HZ:
            return [-np.inf] * len(phrases)
        return phrase_logprobs(
            self.model, samples, self.fit, phrases, self.options.language, self._encode(samples)
        )

    def _encode(self, samples: np.ndarray) -> tuple[Any, int]:
        """The fitted window's encoder output for ``samples``; the last one is kept for scoring it."""
        key = hashlib.blake2b(samples.tobytes(), digest_size=16).digest() + samples.size.to_bytes(8, "little")
        if self._encoded is None or self._encoded[0] != key:
            self._encoded = key, encode_fit(self.model, samples, self.fit)
        return self._encoded[1]

    def _run(
        self, samples: np.ndarray, beam_size: int | None = None, cuts: list[int] | None = None
    ) -> tuple[list[Any], Any]:
        opts = self.options
        # Up to one window: no timestamps (fewer tokens to decode, today's fast path). Longer
        # audio without them is cut into fixed 30 s windows wherever they fall: the word across
        # a boundary is lost, and a window that starts mid-word decoded so badly (log-prob -2)
        # that faster-whisper skipped it as "no speech" (issue #8: 11 of 24 numbered sentences
        # of a 122 s recording kept). With timestamps each window resumes after the last
        # complete segment, and ``clip_timestamps`` starts each window at a quiet point.
        self.model.audio_s = WINDOW_S if cuts else samples.size / SAMPLE_RATE_HZ  # a loop's bound
        times_s = [c / SAMPLE_RATE_HZ for c in cuts or []]
        clips_s = [t for pair in zip(times_s, times_s[1:], strict=False) for t in pair]  # start, end, ...
        segments, info = self.model.transcribe(
            samples,
            language=opts.language,
            beam_size=beam_size or opts.beam_size,
            vad_filter=False,  # our VAD already endpointed the utterance
            condition_on_previous_text=False,  # each turn (and clip) stands alone
            without_timestamps=cuts is None,
            clip_timestamps=clips_s or "0",  # "0": faster-whisper's default, the whole audio
        )
        if self.progress is None:
            return list(segments), info  # the segments are a lazy generator: decode now
        total_s, done = samples.size / SAMPLE_RATE_HZ, []
        for segment in segments:
            done.append(segment)
            self.progress(min(float(segment.end), total_s), total_s)
        return done, info
