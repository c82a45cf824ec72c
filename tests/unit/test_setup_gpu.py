"""What ``scripts/setup.sh`` installs on a GPU machine, and cuda-python too new for the driver.

This machine has no GPU and no route to NVIDIA's index: the decision is tested as a table of
real GPUs and drivers, ``setup.sh``'s GPU branch end to end with a fake ``nvidia-smi`` (a
shell script first on ``PATH``) and pip pointed at an unreachable index, and cuda-python's
cudaErrorInsufficientDriver with a fake ``cuda.bindings.runtime``.
"""

from __future__ import annotations

import enum
import shutil
import tomllib

import pytest

from engines import selection
from engines.selection import choose_backend
from engines.tensorrt import cuda_mem, flavour
from engines.tensorrt.versions import CUDA_PYTHON_PIN
from setup_gpu import (
    FLAVOUR_CUDA,
    GPU_EXTRA,
    Gpu,
    parse_nvidia_smi,
    plan_install,
)
from tests.helpers.nvidia import H100
from tests.helpers.paths import ROOT as REPO

RTX4090 = "NVIDIA GeForce RTX 4090"


# (nvidia-smi rows "name, compute_cap, driver_version", gpu extra, TensorRT extra, words in the reason)
TABLE = [
    ([f"{RTX4090}, 8.9, 580.95.05"], "gpu-cu13", "tensorrt-rtx", "TensorRT-RTX"),
    ([f"{RTX4090}, 8.9, 550.144.03"], "gpu", "tensorrt-cu12", "CUDA 13 builds, they need R580+"),
    ([f"{RTX4090}, 8.9, 575.64.05"], "gpu", "tensorrt-cu12", "need R580+"),  # CUDA 12.9 driver
    ([f"{RTX4090}, 8.9, 580.65.06"], "gpu-cu13", "tensorrt-rtx", "CUDA 13"),  # CUDA 13.0's oldest
    ([f"{H100}, 9.0, 580.95.05"], "gpu-cu13", "tensorrt-cu13", "does not run on compute capability 9.0"),
    (["NVIDIA H200, 9.0, 570.133.20"], "gpu", "tensorrt-cu12", "does not run on compute capability 9.0"),
    (["Tesla T4, 7.5, 535.183.01"], "gpu", "tensorrt-cu12", "does not run on compute capability 7.5"),
    (["NVIDIA A100-SXM4-80GB, 8.0, 580.82.07"], "gpu-cu13", "tensorrt-rtx", "cuda-python 13"),
    (["NVIDIA A100-SXM4-80GB, 8.0, 470.256.02"], "gpu", None, "update the NVIDIA driver"),
    (["NVIDIA GeForce RTX 5090, 12.0, 580.95.05"], "gpu-cu13", "tensorrt-rtx", "compute capability 12.0"),
    (["NVIDIA RTX A6000, 8.6, 570.124.06"], "gpu", "tensorrt-cu12", "need R580+"),
    (["NVIDIA GeForce GTX 1080, 6.1, 580.95.05"], "gpu-cu13", None, "7.5+"),
    (["Tesla K80, 3.7, 470.256.02"], "gpu", None, "7.5+"),
    (["Orin (nvgpu), 8.7, 540.4.0"], "gpu", None, "JetPack"),  # Jetson: TensorRT is JetPack's
    ([f"{H100}, 9.0, 580.95.05"] * 2, "gpu-cu13", "tensorrt-cu13", f"2 x {H100}"),
    # Mixed: full TensorRT runs on both; RTX would not run on the H100.
    ([f"{RTX4090}, 8.9, 580.95.05", f"{H100}, 9.0, 580.95.05"], "gpu-cu13", "tensorrt-cu13", "9.0"),
    # A GPU too old for any TensorRT does not keep the other from RTX.
    (
        ["NVIDIA GeForce RTX 5090, 12.0, 580.95.05", "NVIDIA GeForce GTX 1080, 6.1, 580.95.05"],
        "gpu-cu13",
        "tensorrt-rtx",
        "GTX 1080 (compute capability 6.1) is older than TensorRT supports",
    ),
    ([], "gpu", None, "did not report"),  # an nvidia-smi that cannot query compute_cap
]


@pytest.mark.parametrize(("rows", "gpu_extra", "tensorrt", "why"), TABLE)
def test_setup_installs_the_tensorrt_that_fits_the_gpu_and_driver(rows, gpu_extra, tensorrt, why):
    plan = plan_install(parse_nvidia_smi("\n".join(rows) + "\n"))
    assert (plan.gpu_extra, plan.tensorrt) == (gpu_extra, tensorrt), plan.reason
    assert why in plan.reason
    # cuda-python's major is the flavour's CUDA major (without TensorRT: the driver's).
    major = FLAVOUR_CUDA[tensorrt] if tensorrt else {v: k for k, v in GPU_EXTRA.items()}[gpu_extra]
    assert GPU_EXTRA[major] == gpu_extra and f"cuda-python {major}" in plan.reason
    assert "\n" not in plan.line() and plan.line().split()[:2] == [gpu_extra, tensorrt or "none"]


def test_nvidia_smi_rows_parse_with_unknown_compute_capability():
    assert parse_nvidia_smi("NVIDIA GeForce RTX 4090, 8.9, 580.95.05\nOld GPU, [N/A], 470.1\n\n") == [
        Gpu(RTX4090, (8, 9), "580.95.05"),
        Gpu("Old GPU", None, "470.1"),
    ]


