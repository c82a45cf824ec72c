"""Which TensorRT ``scripts/setup.sh`` installs for this machine's NVIDIA GPUs and driver.

Set-up code, not part of the installed package. Pure and standard-library only, because setup
runs it in a fresh ``.venv`` before any dependency is installed: ``nvidia-smi
--query-gpu=name,compute_cap,driver_version --format=csv,noheader | python -m setup_gpu
[FLAVOUR]`` (from the repository root) prints one line,
``<gpu extra> <tensorrt extra or none> <reason>`` (the extras are ``pyproject.toml``'s).

- TensorRT-RTX 1.7 (real PyPI wheels, CUDA 13 builds) when every GPU TensorRT can use is one
  it runs on (compute capability 8.0, 8.6, 8.9, 12.0, 12.1) and the driver runs CUDA 13 (R580+).
- Otherwise full TensorRT for GPUs of compute capability 7.5+, built for the driver's CUDA:
  ``tensorrt-cu13`` on R580+, ``tensorrt-cu12`` on R525+ (its PyPI package is a stub that
  fetches the libraries from NVIDIA's index during the install).
- Nothing on older GPUs or drivers, nor on Jetson (TensorRT comes with JetPack there).
- cuda-python's major is the flavour's CUDA major (without TensorRT: the driver's). cuda-python
  13.x needs an R580+ driver: on an older one ``cudaGetDeviceCount`` fails with
  cudaErrorInsufficientDriver. 12.x runs on R525+ drivers, newer ones included.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass

# The runtime's own facts (standard library only, like this module): the GPUs TensorRT and
# TensorRT-RTX run on, each CUDA major's oldest driver, cuda-python's pin per major.
from engines.tensorrt.versions import (
    CUDA_DRIVER_MIN,
    RTX_RUNNABLE,
    TENSORRT_MIN_CAPABILITY,
)

GPU_EXTRA = {12: "gpu", 13: "gpu-cu13"}  # pyproject extras: cuda-python of that major + nvidia-ml-py
FLAVOUR_CUDA = {"tensorrt-rtx": 13, "tensorrt-cu13": 13, "tensorrt-cu12": 12}
FLAVOURS = ("auto", "none", *FLAVOUR_CUDA)
# Integrated (Jetson) GPUs: Nano 5.3, TX2 6.2, Xavier 7.2, Orin 8.7.
JETSON_CAPABILITIES = frozenset({(5, 3), (6, 2), (7, 2), (8, 7)})
JETSON_NAMES = ("jetson", "tegra", "orin", "xavier", "nvgpu")
WHAT = {
    "tensorrt-rtx": "TensorRT-RTX 1.7 (tensorrt-rtx-cu13 wheels from PyPI)",
    "tensorrt-cu13": "full TensorRT for CUDA 13 (tensorrt-cu13, libraries from NVIDIA's index)",
    "tensorrt-cu12": "full TensorRT for CUDA 12 (tensorrt-cu12, libraries from NVIDIA's index)",
}


@dataclass(frozen=True)
class Gpu:
    """One row of ``nvidia-smi --query-gpu=name,compute_cap,driver_version``."""

    name: str
    capability: tuple[int, int] | None  # None: nvidia-smi did not say
    driver: str


@dataclass(frozen=True)
class InstallPlan:
    """What setup pip-installs: ``pyproject.toml`` extras, and why in one line."""

    gpu_extra: str  # "gpu" (cuda-python 12) or "gpu-cu13" (cuda-python 13)
    tensorrt: str | None  # "tensorrt-rtx", "tensorrt-cu13", "tensorrt-cu12" or None
    reason: str

    def line(self) -> str:
        """``<gpu extra> <tensorrt extra or none> <reason>``, what ``setup.sh`` reads."""
        return f"{self.gpu_extra} {self.tensorrt or 'none'} {self.reason}"


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """The GPUs in ``nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader``."""
    gpus = []
    for row in text.splitlines():
        rest = row.rsplit(",", 2)  # a name could hold a comma, the numbers cannot
        if len(rest) != 3:
            continue
        name, cap, driver = (part.strip() for part in rest)
        try:
            major, minor = (int(x) for x in cap.split("."))
            capability: tuple[int, int] | None = (major, minor)
        except ValueError:  # "[N/A]", or an nvidia-smi that cannot query compute_cap
            capability = None
        gpus.append(Gpu(name, capability, driver))
    return gpus


def driver_cuda(driver: str) -> int | None:
    """The newest CUDA major a Linux driver version (``580.95.05``) runs; None when older or unknown."""
    try:
        version = tuple(int(x) for x in driver.strip().split("."))
    except ValueError:
        return None
    return next((major for major, oldest in CUDA_DRIVER_MIN.items() if version >= oldest), None)


def plan_install(gpus: list[Gpu], flavour: str = "auto") -> InstallPlan:
    """The TensorRT flavour and cuda-python major for ``gpus`` (one driver), or why none.

    Args:
        gpus: What nvidia-smi reports (:func:`parse_nvidia_smi`).
        flavour: ``auto``, ``none`` (no TensorRT), or a flavour to install regardless.

    Raises:
        ValueError: ``flavour`` is none of :data:`FLAVOURS`.
    """
    if flavour not in FLAVOURS:
        raise ValueError(f"ASSISTANT_TENSORRT={flavour!r}: use one of {', '.join(FLAVOURS)}")
    driver = gpus[0].driver if gpus else "unknown"  # one driver serves every GPU
    cuda = driver_cuda(driver)
    runs = f"CUDA {cuda}" if cuda else ("older than CUDA 12" if driver[:1].isdigit() else "CUDA unknown")
    where = f"{_describe(gpus)}, driver {driver} ({runs})"
    plain = GPU_EXTRA[cuda or 12]  # cuda-python for the driver when no TensorRT decides it

    def without(why: str) -> InstallPlan:
        return InstallPlan(plain, None, f"{where}: no TensorRT, {why}; cuda-python {cuda or 12}")

    def install(name: str, why: str = "") -> InstallPlan:
        major = FLAVOUR_CUDA[name]
        return InstallPlan(GPU_EXTRA[major], name, f"{where}: {WHAT[name]}, cuda-python {major}{why}")

    if flavour == "none":
        return without("as ASSISTANT_TENSORRT=none asks")
    if flavour != "auto":
        return install(flavour, f" (ASSISTANT_TENSORRT={flavour})")
    if not gpus:
        return without("nvidia-smi did not report the GPUs' compute capability (drivers before R510 cannot)")
    if any(_is_jetson(g) for g in gpus):
        return without("on Jetson TensorRT comes with JetPack (python3-libnvinfer), pip's wheels do not run")
    usable = [g for g in gpus if g.capability is not None and g.capability >= TENSORRT_MIN_CAPABILITY]
    if not usable:
        return without("it needs compute capability 7.5+ (Turing or newer)")
    if cuda is None:
        return without("it needs a driver for CUDA 12 (R525+) or CUDA 13 (R580+): update the NVIDIA driver")
    too_old = [g for g in gpus if g not in usable]
    skipped = f"; {_describe(too_old)} is older than TensorRT supports (7.5+)" if too_old else ""
    if all(g.capability in RTX_RUNNABLE for g in usable):
        if cuda >= 13:
            return install("tensorrt-rtx", skipped)
        return install(
            "tensorrt-cu12", f"; TensorRT-RTX's wheels are CUDA 13 builds, they need R580+{skipped}"
        )
    refused = sorted({_cc(g.capability) for g in usable if g.capability not in RTX_RUNNABLE})
    return install(f"tensorrt-cu{cuda}", f"; TensorRT-RTX does not run on {', '.join(refused)}{skipped}")


def _is_jetson(gpu: Gpu) -> bool:
    return gpu.capability in JETSON_CAPABILITIES or any(j in gpu.name.lower() for j in JETSON_NAMES)


def _cc(capability: tuple[int, int] | None) -> str:
    return (
        f"compute capability {capability[0]}.{capability[1]}" if capability else "compute capability unknown"
    )


def _describe(gpus: list[Gpu]) -> str:
    """``2 x NVIDIA H100 (compute capability 9.0) + NVIDIA T4 (compute capability 7.5)``."""
    counts = Counter((g.name, g.capability) for g in gpus)
    parts = [f"{f'{n} x ' if n > 1 else ''}{name} ({_cc(cap)})" for (name, cap), n in counts.items()]
    return " + ".join(parts) or "an NVIDIA GPU"


def main(argv: list[str]) -> int:
    """Read nvidia-smi's CSV on stdin, print :meth:`InstallPlan.line` (``argv[0]``: the flavour)."""
    try:
        plan = plan_install(parse_nvidia_smi(sys.stdin.read()), argv[0] if argv else "auto")
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    print(plan.line())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
