"""Just enough CUDA through cuda-python (``cuda.bindings.runtime``): GPU facts, buffers, a stream.

No torch at runtime. Every call's status is checked; a failure raises :class:`CudaError`
naming the call.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.tensorrt.versions import CUDA_DRIVER_MIN, CUDA_PYTHON_PIN


class CudaError(RuntimeError):
    """A CUDA runtime call failed (or cuda-python / the driver is missing)."""


@dataclass(frozen=True)
class GpuInfo:
    """The GPU CUDA device 0 is: name, compute capability, memory."""

    name: str
    capability: tuple[int, int]
    memory_bytes: int


@dataclass(frozen=True)
class GpuUnusable:
    """An NVIDIA driver is installed but cuda-python cannot use it; ``reason`` names the fix."""

    reason: str


def cudart() -> Any:
    """The ``cuda.bindings.runtime`` module.

    Raises:
        CudaError: cuda-python is not installed.
    """
    try:
        from cuda.bindings import runtime
    except ImportError as e:
        raise CudaError(f"cuda-python is not installed; pip install '{CUDA_PYTHON_PIN[12]}'") from e
    return runtime


def check(result: Any, call: str) -> Any:
    """Unpack a cuda-python ``(status, *values)`` result; raise on a failed status."""
    status, *values = result if isinstance(result, tuple) else (result,)
    rt = cudart()
    if status != rt.cudaError_t.cudaSuccess:
        _, text = rt.cudaGetErrorString(status)
        raise CudaError(f"{call} failed: {status.name} ({text.decode(errors='replace')})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def gpu_info(device: int = 0) -> GpuInfo | None:
    """Facts about a CUDA device, or ``None`` when there is none to use (:func:`find_gpu` says why)."""
    found = find_gpu(device)
    return found if isinstance(found, GpuInfo) else None


def find_gpu(device: int = 0) -> GpuInfo | GpuUnusable | None:
    """Facts about a CUDA device; why it is unusable; or ``None`` without cuda-python, a driver or a GPU.

    cuda-python 13.x on a driver older than R580 sees no device (cudaErrorInsufficientDriver):
    that is :class:`GpuUnusable` with the pip pin that fits the driver, not "no GPU".
    """
    try:
        rt = cudart()
        result = rt.cudaGetDeviceCount()
        if result[0] == rt.cudaError_t.cudaErrorInsufficientDriver:
            return _driver_too_old(rt)
        count = check(result, "cudaGetDeviceCount")
        if count <= device:
            return None
        prop = check(rt.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    except CudaError:
        return None
    name = (
        prop.name.decode(errors="replace").rstrip("\x00") if isinstance(prop.name, bytes) else str(prop.name)
    )
    return GpuInfo(name, (int(prop.major), int(prop.minor)), int(prop.totalGlobalMem))


def _driver_too_old(rt: Any) -> GpuUnusable | None:
    """Why cudaErrorInsufficientDriver: no driver at all (``None``), or one older than cuda-python."""
    status, driver = rt.cudaDriverGetVersion()
    if status != rt.cudaError_t.cudaSuccess or not driver:
        return None  # no driver installed: what a machine without an NVIDIA GPU reports
    _, runtime = rt.cudaRuntimeGetVersion()
    has, needs = driver // 1000, runtime // 1000
    update = "update the NVIDIA driver"
    if needs in CUDA_DRIVER_MIN:
        update += f" to R{CUDA_DRIVER_MIN[needs][0]}+"
    fix = f"pip install '{CUDA_PYTHON_PIN[has]}', or {update}" if has in CUDA_PYTHON_PIN else update
    return GpuUnusable(
        f"cuda-python is built for CUDA {needs}.{runtime % 1000 // 10} and the NVIDIA driver runs CUDA "
        f"{has}.{driver % 1000 // 10} at most (cudaErrorInsufficientDriver): {fix}"
    )


class DeviceBuffer:
    """``nbytes`` of device memory (``cudaMalloc``), freed by :meth:`free`."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(check(cudart().cudaMalloc(self.nbytes), "cudaMalloc"))

    def free(self) -> None:
        """Release the memory (idempotent)."""
        if self.ptr:
            check(cudart().cudaFree(self.ptr), "cudaFree")
            self.ptr = 0


