"""A CPU stand-in for the TensorRT and CUDA surface of ``engines/tensorrt/runtime.py``.

Why a stand-in: no TensorRT engine can execute on this project's machines. CI has no GPU,
TensorRT-RTX refuses the H200 (compute capability 9.0) and full TensorRT is not installable
there (``/work/shared/ENVIRONMENT.md``, ``docs/engines.md``). So the runtime is run against
this executable specification instead: the real :class:`~engines.tensorrt.runtime.TensorRTStep`
and :mod:`engines.tensorrt.cuda_mem` code, over

- :class:`FakeCuda` (``tests/helpers/standin_cuda.py``), the ``cuda.bindings.runtime`` calls
  ``cuda_mem`` makes (device and pinned memory, a stream with async copies, stream capture
  into CUDA graphs, graph launches), and
- :class:`FakeTensorRT`, the TensorRT / TensorRT-RTX module calls the runtime makes (runtime,
  engine tensor and profile queries, execution contexts, the RTX runtime config and cache),
  whose "kernel" executes the real exported ONNX decoder graph with ONNX Runtime, reading
  and writing the bytes of the fake device memory at the bound addresses.

It is strict where real hardware is silently wrong:

- ``lag="random"``: each new piece of work lets a random number of queued ones run (seeded),
  so the GPU is behind by a varying amount.
- ``lag="full"``: nothing queued on a stream runs before ``cudaStreamSynchronize`` (a GPU far
  behind the host). A pinned host buffer rewritten before its queued host-to-device copy ran
  raises :class:`OrderingError` when the copy runs; the destination of a device-to-host copy
  is filled with 0xFF (NaN / -1) when queued, so results read before synchronising are wrong.
- Freeing memory that queued work still uses, a tensor address outside any live allocation,
  an output overlapping an input, shapes outside the active optimization profile, running a
  context whose profile was never set, and capturing a context before it ran its current
  shapes once (as TensorRT requires) are all errors.
- As TensorRT does, ``set_tensor_address`` refuses (returns False) an address that is not
  256-byte aligned, and ``set_optimization_profile_async`` refuses a profile another live
  context of the engine already uses (each context needs its own).
- A device-to-device copy (``cudaMemcpyAsync``, ``cudaMemcpy2DAsync``, ``cudaMemcpy``) whose
  source and destination rows overlap raises :class:`OrderingError` (undefined in CUDA). A
  blocking ``cudaMemcpy`` runs on the legacy null stream, which waits for blocking streams but
  not for the runtime's ``cudaStreamNonBlocking`` one: if work queued there still uses either
  range, that is a race and raises :class:`OrderingError`.
- ``fail_capture="execute"`` makes ``execute_async_v3`` return False while the stream is
  capturing; ``fail_capture="invalidate"`` makes ``cudaStreamEndCapture`` report an
  invalidated capture; ``fail_calls`` makes named context calls return False.
- ``invalidity`` makes ``get_engine_validity`` refuse every engine with those diagnostics (what
  TensorRT-RTX says on a machine with an old driver, an unsupported GPU...); ``wrong_logits``
  makes the kernel negate the logits, a miscompiled engine the accuracy gate must refuse.

What it cannot tell: real kernels, timing and GPU memory limits; TensorRT's own numerics
(ONNX Runtime computes instead); asynchrony inside one stream (the queue runs in order); and
whether the real bindings accept these arguments at run time (``tests/unit/test_tensorrt_calls_exist.py``
checks names and signatures against the installed ``tensorrt_rtx`` bindings).
"""

from __future__ import annotations

import enum
import json
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from engines.onnx_export import INPUT_IDS, LAST_LOGITS, POSITION_IDS
from engines.tensorrt.options import EngineOptions, profile_shapes
from tests.helpers.standin_cuda import FakeCuda, Op, OrderingError

__all__ = ["FakeCuda", "FakeTensorRT", "OrderingError", "engine_blob"]

MAGIC = b"TRT-STANDIN\n"
VERSION = "stand-in"  # FakeTensorRT.__version__
ALIGNMENT = 256  # bytes: TensorRT refuses a tensor address that is not a multiple


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    INT64 = 11


