"""ONNX Runtime backend: the exported decoder graph on the CPU, the verified twin of TensorRT.

It runs the very file TensorRT compiles (``engines/onnx_export.py``), so CI checks the export
against the PyTorch reference without a GPU, and it is a CPU backend of its own for the voice
loop. Generation (sampling, streaming, stops, prefix reuse, cancellation) is the shared
:class:`~engines.driver.DecoderDriver`; this module only implements the step.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from engines.base import Backend, BackendIdentity
from engines.driver import DecoderDriver, Detokenizer
from engines.onnx_export import (
    INPUT_IDS,
    LAST_LOGITS,
    POSITION_IDS,
    ExportError,
    ExportOptions,
    check_export,
    export_decoder,
    past_names,
    present_names,
)
from engines.onnxruntime_graph import graph_to_load
from engines.progress import ProgressCallback
from models.config import DecoderConfig

logger = logging.getLogger(__name__)

NUMPY_DTYPES = {"fp32": np.float32, "fp16": np.float16}


@dataclass(frozen=True)
class OnnxRuntimeOptions:
    """How the ONNX Runtime backend runs.

    ``dtype`` picks the export: ``fp32`` (default) or ``fp16`` (the graph TensorRT builds
    FP16 engines from; on the CPU ONNX Runtime upcasts most of its nodes, so it is checked
    here, not fast). ``threads`` 0 means one per core, at most 4. ``spin`` lets idle worker
    threads busy-wait between steps: a little faster alone, but on a small CPU it starves the
    ASR and TTS threads of the voice loop, so it is off by default.
    """

    dtype: str = "fp32"
    threads: int = 0
    capacity_tokens: int = 2048
    spin: bool = False


class OnnxRuntimeStep:
    """One ``InferenceSession.run`` per step, with the KV cache in two preallocated buffers.

    The graph reads ``past`` (length P) and returns ``present`` (length P + T). Both are bound
    to buffers owned here (IO binding, no allocation per step): ``present`` is written into
    the spare buffer, which then becomes the current one. Each buffer holds a compact
    ``[kv_heads, length, head_dim]`` tensor per layer; cutting the cache back to a prefix (the
    driver's prefix reuse) copies that prefix into the spare buffer once.
    """

    def __init__(
        self, session: ort.InferenceSession, config: DecoderConfig, capacity_tokens: int, dtype: str
    ) -> None:
        self.session = session
        self.config = config
        self.capacity_tokens = capacity_tokens
        self.identity = BackendIdentity(Backend.ONNXRUNTIME, "cpu", dtype)
        self.name = self.identity.describe()
        self.np_dtype = NUMPY_DTYPES[dtype]
        self.past_names = past_names(config.num_layers)
        self.present_names = present_names(config.num_layers)
        per_tensor = config.num_kv_heads * capacity_tokens * config.head_dim
        self.buffers = [
            [np.zeros(per_tensor, dtype=self.np_dtype) for _ in self.past_names] for _ in range(2)
        ]
        self.current = 0  # index of the buffer set holding the cache
        self.length_tokens = 0  # positions the current buffers hold
        self.logits = np.zeros((1, config.vocab_size), dtype=np.float32)
        self.binding = session.io_binding()

    def _shape(self, length: int) -> tuple[int, int, int, int]:
        return (1, self.config.num_kv_heads, length, self.config.head_dim)

    def _truncate(self, length: int) -> None:
        """Keep the first ``length`` positions: copy them, compacted, into the spare buffers."""
        kvh, d = self.config.num_kv_heads, self.config.head_dim
        old, new = self.buffers[self.current], self.buffers[1 - self.current]
        for src, dst in zip(old, new, strict=True):
            held = src[: kvh * self.length_tokens * d].reshape(kvh, self.length_tokens, d)
            dst[: kvh * length * d].reshape(kvh, length, d)[:] = held[:, :length]
        self.current, self.length_tokens = 1 - self.current, length

    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        """Run ``token_ids`` at ``start_pos`` and return the last token's fp32 logits.

        Raises:
            ValueError: ``start_pos`` is beyond the cached positions, or the cache would overflow.
        """
        count = len(token_ids)
        if start_pos > self.length_tokens or start_pos + count > self.capacity_tokens:
            raise ValueError(
                f"cannot run {count} tokens at {start_pos}: cache holds {self.length_tokens} "
                f"of {self.capacity_tokens}"
            )
        if start_pos < self.length_tokens:
            self._truncate(start_pos)
        ids = np.asarray([token_ids], dtype=np.int64)
        positions = np.arange(start_pos, start_pos + count, dtype=np.int64)[None]
        b = self.binding
        b.clear_binding_inputs()
        b.clear_binding_outputs()
        b.bind_cpu_input(INPUT_IDS, ids)
        b.bind_cpu_input(POSITION_IDS, positions)
        past, present = self.buffers[self.current], self.buffers[1 - self.current]
        past_shape, present_shape = self._shape(start_pos), self._shape(start_pos + count)
        for name, buf in zip(self.past_names, past, strict=True):
            b.bind_input(name, "cpu", 0, self.np_dtype, past_shape, buf.ctypes.data)
        for name, buf in zip(self.present_names, present, strict=True):
            b.bind_output(name, "cpu", 0, self.np_dtype, present_shape, buf.ctypes.data)
        b.bind_output(LAST_LOGITS, "cpu", 0, np.float32, self.logits.shape, self.logits.ctypes.data)
        self.session.run_with_iobinding(b)
        self.current, self.length_tokens = 1 - self.current, start_pos + count
        return self.logits[0].copy()

    def close(self) -> None:
        """Nothing to release beyond memory (the session goes with the step)."""


def session_options(options: OnnxRuntimeOptions) -> ort.SessionOptions:
    """CPU session settings: sequential graph, intra-op threads sized for small CPUs."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = options.threads or min(os.cpu_count() or 1, 4)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if options.spin else "0")
    return so


def load_onnxruntime_decoder(
    model_dir: Path,
    tokenizer: Detokenizer,
    options: OnnxRuntimeOptions,
    progress: ProgressCallback | None = None,
    *,
    config: DecoderConfig | None = None,
) -> DecoderDriver:
    """Export (or reuse the cached export of) the model in ``model_dir`` and run it on the CPU.

    ``config``: the model's, when the caller read it already (else read here).

    Raises:
        ExportError: The dtype is not exported, or the export fails or cannot be loaded.
        ModelNotFound: No model in ``model_dir``.
    """
    if options.dtype not in NUMPY_DTYPES:  # the export's bf16 is for TensorRT only
        raise ExportError(f"onnxruntime backend dtype {options.dtype!r} unsupported; use fp32 or fp16")
    config = config or DecoderConfig.from_dir(model_dir)
    exported = export_decoder(model_dir, ExportOptions(dtype=options.dtype), progress=progress)
    how = "cached" if exported.cache_hit else f"exported in {exported.export_s:.1f} s"
    graph, which = graph_to_load(exported.path.parent)
    start = time.monotonic()
    try:
        session = ort.InferenceSession(
            str(graph), session_options(options), providers=["CPUExecutionProvider"]
        )
    except Exception as e:  # onnxruntime raises its own exception types, not exported as a base
        # The start trusted the files' size and mtime; a failed load hashes every byte, so a
        # file changed in place is named (and, its memo updated, exported again next start).
        damage = check_export(exported.path.parent, full=True) if exported.cache_hit else None
        raise ExportError(
            f"onnxruntime cannot load {graph}: {e}"
            + (f" ({damage})" if damage else "")
            + "; re-export with 'assistant engine export --force'"
        ) from e
    capacity = min(options.capacity_tokens, config.max_position_embeddings)
    logger.info(
        "onnxruntime: %s (%s; %s), session %.1f s, KV cache %d tokens",
        graph,
        how,
        which,
        time.monotonic() - start,
        capacity,
    )
    step = OnnxRuntimeStep(session, config, capacity, options.dtype)
    status = "ONNX export cache hit" if exported.cache_hit else f"ONNX exported in {exported.export_s:.0f} s"
    if exported.notice:
        status += f" ({exported.notice})"
    return DecoderDriver(step, tokenizer, config.eos_token_ids, status, config.rope_switch_tokens)
