"""A CPU stand-in for the TensorRT and CUDA surface of ``engines/tensorrt/runtime.py``.

Why a stand-in: no TensorRT engine can execute on this project's machines. CI has no GPU,
TensorRT-RTX refuses the H200 (compute capability 9.0) and full TensorRT is not installable
there (``/work/shared/ENVIRONMENT.md``, ``docs/engines.md``). So the runtime is run against
this executable specification instead: the real :class:`~engines.tensorrt.runtime.TensorRTStep`
and :mod:`engines.tensorrt.cuda_mem` code, over

- :class:`FakeCuda`, the ``cuda.bindings.runtime`` calls ``cuda_mem`` makes (device and pinned
  memory, a stream with async copies, stream capture into CUDA graphs, graph launches), and
- :class:`FakeTensorRT`, the TensorRT / TensorRT-RTX module calls the runtime makes (runtime,
  engine tensor and profile queries, execution contexts, the RTX runtime config and cache),
  whose "kernel" executes the real exported ONNX decoder graph with ONNX Runtime, reading
  and writing the bytes of the fake device memory at the bound addresses.

It is strict where real hardware is silently wrong:

- ``lag="full"``: nothing queued on a stream runs before ``cudaStreamSynchronize`` (a GPU far
  behind the host). A pinned host buffer rewritten before its queued host-to-device copy ran
  raises :class:`OrderingError` when the copy runs; the destination of a device-to-host copy
  is filled with 0xFF (NaN / -1) when queued, so results read before synchronising are wrong.
- Freeing memory that queued work still uses, a tensor address outside any live allocation,
  an output overlapping an input, shapes outside the active optimization profile, running a
  context whose profile was never set, and capturing a context before it ran its current
  shapes once (as TensorRT requires) are all errors.
- ``fail_capture="execute"`` makes ``execute_async_v3`` return False while the stream is
  capturing; ``fail_capture="invalidate"`` makes ``cudaStreamEndCapture`` report an
  invalidated capture; ``fail_calls`` makes named context calls return False.

What it cannot tell: real kernels, timing and GPU memory limits; TensorRT's own numerics
(ONNX Runtime computes instead); asynchrony inside one stream (the queue runs in order); and
whether the real bindings accept these arguments at run time (``tests/test_tensorrt_conformance.py``
checks names and signatures against the installed ``tensorrt_rtx`` bindings).
"""

from __future__ import annotations

import ctypes
import enum
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from engines.onnx_export import INPUT_IDS, LAST_LOGITS, POSITION_IDS
from engines.tensorrt.options import EngineOptions, profile_shapes

MAGIC = b"TRT-STANDIN\n"
POISON = 0xFF


class OrderingError(AssertionError):
    """The runtime broke a rule of CUDA stream ordering that real hardware would not report."""


# --- CUDA ---------------------------------------------------------------------------------


class cudaError_t(enum.IntEnum):  # noqa: N801 (cuda-python's names)
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorStreamCaptureUnsupported = 900
    cudaErrorStreamCaptureInvalidated = 901


class cudaMemcpyKind(enum.IntEnum):  # noqa: N801
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3


class cudaStreamCaptureMode(enum.IntEnum):  # noqa: N801
    cudaStreamCaptureModeGlobal = 0
    cudaStreamCaptureModeThreadLocal = 1
    cudaStreamCaptureModeRelaxed = 2


OK = cudaError_t.cudaSuccess


@dataclass
class Op:
    """One piece of queued work: ``run()`` does it; ``uses`` are the (ptr, nbytes) it touches."""

    what: str
    run: Callable[[], None]
    uses: list[tuple[int, int]] = field(default_factory=list)


class FakeStream:
    """A ``cudaStream_t``: ``int()`` gives the handle TensorRT takes."""

    def __init__(self, handle: int) -> None:
        self.handle = handle
        self.queue: list[Op] = []
        self.capturing: list[Op] | None = None
        self.capture_broken = False

    def __int__(self) -> int:
        return self.handle


