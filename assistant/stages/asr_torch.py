"""Speech to text with Whisper in PyTorch (transformers), for GPUs that CTranslate2 cannot use.

faster-whisper runs on CTranslate2, whose CUDA build must match the machine's CUDA and cuDNN;
where it does not (or CTranslate2 has no CUDA at all), :class:`TorchTranscriber` runs the same
Whisper weights through transformers' ``WhisperForConditionalGeneration`` on whatever device
torch sees. The bundled CTranslate2 model is converted once (:mod:`store.whisper_weights`);
a Hugging Face Whisper folder, or an ``hf:`` name, loads as it is.

Decoding is a beam search of ``beam_size`` (greedy for ``quick`` partial transcripts), without
timestamps, on a 30 s window; longer speech is cut at quiet points
(:func:`~assistant.stages.asr.quiet_clips`) and each clip decoded alone. The log-mel features are
computed on the device too. :func:`open_transcriber` picks the backend.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from assistant.stages.asr import (
    FETCH_HINT,
    MIN_AUDIO_S,
    WINDOW_S,
    AsrLoadError,
    AsrModelNotFound,
    AsrOptions,
    Transcriber,
    TranscriptResult,
    quiet_clips,
)
from assistant.stages.audio import SAMPLE_RATE_HZ
from assistant.stages.whisper_search import WhisperSearch
from engines.selection import nvidia_driver_present
from store.bundled import BUNDLED, ModelStore
from store.whisper_weights import WhisperConvertError, converted_folder

logger = logging.getLogger(__name__)

N_FFT, HOP = 400, 160  # Whisper's 25 ms window, 10 ms hop at 16 kHz
WINDOW_FRAMES = WINDOW_S * SAMPLE_RATE_HZ // HOP  # 3000 mel frames in the 30 s window
BACKENDS = ("auto", "ctranslate2", "torch")
WARM_TOKENS = 24  # warm-up decodes at least this many tokens: a spoken question's length


def ctranslate2_cuda_devices() -> int:
    """CUDA devices CTranslate2 can use: 0 when it is not installed or has no CUDA build."""
    try:
        import ctranslate2
    except ImportError:
        return 0
    try:
        return int(ctranslate2.get_cuda_device_count())
    except RuntimeError:  # a CUDA build on a machine whose driver it cannot use
        return 0


def choose_backend(options: AsrOptions) -> str:
    """``ctranslate2`` or ``torch`` for these options (``backend`` ``auto`` decides here).

    ``auto`` takes PyTorch when the ASR is to run on CUDA (``device`` ``cuda``, or ``auto``
    with torch seeing a GPU) and CTranslate2 reports no CUDA device; CTranslate2 otherwise
    (on the CPU its int8 path is the faster one), or PyTorch when CTranslate2 is missing.
    """
    if options.backend != "auto":
        return options.backend
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return "torch"
    if options.device == "cpu" or ctranslate2_cuda_devices() > 0:
        return "ctranslate2"
    if options.device.startswith("cuda"):
        return "torch"
    if not nvidia_driver_present():  # no GPU for torch either: spare its import (~1.5 s)
        return "ctranslate2"
    import torch

    return "torch" if torch.cuda.is_available() else "ctranslate2"


def open_transcriber(options: AsrOptions, store: ModelStore) -> Transcriber | TorchTranscriber:
    """The ASR stage for ``options``: :func:`choose_backend` says which class."""
    backend = choose_backend(options)
    logger.info("ASR backend %s (asked: %s)", backend, options.backend)
    return TorchTranscriber(options, store) if backend == "torch" else Transcriber(options, store)


def resolve_folder(model: str, store: ModelStore) -> Path:
    """A Hugging Face Whisper folder for ``model``, converting a CTranslate2 one once.

    Raises:
        AsrModelNotFound: Not in the store, not a folder, not an ``hf:`` name.
        AsrLoadError: The CTranslate2 file could not be converted.
    """
    if store.is_present(model):
        folder = store.path(model)
    elif model in BUNDLED:
        raise AsrModelNotFound(f"ASR model {model!r} is not in the store {store.models_dir}: {FETCH_HINT}")
    elif model.startswith("hf:"):
        from assistant.hub import hub_model_dir, parse_hub_name

        folder = hub_model_dir(parse_hub_name(model), store)
    else:
        folder = Path(model).expanduser()
        if not folder.is_dir():
            raise AsrModelNotFound(
                f"no ASR model {model!r} for the torch backend: not in the store, not a folder, "
                f"not an hf: name; {FETCH_HINT} and use 'whisper-tiny.en'"
            )
    if (folder / "model.bin").is_file():
        try:
            return converted_folder(folder)
        except (WhisperConvertError, OSError) as e:
            raise AsrLoadError(f"cannot convert {folder / 'model.bin'} for PyTorch: {e}") from e
    config = folder / "config.json"
    if not config.is_file() or json.loads(config.read_text()).get("model_type") != "whisper":
        raise AsrModelNotFound(f"{folder} is neither a CTranslate2 nor a Hugging Face Whisper folder")
    return folder


class TorchTranscriber:
    """Whisper through transformers; ``transcribe`` blocks until the text is complete."""

    def __init__(self, options: AsrOptions, store: ModelStore) -> None:
        """Resolve, convert if needed, and load the model onto its device.

        Raises:
            AsrModelNotFound: The store name was not fetched, or the name is unknown.
            AsrLoadError: transformers could not load it on that device.
        """
        import torch
        from tokenizers import Tokenizer
        from transformers import WhisperForConditionalGeneration

        self.options = options
        folder = resolve_folder(options.model, store)
        device = options.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype_name = options.compute_type
        if dtype_name not in ("float16", "bfloat16", "float32"):  # auto, or CTranslate2's int8 kinds
            dtype_name = "float16" if device.startswith("cuda") else "float32"
        self.dtype = getattr(torch, dtype_name)
        start_ns = time.monotonic_ns()
        try:
            model: Any = WhisperForConditionalGeneration.from_pretrained(folder, dtype=self.dtype)
            self.model = model.to(device).eval()
            self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as e:  # torch and transformers raise RuntimeError, OSError, ValueError...
            raise AsrLoadError(
                f"cannot load ASR model {options.model!r} with torch on {device} {dtype_name}: {e}"
            ) from e
        self.load_ms = (time.monotonic_ns() - start_ns) / 1e6
        self.device = device
        self.compute_type = dtype_name
        self.description = f"{Path(options.model).name} torch {device} {dtype_name}"
        self.search = WhisperSearch(self.model, self.tokenizer, device, options.language)
        self._setup_features(int(model.config.num_mel_bins))
        logger.info("loaded ASR %s from %s", self.description, folder)

    def _setup_features(self, n_mels: int) -> None:
        import torch
        from transformers.audio_utils import mel_filter_bank

        filters = mel_filter_bank(
            num_frequency_bins=N_FFT // 2 + 1,
            num_mel_filters=n_mels,
            min_frequency=0.0,
            max_frequency=SAMPLE_RATE_HZ / 2,
            sampling_rate=SAMPLE_RATE_HZ,
            norm="slaney",
            mel_scale="slaney",
        )
        self.mel_filters = torch.from_numpy(filters.T.astype(np.float32)).to(self.device)
        self.hann = torch.hann_window(N_FFT, device=self.device)

    def log_mel(self, samples: np.ndarray) -> Any:
        """Whisper's log-mel features of up to 30 s of audio, zero-padded to the window."""
        import torch

        audio = torch.zeros(WINDOW_S * SAMPLE_RATE_HZ, device=self.device)
        clip = torch.from_numpy(samples[: audio.numel()]).to(self.device)
        audio[: clip.numel()] = clip
        stft = torch.stft(audio, N_FFT, HOP, window=self.hann, return_complex=True)
        power = stft[:, :-1].abs() ** 2
        mel = (self.mel_filters @ power).clamp(min=1e-10).log10()
        mel = torch.maximum(mel, mel.max() - 8.0)
        return ((mel + 4.0) / 4.0)[None].to(self.dtype)

    def _window(self, samples: np.ndarray, beam_size: int = 1, min_tokens: int = 0) -> tuple[str, float]:
        import torch

        with torch.inference_mode():
            tokens, no_speech = self.search.decode(self.log_mel(samples), beam_size, min_tokens)
        return self.tokenizer.decode(tokens).strip(), no_speech

    def warm_up(self) -> float:
        """Decode 1 s of faint noise greedily and with the beam, for a question's length; returns ms.

        Noise alone ends after a token or two, which left the first real turn's ASR at ~220 ms
        on the H200 against ~30 ms warm (the kernels of longer decodes were first met then):
        the end token is held off for :data:`WARM_TOKENS`.
        """
        noise = np.random.default_rng(0).standard_normal(SAMPLE_RATE_HZ).astype(np.float32) * 0.003
        start_ns = time.monotonic_ns()
        for beam_size in (1, self.options.beam_size):  # partials' path, then full transcripts'
            self._window(noise, beam_size, WARM_TOKENS)
        return (time.monotonic_ns() - start_ns) / 1e6

    def phrase_logprobs(self, audio: np.ndarray, phrases: list[str]) -> list[float]:
        """How likely each of ``phrases`` is as the transcript of ``audio`` (mean log-probability a token).

        As :meth:`assistant.stages.asr.Transcriber.phrase_logprobs`, on the 30 s window.
        """
        import torch

        samples = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
        if samples.size < MIN_AUDIO_S * SAMPLE_RATE_HZ:
            return [-np.inf] * len(phrases)
        tokens = [self.tokenizer.encode(" " + p.strip(), add_special_tokens=False).ids for p in phrases]
        with torch.inference_mode():
            return self.search.phrase_logprobs(self.log_mel(samples), tokens)

    def transcribe(
        self, audio: np.ndarray, quick: bool = False, long_form: bool = False, partial: bool = False
    ) -> TranscriptResult:
        """Transcribe one utterance of 16 kHz mono float32 samples in [-1, 1].

        As :meth:`assistant.stages.asr.Transcriber.transcribe`: ``quick`` and ``partial`` decode
        greedily (there is one window here, nothing to fall back to), else a beam of
        ``beam_size``. Audio longer than the 30 s window is cut at quiet points and each clip
        decoded alone (``long_form`` cuts shorter audio the same way: one clip).
        """
        samples = np.ascontiguousarray(audio, dtype=np.float32).squeeze()
        if samples.ndim > 1:
            raise ValueError(f"ASR takes mono audio, got shape {audio.shape}")
        samples = samples.reshape(-1)
        audio_ms = 1000.0 * samples.size / SAMPLE_RATE_HZ
        language = self.options.language or "en"
        if samples.size < MIN_AUDIO_S * SAMPLE_RATE_HZ:
            return TranscriptResult("", audio_ms, 0.0, language, 1.0)
        start_ns = time.monotonic_ns()
        cuts = quiet_clips(samples)
        texts, no_speech = [], 0.0
        for begin, end in zip(cuts, cuts[1:], strict=False):
            text, doubt = self._window(samples[begin:end], 1 if quick or partial else self.options.beam_size)
            texts.append(text)
            no_speech = max(no_speech, doubt)
        asr_ms = (time.monotonic_ns() - start_ns) / 1e6
        return TranscriptResult(
            " ".join(t for t in texts if t), audio_ms, asr_ms, language, no_speech, len(cuts) - 1
        )
