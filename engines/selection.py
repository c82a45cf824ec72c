"""``--backend auto``: the fastest backend this machine can run, and why.

Order: full TensorRT when importable and the GPU is one it supports (compute capability 7.5+),
else TensorRT-RTX on the RTX GPUs it runs on (8.0, 8.6, 8.9, 12.0, 12.1), else PyTorch on
CUDA. Without a CUDA GPU: ONNX Runtime on the CPU (it decoded ~2.2x faster than our PyTorch
backend on the 2-core CI machine, docs/benchmarks.md), else PyTorch on the CPU. When the
TensorRT picked fails at start (build, load, warm-up, accuracy gate), ``assistant.stages.llm.load_llm``
takes ``choose_backend(..., without_tensorrt=True)``: PyTorch on the GPU (with CUDA graphs), or
on the CPU when PyTorch has no CUDA.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from engines.tensorrt.cuda_mem import GpuInfo, GpuUnusable, find_gpu
from engines.tensorrt.flavour import TensorRTUnavailable, load_flavour, rtx_supports
from engines.tensorrt.versions import TENSORRT_MIN_CAPABILITY


@dataclass(frozen=True)
class Probe:
    """What this machine offers: TensorRT versions (``None`` when absent), the GPU, torch CUDA.

    ``onnxruntime``: the ``onnxruntime`` package imports. ``gpu_problem``: why cuda-python sees
    no GPU although a driver is installed (cuda-python too new for it), with the fix.
    """

    tensorrt: str | None
    tensorrt_rtx: str | None
    gpu: GpuInfo | None
    torch_cuda: bool
    onnxruntime: bool
    gpu_problem: str | None = None


@dataclass(frozen=True)
class Choice:
    """A backend, the device it runs on and the reason, in words."""

    backend: str
    device: str
    reason: str


# Where an NVIDIA driver shows itself on Linux: its device nodes, or WSL's GPU bridge.
NVIDIA_DRIVER_PATHS = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/dxg")


def nvidia_driver_present() -> bool:
    """False only where there is surely no CUDA GPU: Linux without an NVIDIA driver loaded.

    Asking torch costs its import (1.5-2.5 s of the start on this 2-core CPU) and cuda-python
    its runtime; on a Linux machine without the driver's device nodes neither can find a GPU.
    Elsewhere (Windows, macOS) the answer is left to them.
    """
    if not sys.platform.startswith("linux"):
        return True
    return any(os.path.exists(path) for path in NVIDIA_DRIVER_PATHS)


def probe() -> Probe:
    """Look at this machine (imports TensorRT and ONNX Runtime if installed; no GPU work)."""
    versions: dict[str, str | None] = {}
    for name in ("tensorrt", "tensorrt-rtx"):
        try:
            versions[name] = load_flavour(name).version
        except TensorRTUnavailable:
            versions[name] = None
    torch_cuda = False
    if nvidia_driver_present():
        try:
            import torch

            torch_cuda = bool(torch.cuda.is_available())
        except ImportError:
            pass
    try:
        import onnxruntime  # noqa: F401  (the onnxruntime backend imports it anyway)

        ort = True
    except ImportError:
        ort = False
    found = find_gpu() if nvidia_driver_present() else None
    gpu = found if isinstance(found, GpuInfo) else None
    problem = found.reason if isinstance(found, GpuUnusable) else None
    return Probe(versions["tensorrt"], versions["tensorrt-rtx"], gpu, torch_cuda, ort, problem)


def choose_backend(found: Probe, *, without_tensorrt: bool = False) -> Choice:
    """The backend for ``found`` (pure).

    ``without_tensorrt``: the next choice after TensorRT failed here (``--backend auto``'s
    fallback); the reason then says TensorRT was not usable rather than not installed.
    """
    gpu = found.gpu
    if gpu is not None:
        cc = f"{gpu.capability[0]}.{gpu.capability[1]}"
        where = f"{gpu.name} (compute capability {cc})"
        if not without_tensorrt and found.tensorrt and gpu.capability >= TENSORRT_MIN_CAPABILITY:
            return Choice("tensorrt", "cuda", f"TensorRT {found.tensorrt} supports {where}")
        if not without_tensorrt and found.tensorrt_rtx and rtx_supports(gpu.capability):
            return Choice("tensorrt-rtx", "cuda", f"TensorRT-RTX {found.tensorrt_rtx} supports {where}")
        if without_tensorrt:
            missing = "without TensorRT"
        elif not (found.tensorrt or found.tensorrt_rtx):
            missing = "no TensorRT installed"
        else:
            missing = f"the installed TensorRT does not support {where}"
        if found.torch_cuda:
            return Choice("pytorch", "cuda", f"{missing}: PyTorch with CUDA graphs on {gpu.name}")
        return Choice("pytorch", "cpu", f"{missing} and PyTorch has no CUDA: PyTorch on the CPU")
    # A driver that cuda-python cannot use is named, with the fix, not reported as "no GPU".
    problem = f" ({found.gpu_problem})" if found.gpu_problem else ""
    if found.torch_cuda:
        return Choice(
            "pytorch", "cuda", f"PyTorch sees a CUDA GPU (cuda-python does not{problem}): PyTorch on CUDA"
        )
    no_gpu = f"no CUDA GPU usable{problem}" if problem else "no CUDA GPU"
    if found.onnxruntime:
        return Choice(
            "onnxruntime",
            "cpu",
            f"{no_gpu}: ONNX Runtime on the CPU, measured ~2.2x faster at decoding than PyTorch there",
        )
    return Choice("pytorch", "cpu", f"{no_gpu} and onnxruntime not installed: PyTorch on the CPU")