def test_assistant_tensorrt_forces_a_flavour_or_none():
    rtx = parse_nvidia_smi(f"{RTX4090}, 8.9, 580.95.05")
    forced = plan_install(rtx, "tensorrt-cu12")
    assert (forced.gpu_extra, forced.tensorrt) == ("gpu", "tensorrt-cu12")  # cuda-python follows the flavour
    assert "ASSISTANT_TENSORRT=tensorrt-cu12" in forced.reason
    assert (plan_install(rtx, "none").gpu_extra, plan_install(rtx, "none").tensorrt) == ("gpu-cu13", None)
    with pytest.raises(ValueError, match="ASSISTANT_TENSORRT='tensorrt-cu11'"):
        plan_install(rtx, "tensorrt-cu11")


def test_pyproject_extras_pin_cuda_python_to_one_major_that_matches_their_cuda():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def cuda_python(extra: str) -> str:
        (pin,) = [r.replace(" ", "") for r in extras[extra] if r.startswith("cuda-python")]
        return pin

    for name, major in {**{v: k for k, v in GPU_EXTRA.items()}, **FLAVOUR_CUDA, "tensorrt": 12}.items():
        assert cuda_python(name) == CUDA_PYTHON_PIN[major], name
    assert "cuda-python>=13" in CUDA_PYTHON_PIN[13] and "<14" in CUDA_PYTHON_PIN[13]
    assert "<13" in CUDA_PYTHON_PIN[12]
    # The capabilities setup decides by are the ones the runtime and auto-selection use.
    import setup_gpu

    assert setup_gpu.RTX_RUNNABLE == flavour.RTX_RUNNABLE
    assert setup_gpu.TENSORRT_MIN_CAPABILITY == selection.TENSORRT_MIN_CAPABILITY


class InsufficientDriverCudart:
    """``cuda.bindings.runtime`` as cuda-python 13.4 answers on a machine whose driver is older.

    ``driver`` 0 is no driver at all, which the real cuda-python 13.4 reports on this CPU
    machine the same way (cudaErrorInsufficientDriver from cudaGetDeviceCount, driver version 0).
    """

    class cudaError_t(enum.IntEnum):  # noqa: N801 (cuda-python's names)
        cudaSuccess = 0
        cudaErrorInsufficientDriver = 35

    def __init__(self, driver: int) -> None:
        self.driver = driver

    def cudaGetDeviceCount(self):  # noqa: N802
        return self.cudaError_t.cudaErrorInsufficientDriver, None

    def cudaDriverGetVersion(self):  # noqa: N802
        return self.cudaError_t.cudaSuccess, self.driver

    def cudaRuntimeGetVersion(self):  # noqa: N802
        return self.cudaError_t.cudaSuccess, 13040

    def cudaGetErrorString(self, status):  # noqa: N802
        return self.cudaError_t.cudaSuccess, b"CUDA driver version is insufficient for CUDA runtime version"


def test_auto_names_cuda_python_too_new_for_the_driver_and_the_pin_that_fixes_it(monkeypatch):
    monkeypatch.setattr(cuda_mem, "cudart", lambda: InsufficientDriverCudart(12040))  # R550: CUDA 12.4
    monkeypatch.setattr(selection, "nvidia_driver_present", lambda: True)  # its device nodes are there
    found = selection.probe()
    assert found.gpu is None
    reason = choose_backend(found).reason
    assert "cuda-python is built for CUDA 13.4 and the NVIDIA driver runs CUDA 12.4 at most" in reason
    assert "pip install 'cuda-python>=12.6.1,<13', or update the NVIDIA driver to R580+" in reason
    assert not reason.startswith("no CUDA GPU:")
    # Where PyTorch still sees the GPU, the reason says why TensorRT was not considered.
    with_torch = choose_backend(selection.Probe(None, None, None, True, True, found.gpu_problem))
    assert with_torch.backend == "pytorch" and "pip install 'cuda-python>=12.6.1,<13'" in with_torch.reason


def test_tensorrt_backend_refuses_with_the_driver_reason(monkeypatch, tmp_path):
    pytest.importorskip("tensorrt_rtx_bindings")
    from engines.tensorrt.backend import load_tensorrt_decoder
    from engines.tensorrt.flavour import TensorRTUnavailable
    from engines.tensorrt.options import EngineOptions

    monkeypatch.setattr(cuda_mem, "cudart", lambda: InsufficientDriverCudart(12040))
    with pytest.raises(
        TensorRTUnavailable, match=r"cudaErrorInsufficientDriver\): pip install 'cuda-python>=12\.6\.1,<13'"
    ):
        load_tensorrt_decoder(tmp_path, None, EngineOptions(flavour="tensorrt-rtx"), tmp_path)


def test_no_driver_at_all_is_still_no_gpu(monkeypatch):
    if shutil.which("nvidia-smi") is None:  # the real cuda-python here: no driver, no GPU
        pytest.importorskip("cuda.bindings.runtime")
        assert cuda_mem.find_gpu() is None
    monkeypatch.setattr(cuda_mem, "cudart", lambda: InsufficientDriverCudart(0))
    assert cuda_mem.find_gpu() is None and cuda_mem.gpu_info() is None
    assert choose_backend(selection.probe()).reason.startswith("no CUDA GPU: ONNX Runtime on the CPU")
