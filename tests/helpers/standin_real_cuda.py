"""The stand-in's TensorRT half over real CUDA: ``STANDIN_CUDA=real`` on a machine with a GPU.

Why: no TensorRT engine can execute on this project's machines (``tests/helpers/trt_standin.py``
says why), but the cuda-python code around it can run for real on the H200 we are lent:
``cuda_mem``'s device and pinned memory, the stream, async and pitched copies, stream
capture into CUDA graphs and their replays. :class:`RealCuda` is the real
``cuda.bindings.runtime`` (every call goes to it) that also gives
:class:`~tests.trt_standin.FakeTensorRT`'s "kernel" a real place on the real stream: for
each ``execute_async_v3`` it queues device-to-host copies of the bound inputs into pinned
staging, a host function (the driver's ``cuLaunchHostFunc``) that runs ONNX Runtime on them, and
host-to-device copies of the outputs to the bound addresses. So the kernel is ordered by
CUDA, captured into graphs and replayed by CUDA, like a real engine's.

Strict where real hardware is silently wrong:

- ``lag``: a host function that sleeps is queued before each host-to-device copy and each
  kernel (``"full"``: 20 ms, ``"random"``: 0-5 ms, seeded), so the GPU really is behind the
  host: a pinned buffer rewritten before its queued copy ran gives wrong tokens.
- The host destination of a device-to-host copy is filled with 0xFF when the copy is
  queued: read before synchronising, it is NaN / -1.
- ``fail_capture="execute"``: ``execute_async_v3`` returns False while capturing (the
  stand-in's rule); ``"invalidate"``: the kernel calls ``cudaStreamSynchronize`` on the
  capturing stream, which CUDA itself forbids, so CUDA invalidates the capture.
- ``fail_malloc_after``: ``cudaMalloc`` fails after that many calls (out of GPU memory).
- ``live()`` counts what is allocated through this module (device, pinned, streams,
  graphs), so a leak shows as on the CPU stand-in.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.helpers.standin_cuda import POISON, Op, check_no_overlap

HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
LAG_S = {"full": 0.020, "random": 0.005}


@dataclass
class StreamState:
    """What :class:`~tests.trt_standin.IExecutionContext` asks of a stream: is it capturing
    (``None`` when not, as on :class:`~tests.standin_cuda.FakeStream`)."""

    capturing: list[Op] | None


class RealCuda:
    """``cuda.bindings.runtime``, counted and made strict (module docstring)."""

    def __init__(
        self, lag: str = "none", fail_capture: str | None = None, fail_malloc_after: int = -1
    ) -> None:
        from cuda.bindings import runtime

        assert lag in ("none", "random", "full")
        self.rt = runtime
        self.libcuda = ctypes.CDLL("libcuda.so.1")
        self.libcuda.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, HOST_FN, ctypes.c_void_p]
        self.libcuda.cuLaunchHostFunc.restype = ctypes.c_int
        self.rng = np.random.default_rng(0)
        self.lag, self.fail_capture, self.fail_malloc_after = lag, fail_capture, fail_malloc_after
        self.counts = {"graph_launch": 0, "graph_capture": 0, "kernel": 0}
        self.allocated: dict[str, set[int]] = {
            "device": set(),
            "pinned": set(),
            "streams": set(),
            "graphs": set(),
        }
        self.staging: dict[tuple[int, int], tuple[int, np.ndarray]] = {}  # (device ptr, nbytes) -> pinned
        self.callbacks: list[Any] = []  # ctypes callbacks must outlive every graph that calls them
        self.errors: list[BaseException] = []  # raised inside a host function (reported at sync)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rt, name)

    def _ok(self, result: Any, call: str) -> Any:
        status, *values = result if isinstance(result, tuple) else (result,)
        if status != self.rt.cudaError_t.cudaSuccess:
            raise AssertionError(f"{call}: {status.name}")
        return values[0] if len(values) == 1 else tuple(values) if values else None

    # counted allocations
    def cudaMalloc(self, nbytes: int) -> Any:  # noqa: N802
        if self.fail_malloc_after == 0:
            return self.rt.cudaError_t.cudaErrorMemoryAllocation, 0
        self.fail_malloc_after -= 1
        status, ptr = self.rt.cudaMalloc(nbytes)
        if status == self.rt.cudaError_t.cudaSuccess:
            self.allocated["device"].add(int(ptr))
            self._ok(self.rt.cudaMemset(ptr, POISON, nbytes), "cudaMemset")  # never test on zeros
        return status, ptr

    def cudaFree(self, ptr: int) -> Any:  # noqa: N802
        self.allocated["device"].discard(int(ptr))
        return self.rt.cudaFree(ptr)

    def cudaMallocHost(self, nbytes: int) -> Any:  # noqa: N802
        status, ptr = self.rt.cudaMallocHost(nbytes)
        if status == self.rt.cudaError_t.cudaSuccess:
            self.allocated["pinned"].add(int(ptr))
            ctypes.memset(int(ptr), POISON, nbytes)
        return status, ptr

    def cudaFreeHost(self, ptr: int) -> Any:  # noqa: N802
        self.allocated["pinned"].discard(int(ptr))
        return self.rt.cudaFreeHost(ptr)

    def cudaStreamCreateWithFlags(self, flags: int) -> Any:  # noqa: N802
        status, stream = self.rt.cudaStreamCreateWithFlags(flags)
        self.allocated["streams"].add(int(stream))
        return status, stream

    def cudaStreamDestroy(self, stream: Any) -> Any:  # noqa: N802
        self.allocated["streams"].discard(int(stream))
        return self.rt.cudaStreamDestroy(stream)

    def cudaStreamSynchronize(self, stream: Any) -> Any:  # noqa: N802
        result = self.rt.cudaStreamSynchronize(stream)
        if self.errors:
            raise self.errors.pop(0)  # a host function failed: surface it on the caller's thread
        return result

    def cudaStreamEndCapture(self, stream: Any) -> Any:  # noqa: N802
        status, graph = self.rt.cudaStreamEndCapture(stream)
        if status == self.rt.cudaError_t.cudaSuccess and graph is not None:
            self.counts["graph_capture"] += 1
            self.allocated["graphs"].add(int(graph))
        return status, graph

    def cudaGraphInstantiate(self, graph: Any, flags: int) -> Any:  # noqa: N802
        status, exec_graph = self.rt.cudaGraphInstantiate(graph, flags)
        if status == self.rt.cudaError_t.cudaSuccess:
            self.allocated["graphs"].add(int(exec_graph))
        return status, exec_graph

    def cudaGraphLaunch(self, exec_graph: Any, stream: Any) -> Any:  # noqa: N802
        self.counts["graph_launch"] += 1
        return self.rt.cudaGraphLaunch(exec_graph, stream)

    def cudaGraphExecDestroy(self, exec_graph: Any) -> Any:  # noqa: N802
        self.allocated["graphs"].discard(int(exec_graph))
        return self.rt.cudaGraphExecDestroy(exec_graph)

    def cudaGraphDestroy(self, graph: Any) -> Any:  # noqa: N802
        self.allocated["graphs"].discard(int(graph))
        return self.rt.cudaGraphDestroy(graph)

    def cudaMemcpy2DAsync(self, dst: int, dpitch: int, src: int, spitch: int, *rest: Any) -> Any:  # noqa: N802
        width, rows, kind, _ = rest
        if kind == self.rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice:
            check_no_overlap(dst, dpitch, src, spitch, width, rows)  # undefined in CUDA: refuse
        return self.rt.cudaMemcpy2DAsync(dst, dpitch, src, spitch, *rest)

    def cudaMemcpyAsync(self, dst: int, src: int, nbytes: int, kind: Any, stream: Any) -> Any:  # noqa: N802
        kinds = self.rt.cudaMemcpyKind
        if kind == kinds.cudaMemcpyDeviceToDevice:
            check_no_overlap(dst, nbytes, src, nbytes, nbytes, 1)
        if not self._capturing(stream):
            if kind == kinds.cudaMemcpyDeviceToHost:
                ctypes.memset(dst, POISON, nbytes)  # undefined until the copy ran
            if kind == kinds.cudaMemcpyHostToDevice:
                self._lag(stream)
        return self.rt.cudaMemcpyAsync(dst, src, nbytes, kind, stream)

    def live(self) -> dict[str, int]:
        """What is still allocated (staging of the kernels excluded: the stand-in's own)."""
        return {kind: len(handles) for kind, handles in self.allocated.items()}

    # what FakeTensorRT's contexts use
    def _capturing(self, stream: Any) -> bool:
        status = self._ok(self.rt.cudaStreamIsCapturing(stream), "cudaStreamIsCapturing")
        return status != self.rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone

    def _stream(self, handle: int) -> StreamState:
        return StreamState([] if self._capturing(handle) else None)

    def _host_fn(self, stream: Any, fn: Any) -> None:
        """Queue ``fn()`` on ``stream`` (graph capture records it as a host node).

        Through the driver's ``cuLaunchHostFunc`` directly: cuda-python's
        ``cudaLaunchHostFunc`` wraps the callback in data it frees after the first call, so
        a captured graph replaying it would call freed memory (it crashed the H200 run).
        """

        def call(_: Any) -> None:
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 (reported on the next synchronise)
                self.errors.append(e)

        callback = HOST_FN(call)
        self.callbacks.append(callback)
        status = self.libcuda.cuLaunchHostFunc(ctypes.c_void_p(int(stream)), callback, None)
        assert status == 0, f"cuLaunchHostFunc: CUresult {status}"

    def _lag(self, stream: Any) -> None:
        if self.lag == "none":
            return
        seconds = LAG_S["full"] if self.lag == "full" else float(self.rng.uniform(0, LAG_S["random"]))
        self._host_fn(stream, lambda: time.sleep(seconds))

    def _staging(self, ptr: int, nbytes: int) -> tuple[int, np.ndarray]:
        key = (ptr, nbytes)
        if key not in self.staging:
            host = int(self._ok(self.rt.cudaMallocHost(nbytes), "cudaMallocHost (staging)"))
            view = np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(host))
            self.staging[key] = (host, view)
        return self.staging[key]

    def check_live(self, ptr: int, nbytes: int) -> None:
        """A bound range must lie in live device memory (both ends; an empty one binds nothing)."""
        for address in (ptr, ptr + nbytes - 1) if nbytes else ():
            attributes = self._ok(self.rt.cudaPointerGetAttributes(address), "cudaPointerGetAttributes")
            assert attributes.type == self.rt.cudaMemoryType.cudaMemoryTypeDevice, (
                f"{address:#x} is not device memory"
            )

    def kernel_view(self, ptr: int, nbytes: int) -> np.ndarray:
        """Inside the kernel's host function: the staged bytes of device range ``ptr``."""
        return self._staging(ptr, nbytes)[1] if nbytes else np.zeros(0, np.uint8)

    def device_view(self, ptr: int, nbytes: int) -> np.ndarray:
        """A copy of device bytes, read synchronously (outside any capture)."""
        out = np.empty(nbytes, np.uint8)
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._ok(self.rt.cudaMemcpy(out.ctypes.data, ptr, nbytes, kind), "cudaMemcpy")
        return out

    def enqueue(self, stream: Any, op: Op) -> None:
        """Queue the kernel ``op``: inputs to staging, ``op.run()`` on the host, outputs back."""
        copy = self.rt.cudaMemcpyAsync
        kinds = self.rt.cudaMemcpyKind
        capturing = self._capturing(stream)
        if capturing and self.fail_capture == "invalidate":
            self.rt.cudaStreamSynchronize(stream)  # forbidden while capturing: CUDA invalidates it
            return
        if not capturing:
            self._lag(stream)
        for ptr, nbytes in [r for r in op.reads if r[1]]:
            host, _ = self._staging(ptr, nbytes)
            self._ok(copy(host, ptr, nbytes, kinds.cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync")
        self._host_fn(stream, op.run)
        for ptr, nbytes in [w for w in op.writes if w[1]]:
            host, _ = self._staging(ptr, nbytes)
            self._ok(copy(ptr, host, nbytes, kinds.cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync")

    def free_staging(self) -> None:
        """Release the kernels' staging (after every stream that used it is gone)."""
        for host, _ in self.staging.values():
            self._ok(self.rt.cudaFreeHost(host), "cudaFreeHost (staging)")
        self.staging.clear()