@dataclass
class DeviceProp:
    name: bytes = b"Stand-in GPU (CPU, ONNX Runtime)"
    major: int = 8
    minor: int = 9
    totalGlobalMem: int = 8 << 30  # noqa: N815


class FakeCuda:
    """The ``cuda.bindings.runtime`` functions ``cuda_mem`` calls, over host memory.

    Args:
        lag: ``"none"``: queued work runs at once; ``"full"``: only at a synchronisation.
        fail_capture: ``None``, ``"execute"`` or ``"invalidate"`` (see the module docstring).
        fail_malloc_after: Let this many ``cudaMalloc`` calls succeed, then fail the rest.
    """

    cudaError_t = cudaError_t
    cudaMemcpyKind = cudaMemcpyKind
    cudaStreamCaptureMode = cudaStreamCaptureMode
    cudaStreamNonBlocking = 1

    def __init__(
        self, lag: str = "none", fail_capture: str | None = None, fail_malloc_after: int = -1
    ) -> None:
        assert lag in ("none", "full")
        self.lag, self.fail_capture, self.fail_malloc_after = lag, fail_capture, fail_malloc_after
        self.device: dict[int, np.ndarray] = {}  # base address -> bytes
        self.host: dict[int, Any] = {}  # live pinned allocations: base -> ctypes array
        self.freed_host: list[Any] = []  # kept alive so a stale view never segfaults
        self.streams: dict[int, FakeStream] = {}
        self.graphs: dict[int, list[Op]] = {}
        self.execs: dict[int, list[Op]] = {}
        self.next_device = 0x7F00_0000_0000
        self.next_handle = 0x1000
        self.counts = {"graph_launch": 0, "graph_capture": 0, "kernel": 0}

    # memory
    def cudaMalloc(self, nbytes: int) -> tuple[cudaError_t, int]:  # noqa: N802
        if self.fail_malloc_after == 0:
            return cudaError_t.cudaErrorMemoryAllocation, 0
        self.fail_malloc_after -= 1
        base = self.next_device
        self.next_device += (nbytes + 0xFFFF) & ~0xFFFF | 0x10000  # gaps between allocations
        self.device[base] = np.full(nbytes, POISON, dtype=np.uint8)  # uninitialised memory
        return OK, base

    def cudaFree(self, ptr: int) -> tuple[cudaError_t]:  # noqa: N802
        if ptr not in self.device:
            return (cudaError_t.cudaErrorInvalidValue,)
        self._check_unused(ptr, self.device[ptr].nbytes, "cudaFree")
        del self.device[ptr]
        return (OK,)

    def cudaMallocHost(self, nbytes: int) -> tuple[cudaError_t, int]:  # noqa: N802
        buf = (ctypes.c_ubyte * nbytes)()
        ctypes.memset(buf, POISON, nbytes)
        self.host[ctypes.addressof(buf)] = buf
        return OK, ctypes.addressof(buf)

    def cudaFreeHost(self, ptr: int) -> tuple[cudaError_t]:  # noqa: N802
        if ptr not in self.host:
            return (cudaError_t.cudaErrorInvalidValue,)
        buf = self.host.pop(ptr)
        self._check_unused(ptr, len(buf), "cudaFreeHost")
        ctypes.memset(buf, POISON, len(buf))  # what a later reuse of the pages would look like
        self.freed_host.append(buf)
        return (OK,)

    def live(self) -> dict[str, int]:
        """What is still allocated: device buffers, pinned buffers, streams, graphs."""
        return {
            "device": len(self.device),
            "pinned": len(self.host),
            "streams": len(self.streams),
            "graphs": len(self.graphs) + len(self.execs),
        }

    def _check_unused(self, ptr: int, nbytes: int, call: str) -> None:
        for stream in self.streams.values():
            for op in stream.queue:
                if any(p < ptr + nbytes and ptr < p + n for p, n in op.uses):
                    raise OrderingError(f"{call}({ptr:#x}) while queued work ({op.what}) still uses it")

    def device_view(self, ptr: int, nbytes: int) -> np.ndarray:
        """The device bytes ``[ptr, ptr + nbytes)``, which must lie in one live allocation."""
        for base, mem in self.device.items():
            if base <= ptr and ptr + nbytes <= base + mem.nbytes:
                return mem[ptr - base : ptr - base + nbytes]
        raise OrderingError(f"device range {ptr:#x}+{nbytes} is not inside a live allocation")

    def host_view(self, ptr: int, nbytes: int) -> np.ndarray:
        """Pinned host bytes ``[ptr, ptr + nbytes)`` of one live ``cudaMallocHost`` allocation."""
        for base, buf in self.host.items():
            if base <= ptr and ptr + nbytes <= base + len(buf):
                return np.frombuffer(buf, dtype=np.uint8)[ptr - base : ptr - base + nbytes]
        raise OrderingError(f"host range {ptr:#x}+{nbytes} is not inside a live pinned allocation")

    # streams
    def _stream(self, stream: Any) -> FakeStream:
        s = self.streams.get(int(stream))
        if s is None:
            raise OrderingError(f"stream {int(stream):#x} does not exist (destroyed?)")
        return s

    def cudaStreamCreateWithFlags(self, flags: int) -> tuple[cudaError_t, FakeStream]:  # noqa: N802
        self.next_handle += 0x10
        stream = FakeStream(self.next_handle)
        self.streams[stream.handle] = stream
        return OK, stream

    def enqueue(self, stream: Any, op: Op) -> None:
        """Queue (or, while capturing, record) ``op`` on ``stream``; run it now without lag."""
        s = self._stream(stream)
        if s.capturing is not None:
            s.capturing.append(op)
            return
        s.queue.append(op)
        if self.lag == "none":
            self._drain(s)

    def _drain(self, s: FakeStream) -> None:
        while s.queue:
            op = s.queue[0]
            op.run()
            s.queue.pop(0)

    def cudaStreamSynchronize(self, stream: Any) -> tuple[cudaError_t]:  # noqa: N802
        s = self._stream(stream)
        if s.capturing is not None:  # illegal while capturing; CUDA invalidates the capture
            s.capture_broken = True
            return (cudaError_t.cudaErrorStreamCaptureUnsupported,)
        self._drain(s)
        return (OK,)

    def cudaStreamDestroy(self, stream: Any) -> tuple[cudaError_t]:  # noqa: N802
        s = self._stream(stream)
        self._drain(s)  # CUDA finishes queued work before releasing the stream
        del self.streams[s.handle]
        return (OK,)

    def cudaMemcpyAsync(self, dst: int, src: int, nbytes: int, kind: cudaMemcpyKind, stream: Any):  # noqa: N802
        return self.cudaMemcpy2DAsync(dst, nbytes, src, nbytes, nbytes, 1, kind, stream)

    def cudaMemcpy2DAsync(  # noqa: N802
        self,
        dst: int,
        dpitch: int,
        src: int,
        spitch: int,
        width: int,
        rows: int,
        kind: cudaMemcpyKind,
        stream: Any,
    ) -> tuple[cudaError_t]:
        if width > dpitch or width > spitch or rows < 1:
            return (cudaError_t.cudaErrorInvalidValue,)
        src_n, dst_n = spitch * (rows - 1) + width, dpitch * (rows - 1) + width
        read_src = self.host_view if kind == cudaMemcpyKind.cudaMemcpyHostToDevice else self.device_view
        read_dst = self.host_view if kind == cudaMemcpyKind.cudaMemcpyDeviceToHost else self.device_view
        read_src(src, src_n), read_dst(dst, dst_n)  # both must be valid when queued
        snapshot = None
        if kind == cudaMemcpyKind.cudaMemcpyHostToDevice:
            snapshot = read_src(src, src_n).copy()
        if kind == cudaMemcpyKind.cudaMemcpyDeviceToHost:
            read_dst(dst, dst_n)[:] = POISON  # undefined until the copy ran

        def run() -> None:
            source = read_src(src, src_n)
            if snapshot is not None and not np.array_equal(source, snapshot):
                raise OrderingError(
                    f"pinned host buffer {src:#x} ({src_n} bytes) was rewritten before its queued "
                    "host-to-device copy ran"
                )
            out = read_dst(dst, dst_n)
            for r in range(rows):
                out[r * dpitch : r * dpitch + width] = source[r * spitch : r * spitch + width]

        self.enqueue(stream, Op(f"copy {kind.name}", run, [(src, src_n), (dst, dst_n)]))
        return (OK,)

    def cudaMemcpy(self, dst: int, src: int, nbytes: int, kind: cudaMemcpyKind) -> tuple[cudaError_t]:  # noqa: N802
        """Synchronous copy; the host side may be pageable (numpy) memory."""
        if kind == cudaMemcpyKind.cudaMemcpyHostToDevice:
            self.device_view(dst, nbytes)[:] = np.frombuffer(ctypes.string_at(src, nbytes), np.uint8)
        elif kind == cudaMemcpyKind.cudaMemcpyDeviceToHost:
            ctypes.memmove(dst, self.device_view(src, nbytes).ctypes.data, nbytes)
        else:
            self.device_view(dst, nbytes)[:] = self.device_view(src, nbytes)
        return (OK,)

    # graphs
    def cudaStreamBeginCapture(self, stream: Any, mode: cudaStreamCaptureMode) -> tuple[cudaError_t]:  # noqa: N802
        s = self._stream(stream)
        if s.capturing is not None:
            return (cudaError_t.cudaErrorStreamCaptureUnsupported,)
        s.capturing, s.capture_broken = [], False
        return (OK,)

    def cudaStreamEndCapture(self, stream: Any) -> tuple[cudaError_t, int | None]:  # noqa: N802
        s = self._stream(stream)
        if s.capturing is None:
            return cudaError_t.cudaErrorInvalidValue, None
        ops, s.capturing = s.capturing, None
        if s.capture_broken or self.fail_capture == "invalidate":
            return cudaError_t.cudaErrorStreamCaptureInvalidated, None
        self.next_handle += 0x10
        self.graphs[self.next_handle] = ops
        self.counts["graph_capture"] += 1
        return OK, self.next_handle

    def cudaGraphInstantiate(self, graph: int, flags: int) -> tuple[cudaError_t, int | None]:  # noqa: N802
        if graph not in self.graphs:
            return cudaError_t.cudaErrorInvalidValue, None
        self.next_handle += 0x10
        self.execs[self.next_handle] = list(self.graphs[graph])
        return OK, self.next_handle

    def cudaGraphLaunch(self, exec_graph: int, stream: Any) -> tuple[cudaError_t]:  # noqa: N802
        if exec_graph not in self.execs:
            return (cudaError_t.cudaErrorInvalidValue,)
        self.counts["graph_launch"] += 1
        ops = self.execs[exec_graph]
        if not ops:
            raise OrderingError("launched an empty CUDA graph (a failed capture was kept)")
        for op in ops:
            self.enqueue(stream, Op(f"graph {exec_graph:#x}: {op.what}", op.run, op.uses))
        return (OK,)

    def cudaGraphExecDestroy(self, exec_graph: int) -> tuple[cudaError_t]:  # noqa: N802
        return (OK,) if self.execs.pop(exec_graph, None) is not None else (cudaError_t.cudaErrorInvalidValue,)

    def cudaGraphDestroy(self, graph: int) -> tuple[cudaError_t]:  # noqa: N802
        return (OK,) if self.graphs.pop(graph, None) is not None else (cudaError_t.cudaErrorInvalidValue,)

    # facts
    def cudaGetErrorString(self, status: cudaError_t) -> tuple[cudaError_t, bytes]:  # noqa: N802
        return OK, f"stand-in {status.name}".encode()

    def cudaGetDeviceCount(self) -> tuple[cudaError_t, int]:  # noqa: N802
        return OK, 1

    def cudaGetDeviceProperties(self, device: int) -> tuple[cudaError_t, DeviceProp]:  # noqa: N802
        return OK, DeviceProp()


