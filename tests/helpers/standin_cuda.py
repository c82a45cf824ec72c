"""The CUDA half of the stand-in (``tests/helpers/trt_standin.py`` says what it is and why).

:class:`FakeCuda` is the ``cuda.bindings.runtime`` surface ``engines/tensorrt/cuda_mem.py``
calls: device memory as bytes, pinned host memory at real addresses, streams that can lag
behind the host, async copies, stream capture into graphs and graph launches. It raises
:class:`OrderingError` where real hardware would silently compute garbage.
"""

from __future__ import annotations

import ctypes
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

POISON = 0xFF  # uninitialised memory, and a device-to-host target until its copy ran


class OrderingError(AssertionError):
    """The runtime broke a rule of CUDA stream ordering that real hardware would not report."""


class cudaError_t(enum.IntEnum):  # noqa: N801 (cuda-python's names)
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35
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
    """One piece of queued work: ``run()`` does it; ``uses`` are the (ptr, nbytes) it touches.

    A kernel also says which device ranges it ``reads`` and ``writes`` (the real-CUDA bridge,
    ``tests/helpers/standin_real_cuda.py``, stages exactly those around ``run()``).
    """

    what: str
    run: Callable[[], None]
    uses: list[tuple[int, int]] = field(default_factory=list)
    reads: list[tuple[int, int]] = field(default_factory=list)
    writes: list[tuple[int, int]] = field(default_factory=list)


class FakeStream:
    """A ``cudaStream_t``: ``int()`` gives the handle TensorRT takes."""

    def __init__(self, handle: int, flags: int) -> None:
        self.handle, self.flags = handle, flags
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
        lag: ``"none"``: queued work runs at once; ``"random"``: some of it, a seeded random
            number of pieces each time work is queued; ``"full"``: only at a synchronisation.
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
        assert lag in ("none", "random", "full")
        self.rng = np.random.default_rng(0)
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

    def check_live(self, ptr: int, nbytes: int) -> None:
        """A bound range must lie in one live allocation."""
        self.device_view(ptr, nbytes)

    kernel_view = device_view  # what a kernel reads and writes: the device bytes themselves

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
        stream = FakeStream(self.next_handle, flags)
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
        elif self.lag == "random":
            self._drain(s, int(self.rng.integers(0, len(s.queue) + 1)))

    def _drain(self, s: FakeStream, limit: int = -1) -> None:
        while s.queue and limit != 0:
            limit -= 1
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
        if kind == cudaMemcpyKind.cudaMemcpyDeviceToDevice:
            check_no_overlap(dst, dpitch, src, spitch, width, rows)
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
        """Synchronous copy on the legacy null stream; the host side may be pageable (numpy) memory.

        The null stream waits for blocking streams (their queued work runs first) but not for
        ``cudaStreamNonBlocking`` ones: queued work there touching either range is a race.
        """
        for stream in self.streams.values():
            if stream.flags != self.cudaStreamNonBlocking:
                self._drain(stream)
        device = []  # the device ranges the copy touches
        if kind != cudaMemcpyKind.cudaMemcpyHostToDevice:
            device.append((src, nbytes))
        if kind != cudaMemcpyKind.cudaMemcpyDeviceToHost:
            device.append((dst, nbytes))
        for stream in self.streams.values():
            for op in stream.queue:
                for ptr, n in device:
                    if any(p < ptr + n and ptr < p + m for p, m in op.uses):
                        raise OrderingError(
                            f"cudaMemcpy on the null stream is not ordered after non-blocking stream "
                            f"{stream.handle:#x}, whose queued {op.what} still uses {ptr:#x}+{n}"
                        )
        if kind == cudaMemcpyKind.cudaMemcpyHostToDevice:
            self.device_view(dst, nbytes)[:] = np.frombuffer(ctypes.string_at(src, nbytes), np.uint8)
        elif kind == cudaMemcpyKind.cudaMemcpyDeviceToHost:
            ctypes.memmove(dst, self.device_view(src, nbytes).ctypes.data, nbytes)
        else:
            check_no_overlap(dst, nbytes, src, nbytes, nbytes, 1)
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


def check_no_overlap(dst: int, dpitch: int, src: int, spitch: int, width: int, rows: int) -> None:
    """A device-to-device copy between overlapping rows is undefined in CUDA: refuse it."""
    for i in range(rows):
        a = dst + i * dpitch
        for j in range(rows):
            b = src + j * spitch
            if a < b + width and b < a + width:
                raise OrderingError(
                    f"device-to-device copy: destination {dst:#x} overlaps source {src:#x} "
                    f"(row {i} of {rows}, {width} bytes); CUDA leaves overlapping copies undefined"
                )
