"""Run a TensorRT / TensorRT-RTX engine as the decoder's step, with cuda-python and no torch.

The KV cache stays on the GPU in two buffer sets sized for the whole context: ``past`` is
bound to the current set and ``present`` to the other (``set_tensor_address``), and they swap
after each step, the scheme of the ONNX Runtime twin. Cutting the cache back to a common
prefix copies that prefix into the spare set once (``cudaMemcpy2DAsync``). Prefill runs on a
context of the prefill profile (prompts longer than its maximum go in chunks), decode on a
context of the decode profile when the engine has one (else on the prefill context). Only
the last token's logits come back to the host.

No real engine ran this on the project's machines: TensorRT-RTX refuses the H200 (compute
capability 9.0) and full TensorRT is not installable there (``docs/engines.md``). CI runs it
against a CPU stand-in of the TensorRT and CUDA calls that executes the ONNX export
(``tests/helpers/trt_standin.py``); the ``gpu_tensorrt`` tests exercise it on a machine that has
TensorRT and a supported GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engines.base import Backend, BackendIdentity
from engines.onnx_export import INPUT_IDS, past_names, present_names
from engines.tensorrt import cache, tuning
from engines.tensorrt.bindings import EngineRuntimeError, StepTensors
from engines.tensorrt.cuda_mem import GpuInfo, GraphCache, Stream
from engines.tensorrt.flavour import Flavour, create_context, runtime_config, validity_problem
from engines.tensorrt.progress import make_logger
from models.config import DecoderConfig

logger = logging.getLogger(__name__)

PREFILL, DECODE = 0, 1  # optimization profile indices, as the builder adds them


class EngineIncompatible(RuntimeError):
    """The engine cannot run here (other TensorRT version, GPU or driver, or a damaged file).

    ``rebuild_helps``: building the engine again can fix it (another TensorRT version wrote it,
    or the file is damaged or foreign); false when the reason is this machine (a compute
    capability the engine's targets lack, too old a driver, too little GPU memory).
    """

    def __init__(self, message: str, *, rebuild_helps: bool = True) -> None:
        super().__init__(message)
        self.rebuild_helps = rebuild_helps


def runtime_cache_path(cache_dir: Path, flavour: Flavour, gpu: GpuInfo) -> Path:
    """Where the TensorRT-RTX runtime cache of this GPU and version lives."""
    name = f"runtime-{flavour.name}-{flavour.version}-{cache.slug(gpu.name)}.bin"
    return cache_dir / cache.CACHES_DIR / name


def open_engine(flavour: Flavour, runtime: Any, engine_blob: bytes) -> Any:
    """Deserialize ``engine_blob`` (``ICudaEngine``) once TensorRT says it runs here.

    Raises:
        EngineIncompatible: TensorRT will not deserialize the engine on this GPU, or it lacks
            the prefill (and decode) profiles.
    """
    invalid = validity_problem(flavour, runtime, engine_blob)
    if invalid is not None:
        raise EngineIncompatible(
            f"{flavour.name} {flavour.version} will not run this engine here: {invalid.problem}",
            rebuild_helps=invalid.rebuild_helps,
        )
    engine = runtime.deserialize_cuda_engine(engine_blob)
    if engine is None:
        raise EngineIncompatible(f"{flavour.name} {flavour.version} could not deserialize the engine")
    profiles = engine.num_optimization_profiles
    if profiles not in (1, 2):
        raise EngineIncompatible(f"expected a prefill (and a decode) profile, the engine has {profiles}")
    return engine


def _runtime_config(flavour: Flavour, engine: Any, runtime_cache: Path | None, cuda_graphs: bool) -> Any:
    """TensorRT-RTX's runtime configuration with the runtime cache loaded (None on full TensorRT)."""
    blob = tuning.load_blob(runtime_cache, "runtime") if runtime_cache else None
    handle = runtime_config(flavour, engine, blob, cuda_graphs)
    if handle is not None and not handle.attached:
        logger.warning("TensorRT-RTX refused set_runtime_cache: kernels compiled in this run are not kept")
    elif handle is not None and blob and not handle.loaded:
        logger.warning(
            "TensorRT-RTX rejected the runtime cache %s (other version, GPU or driver)", runtime_cache
        )
    return handle


def profile_contexts(engine: Any, handle: Any, profiles: int, stream: Stream) -> list[Any]:
    """One execution context per optimization profile, each set to its profile on ``stream``.

    Raises:
        EngineRuntimeError: TensorRT could not create a context or refused its profile.
    """
    contexts = []
    for profile in range(profiles):
        context = create_context(engine, handle)
        if context is None:
            raise EngineRuntimeError("TensorRT could not create an execution context (GPU memory?)")
        contexts.append(context)
        if not context.set_optimization_profile_async(profile, stream.handle):
            raise EngineRuntimeError(
                f"TensorRT refused set_optimization_profile_async({profile}) "
                f"(the engine has {profiles} profile(s))"
            )
    return contexts


class TensorRTStep:
    """A :class:`~engines.base.StepModel` over a deserialized engine.

    Args:
        flavour: The TensorRT flavour the engine was built with.
        engine_blob: The serialized engine.
        config: The decoder's architecture (layers, KV heads, head size, vocabulary).
        capacity_tokens: Requested KV-cache size; capped by the engine's profile.
        cuda_graphs: Replay decode steps as CUDA graphs (see ``EngineOptions.cuda_graphs``).
        runtime_cache: TensorRT-RTX runtime cache file (loaded now, saved by
            :meth:`save_runtime_cache`); ``None`` for full TensorRT.
        precision: What the engine was built in (``fp16``, ``int8``...): part of its identity.

    Raises:
        EngineIncompatible: TensorRT will not deserialize the engine on this GPU.
    """

    def __init__(
        self,
        flavour: Flavour,
        engine_blob: bytes,
        config: DecoderConfig,
        capacity_tokens: int,
        *,
        cuda_graphs: bool = False,
        runtime_cache: Path | None = None,
        precision: str = "",
    ) -> None:
        trt = flavour.trt
        self.flavour, self.config = flavour, config
        self.identity = BackendIdentity(Backend(flavour.name), "cuda", precision, version=flavour.version)
        self.name = self.identity.describe()  # shown in the UI and the latency records
        self.runtime = trt.Runtime(make_logger(trt))
        self.engine = open_engine(flavour, self.runtime, engine_blob)
        profiles = self.engine.num_optimization_profiles
        self.past_names, self.present_names = past_names(config.num_layers), present_names(config.num_layers)
        ids_min, _, ids_max = self.engine.get_tensor_profile_shape(INPUT_IDS, PREFILL)
        self.prefill_min, self.prefill_max = int(ids_min[1]), int(ids_max[1])
        decode = DECODE if profiles == 2 else PREFILL
        past_max = int(self.engine.get_tensor_profile_shape(self.past_names[0], decode)[2][2])
        self.capacity_tokens = min(capacity_tokens, past_max + 1)
        self.runtime_cache_file = runtime_cache
        self.handle = _runtime_config(flavour, self.engine, runtime_cache, cuda_graphs)
        self.np_dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(self.past_names[0])))
        self.row_bytes = config.head_dim * self.np_dtype.itemsize  # one position of one head
        self.current = 0  # buffer set holding the cache
        self.length_tokens = 0
        self.warmup_ms: float | None = None
        self.engine_path: Path | None = None  # set by the loader; the verify gate marks it
        self.closed = False
        # Everything below holds GPU resources: a failure half-way releases what was made.
        self.contexts: list[Any] = []
        self.memory: StepTensors | None = None
        self.graphs: GraphCache | None = None
        self.capturing = cuda_graphs  # False after a capture failed
        self.stream = Stream()
        try:
            self._allocate(profiles, cuda_graphs)
        except BaseException:
            self._release()
            raise

    def _allocate(self, profiles: int, cuda_graphs: bool) -> None:
        config = self.config
        self.contexts = profile_contexts(self.engine, self.handle, profiles, self.stream)
        self.memory = StepTensors(config, self.capacity_tokens, self.row_bytes)
        m = self.memory
        self.kv, self.ids, self.positions, self.logits = m.kv, m.ids, m.positions, m.logits
        self.host_ids, self.host_positions, self.host_logits = m.host_ids, m.host_positions, m.host_logits
        # Full TensorRT: our own capture per decode shape. RTX: its built-in strategy instead.
        self.graphs = GraphCache(self.stream) if cuda_graphs and not self.flavour.is_rtx else None
        self.stream.synchronize()

    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        """Run ``token_ids`` at ``start_pos`` and return the last token's fp32 logits.

        Raises:
            ValueError: ``start_pos`` is beyond the cached positions, or the cache would overflow.
            EngineRuntimeError: TensorRT failed to enqueue the step.
        """
        if self.closed:
            raise EngineRuntimeError(f"{self.name}: the engine was closed")
        count = len(token_ids)
        if count == 0 or start_pos > self.length_tokens or start_pos + count > self.capacity_tokens:
            raise ValueError(
                f"cannot run {count} tokens at {start_pos}: cache holds {self.length_tokens} "
                f"of {self.capacity_tokens}"
            )
        if start_pos < self.length_tokens:
            self._truncate(start_pos)
        done = 0
        while done < count:
            piece = list(token_ids[done : done + self.prefill_max])
            if 1 < len(piece) < self.prefill_min:  # shorter than the prefill profile: decode them
                piece = piece[:1]
            self._run(piece)
            done += len(piece)
        self.stream.copy(self.host_logits.ptr, self.logits.ptr, self.host_logits.nbytes, "d2h")
        self.stream.synchronize()  # the caller's clock reads after the GPU finished
        return self.host_logits.array.copy()

    def _truncate(self, length: int) -> None:
        """Keep the first ``length`` positions: copy them, compacted, into the spare buffers."""
        old, new = self.kv[self.current], self.kv[1 - self.current]
        if length:
            width = length * self.row_bytes
            for src, dst in zip(old, new, strict=True):
                pitch = self.length_tokens * self.row_bytes
                self.stream.copy_rows(dst.ptr, width, src.ptr, pitch, width, self.config.num_kv_heads)
        self.current, self.length_tokens = 1 - self.current, length

    def _run(self, ids: list[int]) -> None:
        count, past = len(ids), self.length_tokens
        graph_step = self.graphs is not None and count == 1
        if graph_step and self.current != past % 2:
            # A decode graph binds fixed buffers: the one at ``past`` reads set ``past % 2``.
            # Moving the cache there (once per turn at most) lets every conversation replay the
            # graphs of the positions it reaches, whatever ran before.
            self._truncate(past)
        # Each chunk of a long prompt writes its own slots (positions past...): a copy still
        # queued for an earlier chunk reads bytes nothing overwrote. ``forward`` synchronises
        # before returning, so the next call may reuse them.
        host_ids = self.host_ids.array[past : past + count]
        host_positions = self.host_positions.array[past : past + count]
        host_ids[:] = ids
        host_positions[:] = np.arange(past, past + count)
        self.stream.copy(self.ids.ptr, self.host_ids.ptr + past * 8, count * 8, "h2d")
        self.stream.copy(self.positions.ptr, self.host_positions.ptr + past * 8, count * 8, "h2d")
        if graph_step and self.graphs is not None and self.graphs.launch(past):
            self._advance(count)
            return
        context = self.contexts[DECODE if count == 1 and len(self.contexts) == 2 else PREFILL]
        assert self.memory is not None
        self.memory.bind(context, self.current, count, past)
        if not context.execute_async_v3(self.stream.handle):
            raise EngineRuntimeError(f"execute_async_v3 failed ({count} tokens at {past})")
        if graph_step and self.graphs is not None and self.capturing:
            # Captured after a normal run of this shape, as TensorRT requires; replayed when
            # the position comes back (with the same buffer set, see above).
            if not self.graphs.capture(past, lambda: context.execute_async_v3(self.stream.handle)):
                self.capturing = False
                logger.warning(
                    "%s: CUDA graph capture failed at position %d; decoding without new graphs",
                    self.name, past,
                )  # fmt: skip
        self._advance(count)

    def _advance(self, count: int) -> None:
        self.current, self.length_tokens = 1 - self.current, self.length_tokens + count

    def warm_up(self, prefill_tokens: int, context_tokens: int) -> float:
        """Run the profile's typical shapes once (JIT, allocation, caches); returns the time in ms.

        Prefill of ``prefill_tokens`` from an empty cache, decode steps, then a prefill on top
        of a ``context_tokens`` cache (a later turn); the cache is left empty.
        """
        start_ns = time.monotonic_ns()
        first = max(1, min(prefill_tokens, self.capacity_tokens - 8))
        self.forward([0] * first, 0)
        for i in range(4):
            self.forward([0], first + i)
        later = max(0, min(context_tokens, self.capacity_tokens - first - 4))
        if later > self.length_tokens:
            self.forward([0] * (later - self.length_tokens), self.length_tokens)
        if self.length_tokens + first <= self.capacity_tokens:
            self.forward([0] * first, self.length_tokens)
        self._truncate(0)
        self.stream.synchronize()
        self.warmup_ms = (time.monotonic_ns() - start_ns) / 1e6
        self.save_runtime_cache()
        return self.warmup_ms

    def save_runtime_cache(self) -> None:
        """Persist the TensorRT-RTX runtime cache (kernels JIT-compiled so far)."""
        if self.handle is not None and self.handle.attached and self.runtime_cache_file is not None:
            tuning.save_blob(self.runtime_cache_file, self.handle.serialize(), "runtime")

    def close(self) -> None:
        """Save the runtime cache and release GPU memory, graphs and the stream (idempotent)."""
        if self.closed:
            return
        try:
            self.save_runtime_cache()
        finally:
            self._release()

    def _release(self) -> None:
        """Free whatever GPU resources exist (also those of a half-finished ``__init__``)."""
        self.closed = True
        if self.graphs is not None:
            self.graphs.clear()
        if self.memory is not None:
            self.memory.free()
        self.contexts.clear()
        self.stream.destroy()
