"""The Silero VAD v6 model that ships inside faster-whisper, run chunk by chunk."""

from __future__ import annotations

import os

import numpy as np

from assistant.stages.streams import SAMPLE_RATE_HZ

CHUNK_SAMPLES = 512  # what Silero v6 takes at 16 kHz: 32 ms
CONTEXT_SAMPLES = 64  # samples of the previous chunk the model sees in front of each chunk
CHUNK_NS = CHUNK_SAMPLES * 1_000_000_000 // SAMPLE_RATE_HZ
CHUNK_MS = CHUNK_NS / 1e6


def silero_model_path() -> str:
    """The Silero VAD v6 ONNX file inside the faster-whisper package."""
    from faster_whisper.utils import get_assets_path

    return os.path.join(get_assets_path(), "silero_vad_v6.onnx")


class SileroStream:
    """Silero VAD run chunk by chunk, carrying its recurrent state between calls."""

    def __init__(self, model_path: str | None = None) -> None:
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 4
        self.session = onnxruntime.InferenceSession(
            model_path or silero_model_path(), providers=["CPUExecutionProvider"], sess_options=opts
        )
        self.reset()

    def reset(self) -> None:
        """Forget the recurrent state (start of a new stream)."""
        self.h = np.zeros((1, 1, 128), np.float32)
        self.c = np.zeros((1, 1, 128), np.float32)
        self.context = np.zeros(CONTEXT_SAMPLES, np.float32)

    def __call__(self, chunk: np.ndarray) -> float:
        """Speech probability of one 512-sample chunk."""
        window = np.concatenate([self.context, chunk])[None, :]
        prob, self.h, self.c = self.session.run(None, {"input": window, "h": self.h, "c": self.c})
        self.context = chunk[-CONTEXT_SAMPLES:]
        return float(prob.reshape(-1)[0])
