"""INT8 post-training calibration (full TensorRT): representative snippets and the calibrator.

TensorRT measures the activation ranges of the fp32 graph on these snippets and derives the
INT8 scale factors from them (entropy calibration). The snippets are short spoken-style turns
of the kind the voice assistant handles; unlabelled, only their activations matter. They are
packed into chunks of one fixed length because TensorRT calibrates at a single shape (the
calibration profile), with an empty KV cache. The resulting scales are saved in the tuning
cache folder and reused while the graph and the snippets stay the same.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from engines.onnx_export import INPUT_IDS, POSITION_IDS
from engines.tensorrt import tuning
from engines.tensorrt.cuda_mem import DeviceBuffer, check, cudart

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = "You are a friendly voice assistant. Answer in one to three short spoken sentences."
SNIPPETS: tuple[tuple[str, str], ...] = (
    ("What's the weather like tomorrow?", "I can't check live weather, but a forecast app will tell you."),
    (
        "Set a timer for ten minutes.",
        "I can't set timers yet, but ten minutes starts now if you watch the clock.",
    ),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Tell me a short joke.", "Why did the scarecrow win an award? He was outstanding in his field."),
    ("How do I boil an egg?", "Put it in boiling water for about nine minutes, then cool it in cold water."),
    ("Can you recommend a good book?", "Try The Hobbit by Tolkien; it's a warm, exciting adventure."),
    ("What time zone is Tokyo in?", "Tokyo uses Japan Standard Time, nine hours ahead of UTC."),
    ("Uh, how far is the moon?", "The moon is about three hundred eighty-four thousand kilometres away."),
    ("Thanks, that's all for now.", "You're welcome. Talk to you soon!"),
    (
        "Explain photosynthesis simply.",
        "Plants use sunlight, water and carbon dioxide to make sugar and oxygen.",
    ),
    ("How many ounces are in a pound?", "There are sixteen ounces in a pound."),
    ("Remind me what we talked about.", "We talked about the moon, a book to read, and how to boil an egg."),
    ("Translate good morning into Spanish.", "Good morning in Spanish is buenos días."),
    ("What should I cook tonight?", "How about a quick vegetable stir fry with rice?"),
    (
        "Is it safe to run every day?",
        "For most people, yes, if you start slowly and rest when something hurts.",
    ),
    ("Sing me something.", "I can't sing, but I can tell you the words of a lullaby."),
)


def calibration_ids(tokenizer: Any) -> list[list[int]]:
    """Each snippet as a chat-templated conversation, tokenized with the model's tokenizer."""
    out = []
    for question, answer in SNIPPETS:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False)  # as the dialogue does
        out.append(list(tokenizer.encode(text, add_special_tokens=False)))
    return out


def pack(ids: list[list[int]], length_tokens: int) -> list[list[int]]:
    """The snippets concatenated and cut into chunks of ``length_tokens`` (a short tail dropped).

    Every calibration batch then has the calibration profile's one shape.
    """
    stream = [t for snippet in ids for t in snippet]
    return [stream[i : i + length_tokens] for i in range(0, len(stream) - length_tokens + 1, length_tokens)]


def make_calibrator(trt: Any, ids: list[list[int]], cache_path: Path, length_tokens: int) -> Any:
    """An ``IInt8EntropyCalibrator2`` of ``trt`` feeding packed snippets at ``length_tokens``.

    It holds GPU buffers until its ``free()`` (the builder calls it after the build).

    Raises:
        ValueError: The snippets do not fill one chunk.
    """
    chunks = pack(ids, length_tokens)
    if not chunks:
        raise ValueError(f"calibration snippets hold fewer than {length_tokens} tokens")

    class Calibrator(trt.IInt8EntropyCalibrator2):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self.length_tokens = length_tokens
            self.index = 0
            self.ids = DeviceBuffer(length_tokens * 8)
            self.positions = DeviceBuffer(length_tokens * 8)
            self.empty = DeviceBuffer(256)  # zero-length past tensors still need an address
            _upload(self.positions.ptr, np.arange(length_tokens, dtype=np.int64))

        def free(self) -> None:
            """Release the device buffers (idempotent)."""
            for buffer in (self.ids, self.positions, self.empty):
                buffer.free()

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names: list[str]) -> list[int] | None:
            if self.index >= len(chunks) or not self.ids.ptr:
                return None
            _upload(self.ids.ptr, np.asarray(chunks[self.index], dtype=np.int64))
            self.index += 1
            logger.debug("calibration batch %d/%d", self.index, len(chunks))
            pointers = {INPUT_IDS: self.ids.ptr, POSITION_IDS: self.positions.ptr}
            return [pointers.get(name, self.empty.ptr) for name in names]

        def read_calibration_cache(self) -> bytes | None:
            return tuning.load_blob(cache_path, "calibration")

        def write_calibration_cache(self, data: Any) -> None:
            tuning.save_blob(cache_path, bytes(memoryview(data)), "calibration")

    return Calibrator()


def _upload(ptr: int, array: np.ndarray) -> None:
    rt = cudart()
    kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
    check(rt.cudaMemcpy(ptr, array.ctypes.data, array.nbytes, kind), "cudaMemcpy")
