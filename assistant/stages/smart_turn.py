"""Smart Turn v3.2 (pipecat's end-of-turn model): its features and one scoring call, no policy.

The model reads the last 8 s of a 16 kHz utterance as Whisper log-mel features and returns
the probability that the speaker has finished the turn. The recipe follows pipecat 1.14.0
(``local_smart_turn_v3.py`` and ``_whisper_features.py``): keep the last 8 s or left-pad
with zeros to 8 s, normalise the waveform to zero mean and unit variance, then 80 Whisper
mel bands with a 160-sample hop: a float32 ``(80, 800)`` array.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from store.bundled import BUNDLED, DEFAULT_TURN, ModelStore
from store.records import HashMemo, sha256_file

if TYPE_CHECKING:
    from faster_whisper.feature_extractor import FeatureExtractor

SAMPLE_RATE_HZ = 16000
WINDOW_S = 8
WINDOW_SAMPLES = WINDOW_S * SAMPLE_RATE_HZ
NORMALIZE_EPS = 1e-7  # transformers' WhisperFeatureExtractor zero-mean unit-variance epsilon
FETCH_HINT = f"run 'assistant models fetch {DEFAULT_TURN}'"


class TurnModelError(RuntimeError):
    """The Smart Turn model file is missing or damaged."""


@dataclass(frozen=True)
class TurnScore:
    """One end-of-turn estimate.

    Attributes:
        probability: Probability that the turn is complete, in [0, 1].
        inference_ms: Features plus model run, on the monotonic clock.
    """

    probability: float
    inference_ms: float


@functools.cache
def _extractor() -> FeatureExtractor:
    from faster_whisper.feature_extractor import FeatureExtractor

    return FeatureExtractor(feature_size=80, sampling_rate=SAMPLE_RATE_HZ, hop_length=160, n_fft=400)


def whisper_features(audio: np.ndarray) -> np.ndarray:
    """Smart Turn's input features of a 16 kHz mono utterance.

    Args:
        audio: Samples in [-1, 1], any length; only the last 8 s are used.

    Returns:
        Float32 log-mel features of shape ``(80, 800)``.
    """
    x = np.asarray(audio, np.float32).reshape(-1)[-WINDOW_SAMPLES:]
    x = np.pad(x, (WINDOW_SAMPLES - x.size, 0))  # silence in front: the end of the turn stays last
    x = (x - x.mean()) / np.sqrt(x.var() + NORMALIZE_EPS)
    # padding=0: exactly 8 s gives 801 centred frames, of which faster-whisper drops the last.
    return np.asarray(_extractor()(x, padding=0), np.float32)


class SmartTurn:
    """The Smart Turn v3.2 ONNX model on the CPU.

    ``score()`` always runs a full 8 s window, so its cost does not depend on the input
    length. On the shared 2-core development machine, idle, after warm-up (medians of 20 in
    the quietest runs; minima in brackets): threads=1: 2 s input 86-107 ms (80), 8 s input
    106-112 ms (80); threads=2: 2 s 83-103 ms (67), 8 s 89-91 ms (67). The features take
    4-16 ms of that.
    """

    def __init__(
        self, path: Path, threads: int = 1, sha256: str | None = None, memo: HashMemo | None = None
    ) -> None:
        """Verify and load the model file.

        Args:
            path: The ``.onnx`` file.
            threads: ONNX Runtime intra-op threads.
            sha256: Expected digest of the file; the pinned one of the bundled model if None.
            memo: Where the file's sha256 is remembered by its size and mtime (the store's
                :class:`~store.records.HashMemo`): an unchanged file is not hashed again;
                ``None`` hashes it in full. A file that fails to load is hashed again.

        Raises:
            TurnModelError: The file is missing, damaged or not loadable.
        """
        import onnxruntime

        expected = sha256 or BUNDLED[DEFAULT_TURN].file_sha256
        try:
            actual = memo.sha256(path) if memo is not None else sha256_file(path)
        except OSError as e:
            raise TurnModelError(f"cannot read the end-of-turn model {path}: {e}; {FETCH_HINT}") from e
        if actual != expected:
            raise TurnModelError(f"the end-of-turn model {path} is damaged (sha256 mismatch); {FETCH_HINT}")
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1  # sequential graph: the inter-op pool is never used
        # Spinning pool threads fought numpy's feature code for the 2 cores (threads=2: 120 -> 70 ms).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 4
        try:
            self.session = onnxruntime.InferenceSession(
                str(path), providers=["CPUExecutionProvider"], sess_options=opts
            )
        except Exception as e:  # onnxruntime raises its own, unexported exception types
            if memo is not None and memo.sha256(path, full=True) != expected:  # changed in place
                raise TurnModelError(
                    f"the end-of-turn model {path} is damaged (sha256 mismatch); {FETCH_HINT}"
                ) from e
            raise TurnModelError(f"cannot load the end-of-turn model {path}: {e}; {FETCH_HINT}") from e
        self.input_name = self.session.get_inputs()[0].name  # "input_features"

    @classmethod
    def from_store(cls, store: ModelStore, name: str = DEFAULT_TURN, threads: int = 1) -> SmartTurn:
        """Load a bundled turn model from the model store.

        Raises:
            TurnModelError: Unknown name, or the model is missing or damaged.
        """
        spec = BUNDLED.get(name)
        if spec is None or spec.kind != "turn":
            raise TurnModelError(f"no bundled end-of-turn model {name!r}; use {DEFAULT_TURN!r}")
        path = store.path(name) / spec.member_prefix.rsplit("/", 1)[-1]
        return cls(path, threads, spec.file_sha256, store.hash_memo())

    def score(self, audio: np.ndarray) -> TurnScore:
        """Probability that the speaker finished the turn at the end of ``audio``.

        Args:
            audio: 16 kHz mono samples in [-1, 1] up to now; only the last 8 s count.
        """
        t0_ns = time.monotonic_ns()
        features = whisper_features(audio)[None]
        outputs: list[Any] = self.session.run(None, {self.input_name: features})
        # The graph ends in a Sigmoid: its "logits" output is already a probability.
        probability = float(np.asarray(outputs[0]).reshape(-1)[0])
        return TurnScore(probability, (time.monotonic_ns() - t0_ns) / 1e6)

    def warm_up(self) -> float:
        """Score 1 s of faint noise (first-run allocations); returns its time in ms."""
        noise = np.random.default_rng(0).standard_normal(SAMPLE_RATE_HZ).astype(np.float32) * 1e-3
        return self.score(noise).inference_ms