class PinnedArray:
    """A page-locked host array (``cudaMallocHost``) seen as numpy, for async copies."""

    def __init__(self, count: int, dtype: np.dtype[Any] | type) -> None:
        self.dtype = np.dtype(dtype)
        self.nbytes = max(count, 1) * self.dtype.itemsize
        self.ptr = int(check(cudart().cudaMallocHost(self.nbytes), "cudaMallocHost"))
        raw = memoryview((ctypes.c_byte * self.nbytes).from_address(self.ptr)).cast("B")
        self._array: np.ndarray | None = np.frombuffer(raw, dtype=self.dtype, count=max(count, 1))

    @property
    def array(self) -> np.ndarray:
        """The memory as numpy; gone with :meth:`free` (it would point at released pages).

        Raises:
            ValueError: The memory was freed.
        """
        if self._array is None:
            raise ValueError(f"pinned array of {self.nbytes} bytes used after it was freed")
        return self._array

    def free(self) -> None:
        """Release the memory (idempotent); :attr:`array` is unusable afterwards."""
        if self.ptr:
            self._array = None
            check(cudart().cudaFreeHost(self.ptr), "cudaFreeHost")
            self.ptr = 0


class Stream:
    """A non-default CUDA stream; ``handle`` is what TensorRT's ``execute_async_v3`` takes."""

    def __init__(self) -> None:
        rt = cudart()
        self.stream = check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreate")
        self.handle = int(self.stream)

    def copy(self, dst: int, src: int, nbytes: int, kind: str) -> None:
        """Async copy; ``kind`` is ``h2d``, ``d2h`` or ``d2d``."""
        rt = cudart()
        kinds = {
            "h2d": rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
            "d2h": rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
            "d2d": rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice,
        }
        check(rt.cudaMemcpyAsync(dst, src, nbytes, kinds[kind], self.stream), "cudaMemcpyAsync")

    def copy_rows(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, rows: int) -> None:
        """Async device-to-device copy of ``rows`` rows of ``width`` bytes (``cudaMemcpy2DAsync``)."""
        rt = cudart()
        kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        check(
            rt.cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, kind, self.stream),
            "cudaMemcpy2DAsync",
        )

    def synchronize(self) -> None:
        """Wait for everything queued on the stream."""
        check(cudart().cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def destroy(self) -> None:
        """Release the stream (idempotent)."""
        if self.handle:
            check(cudart().cudaStreamDestroy(self.stream), "cudaStreamDestroy")
            self.handle = 0


class GraphCache:
    """CUDA graphs of repeated launches, keyed by the caller (least recently used dropped).

    Used for full TensorRT's decode step: with the past -> present contract every decode
    position is a new shape, so a graph only pays off when a shape comes back.
    """

    def __init__(self, stream: Stream, max_graphs: int = 256) -> None:
        self.stream = stream
        self.max_graphs = max_graphs
        self.graphs: dict[Any, tuple[Any, Any]] = {}
        self.replays = 0  # launches of a captured graph, for tests and diagnostics

    def launch(self, key: Any) -> bool:
        """Replay the graph of ``key`` if captured; ``False`` when there is none."""
        entry = self.graphs.pop(key, None)
        if entry is None:
            return False
        self.graphs[key] = entry  # most recently used last
        self.replays += 1
        check(cudart().cudaGraphLaunch(entry[1], self.stream.stream), "cudaGraphLaunch")
        return True

    def capture(self, key: Any, enqueue: Callable[[], bool]) -> bool:
        """Record what ``enqueue()`` puts on the stream as the graph of ``key`` (not run now).

        Returns False, keeping nothing, when the capture failed: ``enqueue()`` returned False
        (TensorRT could not enqueue while capturing) or CUDA invalidated the capture. The
        stream is usable afterwards; what ran before the capture is unaffected.
        """
        rt = cudart()
        ok = rt.cudaError_t.cudaSuccess
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        check(rt.cudaStreamBeginCapture(self.stream.stream, mode), "cudaStreamBeginCapture")
        enqueued = False
        try:
            enqueued = bool(enqueue())
        finally:
            status, graph = rt.cudaStreamEndCapture(self.stream.stream)
            if status != ok or not enqueued:
                if status == ok and graph is not None:
                    check(rt.cudaGraphDestroy(graph), "cudaGraphDestroy")
                graph = None
        if graph is None:
            return False
        status, exec_graph = rt.cudaGraphInstantiate(graph, 0)
        if status != ok:
            check(rt.cudaGraphDestroy(graph), "cudaGraphDestroy")
            return False
        old = self.graphs.pop(key, None)
        if old is not None:
            self._destroy(old)
        self.graphs[key] = (graph, exec_graph)
        while len(self.graphs) > self.max_graphs:
            self._destroy(self.graphs.pop(next(iter(self.graphs))))
        return True

    def _destroy(self, entry: tuple[Any, Any]) -> None:
        rt = cudart()
        check(rt.cudaGraphExecDestroy(entry[1]), "cudaGraphExecDestroy")
        check(rt.cudaGraphDestroy(entry[0]), "cudaGraphDestroy")

    def clear(self) -> None:
        """Destroy every graph."""
        while self.graphs:
            self._destroy(self.graphs.popitem()[1])