# --- TensorRT -----------------------------------------------------------------------------


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
    VERSION_MISMATCH = 1
    UNSUPPORTED_CC = 2
    MALFORMED_ENGINE = 32


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


def engine_blob(onnx_path: Path, options: EngineOptions, decode_profile: bool) -> bytes:
    """A serialized stand-in engine: the ONNX file and the builder's profile shapes."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    past = next(i for i in session.get_inputs() if i.name.startswith("past_key_values"))
    kv_heads, head_dim = int(past.shape[1]), int(past.shape[3])
    profiles = [
        {k: [list(r.min), list(r.opt), list(r.max)] for k, r in p.items()}
        for p in profile_shapes(options, kv_heads, head_dim, decode_profile)
    ]
    return MAGIC + json.dumps({"onnx": str(onnx_path), "profiles": profiles}).encode()


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
    def __init__(self) -> None:
        self.cache: IRuntimeCache | None = None
        self.cuda_graph_strategy = CudaGraphStrategy.DISABLED

    def create_runtime_cache(self) -> IRuntimeCache:
        return IRuntimeCache()

    def set_runtime_cache(self, cache: IRuntimeCache) -> bool:
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
        return IExecutionContext(self, runtime_config)

    def create_runtime_config(self) -> IRuntimeConfig:
        return IRuntimeConfig()


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
            self.cuda.device_view(ptr, nbytes)  # bound memory must be live and large enough
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
                feed[name] = self.cuda.device_view(addresses[name], nbytes).view(dtype).reshape(shape).copy()
            expected = np.arange(past, past + count)
            assert np.array_equal(feed[POSITION_IDS][0], expected), "position_ids do not continue the cache"
            results = engine.session.run(list(engine.outputs), feed)
            for name, value in zip(engine.outputs, results, strict=True):
                shape, nbytes = regions[name]
                assert value.shape == shape, (name, value.shape, shape)
                self.cuda.device_view(addresses[name], nbytes)[:] = np.frombuffer(value.tobytes(), np.uint8)
            self.cuda.counts["kernel"] += 1

        uses = [*ins, *outs]
        self.cuda.enqueue(stream, Op(f"execute profile {self.profile} ({count} tokens at {past})", run, uses))
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
        return ICudaEngine(self.trt, spec["onnx"], spec["profiles"])

    def get_engine_validity(self, buffer: bytes) -> tuple[EngineValidity, int]:
        if bytes(buffer).startswith(MAGIC):
            return EngineValidity.VALID, 0
        return EngineValidity.INVALID, int(EngineInvalidityDiagnostics.MALFORMED_ENGINE)


class FakeTensorRT:
    """The ``tensorrt`` / ``tensorrt_rtx`` module as the runtime uses it.

    Args:
        cuda: The fake CUDA its contexts enqueue on.
        fail_calls: Context calls that return False (``set_input_shape``...).
        fail_contexts_after: Let this many ``create_execution_context`` calls succeed.
    """

    __version__ = "stand-in"
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

    def Runtime(self, logger: ILogger) -> Runtime:  # noqa: N802
        runtime = Runtime(logger)
        runtime.trt = self
        return runtime

    @staticmethod
    def nptype(trt_type: DataType) -> type:
        return NUMPY[trt_type]