NUMPY = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT64: np.int64}
ONNX_TYPES = {
    "tensor(float)": DataType.FLOAT,
    "tensor(float16)": DataType.HALF,
    "tensor(int64)": DataType.INT64,
}


class EngineValidity(enum.IntEnum):
    VALID = 0
    SUBOPTIMAL = 1
    INVALID = 2


class EngineInvalidityDiagnostics(enum.IntFlag):
    """TensorRT-RTX 1.7's members and values (``tests/unit/test_tensorrt_calls_exist.py`` checks them)."""

    VERSION_MISMATCH = 1
    UNSUPPORTED_CC = 2
    OLD_CUDA_DRIVER = 4
    OLD_CUDA_RUNTIME = 8
    INSUFFICIENT_GPU_MEMORY = 16
    MALFORMED_ENGINE = 32
    CUDA_ERROR = 64


class CudaGraphStrategy(enum.IntEnum):
    DISABLED = 0
    WHOLE_GRAPH_CAPTURE = 1


class ILogger:
    class Severity(enum.IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    def __init__(self) -> None:
        pass


def engine_blob(
    onnx_path: Path, options: EngineOptions, decode_profile: bool, version: str = VERSION
) -> bytes:
    """A serialized stand-in engine: the ONNX file, the builder's profile shapes and the TensorRT
    version that wrote it (another than :data:`VERSION` is refused as ``VERSION_MISMATCH``)."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    past = next(i for i in session.get_inputs() if i.name.startswith("past_key_values"))
    kv_heads, head_dim = int(past.shape[1]), int(past.shape[3])
    profiles = [
        {k: [list(r.min), list(r.opt), list(r.max)] for k, r in p.items()}
        for p in profile_shapes(options, kv_heads, head_dim, decode_profile)
    ]
    return MAGIC + json.dumps({"onnx": str(onnx_path), "profiles": profiles, "version": version}).encode()


class IRuntimeCache:
    """The RTX runtime cache: here, the set of shapes "JIT-compiled" so far."""

    def __init__(self) -> None:
        self.kernels: set[str] = set()

    def serialize(self) -> bytes:
        return MAGIC + json.dumps(sorted(self.kernels)).encode()

    def deserialize(self, blob: bytes) -> bool:
        data = bytes(blob)
        if not data.startswith(MAGIC):
            return False
        self.kernels |= set(json.loads(data[len(MAGIC) :]))
        return True


class IRuntimeConfig:
    def __init__(self, fail_calls: set[str] | None = None) -> None:
        self.fail_calls = fail_calls or set()
        self.cache: IRuntimeCache | None = None
        self.cuda_graph_strategy = CudaGraphStrategy.DISABLED

    def create_runtime_cache(self) -> IRuntimeCache:
        return IRuntimeCache()

    def set_runtime_cache(self, cache: IRuntimeCache) -> bool:
        if "set_runtime_cache" in self.fail_calls:
            return False
        self.cache = cache
        return True


class ICudaEngine:
    def __init__(self, trt: FakeTensorRT, onnx_path: str, profiles: list[dict[str, Any]]) -> None:
        self.trt = trt
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
        self.session = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: ONNX_TYPES[i.type] for i in self.session.get_inputs()}
        self.outputs = {o.name: ONNX_TYPES[o.type] for o in self.session.get_outputs()}
        self.profiles = profiles
        self.num_optimization_profiles = len(profiles)
        self.num_layers = sum(1 for n in self.inputs if n.endswith(".key"))
        self.contexts: weakref.WeakSet[IExecutionContext] = weakref.WeakSet()

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple[int, ...]]:
        kind = "ids" if name in (INPUT_IDS, POSITION_IDS) else "past"
        assert name in self.inputs, f"{name} is not an input"
        return [tuple(s) for s in self.profiles[profile_index][kind]]

    def get_tensor_dtype(self, name: str) -> DataType:
        return {**self.inputs, **self.outputs}[name]

    def create_execution_context(
        self, runtime_config: IRuntimeConfig | None = None
    ) -> IExecutionContext | None:
        if self.trt.fail_contexts_after == 0:
            return None
        self.trt.fail_contexts_after -= 1
        context = IExecutionContext(self, runtime_config)
        self.contexts.add(context)
        return context

    def create_runtime_config(self) -> IRuntimeConfig:
        return IRuntimeConfig(self.trt.fail_calls)


class IExecutionContext:
    def __init__(self, engine: ICudaEngine, config: IRuntimeConfig | None) -> None:
        self.engine, self.config = engine, config
        self.profile: int | None = None
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.ran_with: Any = None  # the shapes of the last normal run (capture needs one)

    @property
    def cuda(self) -> FakeCuda:
        return self.engine.trt.cuda

    def _fails(self, call: str) -> bool:
        return call in self.engine.trt.fail_calls

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        if self._fails("set_optimization_profile_async") or not 0 <= profile_index < len(
            self.engine.profiles
        ):
            return False
        self.cuda._stream(stream_handle)
        if any(c.profile == profile_index for c in self.engine.contexts if c is not self):
            return False  # TensorRT: "Profile N has been chosen by another IExecutionContext"
        self.profile, self.shapes = profile_index, {}
        return True

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        assert isinstance(name, str) and all(isinstance(d, int) for d in shape), (name, shape)
        if self._fails("set_input_shape") or name not in self.engine.inputs or self.profile is None:
            return False
        lo, _, hi = self.engine.get_tensor_profile_shape(name, self.profile)
        if len(shape) != len(lo) or any(not a <= d <= b for a, d, b in zip(lo, shape, hi, strict=True)):
            return False  # outside the profile: TensorRT logs an error and refuses
        self.shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name: str, memory: int) -> bool:
        assert isinstance(memory, int), memory
        if self._fails("set_tensor_address") or name not in {**self.engine.inputs, **self.engine.outputs}:
            return False
        if memory % ALIGNMENT:
            return False  # TensorRT: "Address is not aligned"; it requires 256-byte alignment
        self.addresses[name] = memory
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        stream = self.cuda._stream(stream_handle)
        capturing = stream.capturing is not None
        if capturing and self.cuda.fail_capture == "execute":
            return False
        if self.profile is None or set(self.shapes) != set(self.engine.inputs):
            return False
        if set(self.addresses) != {*self.engine.inputs, *self.engine.outputs}:
            return False
        shapes, addresses = dict(self.shapes), dict(self.addresses)
        if capturing and self.ran_with != (self.profile, shapes):
            return False  # TensorRT: run once after a shape change before capturing
        count, past = shapes[INPUT_IDS][1], shapes["past_key_values.0.key"][2]
        if shapes[POSITION_IDS] != shapes[INPUT_IDS]:
            return False
        regions = self._regions(shapes, count, past)
        ins = [(addresses[n], regions[n][1]) for n in self.engine.inputs]
        outs = [(addresses[n], regions[n][1]) for n in self.engine.outputs]
        for a, an in outs:
            for b, bn in [*ins, *[o for o in outs if o[0] != a]]:
                if a < b + bn and b < a + an:
                    raise OrderingError(f"output at {a:#x} overlaps another tensor at {b:#x}")
        for ptr, nbytes in [*ins, *outs]:
            self.cuda.check_live(ptr, nbytes)  # bound memory must be live and large enough
        if not capturing:
            self.ran_with = (self.profile, shapes)
        if self.config is not None and self.config.cache is not None:
            self.config.cache.kernels.add(f"{self.profile}:{count}")
        engine = self.engine

        def run() -> None:
            feed = {}
            for name in engine.inputs:
                shape, nbytes = regions[name]
                dtype = NUMPY[engine.inputs[name]]
                feed[name] = self.cuda.kernel_view(addresses[name], nbytes).view(dtype).reshape(shape).copy()
            expected = np.arange(past, past + count)
            assert np.array_equal(feed[POSITION_IDS][0], expected), "position_ids do not continue the cache"
            results = engine.session.run(list(engine.outputs), feed)
            if engine.trt.wrong_logits:  # a miscompiled engine: the least likely token wins
                names = list(engine.outputs)
                results = [-r if n == LAST_LOGITS else r for n, r in zip(names, results, strict=True)]
            for name, value in zip(engine.outputs, results, strict=True):
                shape, nbytes = regions[name]
                assert value.shape == shape, (name, value.shape, shape)
                self.cuda.kernel_view(addresses[name], nbytes)[:] = np.frombuffer(value.tobytes(), np.uint8)
            self.cuda.counts["kernel"] += 1

        uses = [*ins, *outs]
        what = f"execute profile {self.profile} ({count} tokens at {past})"
        self.cuda.enqueue(stream_handle, Op(what, run, uses, reads=ins, writes=outs))
        return True

    def _regions(self, shapes: dict[str, tuple[int, ...]], count: int, past: int) -> dict[str, Any]:
        kv = shapes["past_key_values.0.key"]
        out = {}
        for name, dtype in {**self.engine.inputs, **self.engine.outputs}.items():
            if name in shapes:
                shape = shapes[name]
            elif name == LAST_LOGITS:
                shape = (1, self.engine.session.get_outputs()[0].shape[1])
            else:
                shape = (kv[0], kv[1], past + count, kv[3])
            out[name] = (shape, int(np.prod(shape)) * np.dtype(NUMPY[dtype]).itemsize)
        return out


class Runtime:
    def __init__(self, logger: ILogger) -> None:
        self.logger = logger
        self.trt: FakeTensorRT  # set by FakeTensorRT.Runtime

    def deserialize_cuda_engine(self, serialized_engine: bytes) -> ICudaEngine | None:
        data = bytes(serialized_engine)
        if not data.startswith(MAGIC):
            return None
        spec = json.loads(data[len(MAGIC) :])
        if spec.get("version", VERSION) != VERSION:
            return None
        return ICudaEngine(self.trt, spec["onnx"], spec["profiles"])

    def get_engine_validity(self, buffer: bytes) -> tuple[EngineValidity, int]:
        data = bytes(buffer)
        if not data.startswith(MAGIC):
            return EngineValidity.INVALID, int(EngineInvalidityDiagnostics.MALFORMED_ENGINE)
        if json.loads(data[len(MAGIC) :]).get("version", VERSION) != VERSION:
            return EngineValidity.INVALID, int(EngineInvalidityDiagnostics.VERSION_MISMATCH)
        if self.trt.invalidity:
            return EngineValidity.INVALID, int(self.trt.invalidity)
        return EngineValidity.VALID, 0


class FakeTensorRT:
    """The ``tensorrt`` / ``tensorrt_rtx`` module as the runtime uses it.

    Args:
        cuda: The fake CUDA its contexts enqueue on.
        fail_calls: Context calls that return False (``set_input_shape``...).
        fail_contexts_after: Let this many ``create_execution_context`` calls succeed.

    Attributes:
        invalidity: ``EngineInvalidityDiagnostics`` that ``get_engine_validity`` reports for
            every well-formed engine (this machine refuses them: an old driver...); 0: none.
        wrong_logits: The kernel negates the logits (a miscompiled engine the gate must catch).
    """

    __version__ = VERSION
    DataType = DataType
    EngineValidity = EngineValidity
    EngineInvalidityDiagnostics = EngineInvalidityDiagnostics
    CudaGraphStrategy = CudaGraphStrategy
    ILogger = ILogger
    ICudaEngine = ICudaEngine
    IExecutionContext = IExecutionContext
    IRuntimeConfig = IRuntimeConfig
    IRuntimeCache = IRuntimeCache

    def __init__(
        self, cuda: FakeCuda, fail_calls: tuple[str, ...] = (), fail_contexts_after: int = -1
    ) -> None:
        self.cuda, self.fail_calls, self.fail_contexts_after = cuda, set(fail_calls), fail_contexts_after
        self.invalidity = EngineInvalidityDiagnostics(0)
        self.wrong_logits = False

    def Runtime(self, logger: ILogger) -> Runtime:  # noqa: N802
        runtime = Runtime(logger)
        runtime.trt = self
        return runtime

    @staticmethod
    def nptype(trt_type: DataType) -> type:
        return NUMPY[trt_type]
