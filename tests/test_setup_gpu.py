"""What ``scripts/setup.sh`` installs on a GPU machine, and cuda-python too new for the driver.

This machine has no GPU and no route to NVIDIA's index: the decision is tested as a table of
real GPUs and drivers, ``setup.sh``'s GPU branch end to end with a fake ``nvidia-smi`` (a
shell script first on ``PATH``) and pip pointed at an unreachable index, and cuda-python's
cudaErrorInsufficientDriver with a fake ``cuda.bindings.runtime``.
"""

from __future__ import annotations

import enum
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

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

REPO = Path(__file__).resolve().parents[1]
RTX4090 = "NVIDIA GeForce RTX 4090"
H100 = "NVIDIA H100 80GB HBM3"


# --- the decision: nvidia-smi facts -> extras ------------------------------------------------

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


# --- setup.sh's GPU branch, end to end --------------------------------------------------------

# A fake nvidia-smi: this machine has no GPU. It answers the two queries setup.sh makes.
FAKE_NVIDIA_SMI = """#!/bin/sh
# Fake nvidia-smi for tests/test_setup_gpu.py (the CI machine has no GPU).
case "$*" in
  *--query-gpu=name,compute_cap,driver_version*) echo "NVIDIA H100 80GB HBM3, 9.0, 580.95.05" ;;
  *-L*) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-fake)" ;;
  *) exit 9 ;;
esac
"""

# A stand-in for this project that pip installs without any index: an in-tree PEP 517 backend
# writes a wheel with the same extras (the TensorRT ones with their real requirements, which
# the unreachable index cannot serve) and an `assistant` script for setup's `models fetch`.
FAKE_BACKEND = """
import base64, hashlib, zipfile

def _digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

WHEEL = b"Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = {
        "fake_assistant.py": b"def main():\\n    print('fake assistant: models fetch')\\n",
        "fake_assistant-0.dist-info/METADATA": open("METADATA", "rb").read(),
        "fake_assistant-0.dist-info/WHEEL": WHEEL,
        "fake_assistant-0.dist-info/entry_points.txt": b"[console_scripts]\\nassistant = fake_assistant:main",
    }
    record = "".join(f"{n},{_digest(d)},{len(d)}\\n" for n, d in files.items())
    files["fake_assistant-0.dist-info/RECORD"] = (record + "fake_assistant-0.dist-info/RECORD,,\\n").encode()
    name = "fake_assistant-0-py3-none-any.whl"
    with zipfile.ZipFile(f"{wheel_directory}/{name}", "w") as wheel:
        for n, d in files.items():
            wheel.writestr(n, d)
    return name

build_editable = build_wheel

def get_requires_for_build_wheel(config_settings=None):
    return []

get_requires_for_build_editable = get_requires_for_build_wheel
"""


def fake_project(root: Path) -> None:
    """setup.sh and the decision module as they are, a stand-in project, a fake nvidia-smi."""
    for path in (
        "scripts/setup.sh",
        "setup_gpu.py",
        "engines/__init__.py",
        "engines/tensorrt/__init__.py",
        "engines/tensorrt/versions.py",
    ):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, root / path)
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    metadata = ["Metadata-Version: 2.1", "Name: fake-assistant", "Version: 0"]
    for extra in ("gpu", "gpu-cu13", *FLAVOUR_CUDA):
        metadata.append(f"Provides-Extra: {extra}")
        if extra in FLAVOUR_CUDA:  # its TensorRT package, as pyproject.toml names it
            metadata.append(f'Requires-Dist: {extras[extra][0]}; extra == "{extra}"')
    (root / "METADATA").write_text("\n".join(metadata) + "\n")
    (root / "fake_backend.py").write_text(FAKE_BACKEND)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "fake_backend"\nbackend-path = ["."]\n'
    )
    # The venv setup.sh would create, made 4 s faster: without its own pip (the base's serves).
    base = getattr(sys, "_base_executable", sys.executable)
    if subprocess.run([base, "-c", "import pip"], capture_output=True).returncode == 0:
        subprocess.run(
            [base, "-m", "venv", "--without-pip", "--system-site-packages", root / ".venv"], check=True
        )
    (root / "bin").mkdir()
    (root / "bin/nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (root / "bin/nvidia-smi").chmod(0o755)


def setup_sh(root: Path, **env: str) -> tuple[int, list[str], str]:
    """Run the copy's setup.sh offline: (exit status, stdout lines without colours, stderr)."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "ASSISTANT_", "VIRTUAL_ENV"))}
    result = subprocess.run(
        ["bash", "scripts/setup.sh"],
        cwd=root,
        env={
            **keep,
            "PATH": f"{root / 'bin'}:{os.environ['PATH']}",
            "PYTHON": sys.executable,
            "PIP_INDEX_URL": "http://127.0.0.1:9/simple",  # nothing listens: refused at once
            "PIP_RETRIES": "0",
            "PIP_TIMEOUT": "2",
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout).splitlines()
    return result.returncode, [line for line in out if line != "[setup] creating .venv"], result.stderr


def test_setup_on_a_gpu_machine_says_in_one_line_that_tensorrt_failed_and_still_succeeds(tmp_path):
    missing = subprocess.run(
        "for p in libportaudio2 libespeak-ng1 espeak-ng alsa-utils; do "
        "dpkg-query -W -f='${Status}' $p 2>/dev/null | grep -q 'ok installed' || echo $p; done",
        shell=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    if missing:
        pytest.skip(f"setup.sh would install system packages first: {missing}")
    fake_project(tmp_path)

    status, out, err = setup_sh(tmp_path)
    assert status == 0, (out, err)
    assert out[0].startswith(
        f"[setup] GPU: {H100} (compute capability 9.0), driver 580.95.05 (CUDA 13): full TensorRT"
    )
    assert out[1:3] == [
        "[setup] installing the assistant with extras [gpu-cu13]",
        "[setup] installing tensorrt-cu13",
    ]
    (notice,) = [line for line in out if "TensorRT not installed" in line]
    assert (
        "pip install -e '.[gpu-cu13,tensorrt-cu13]' failed (No matching distribution found for tensorrt-cu13"
        in notice
    )
    assert (
        "the decoder runs on PyTorch with CUDA graphs; retry: rm .venv/.setup-stamp && scripts/setup.sh"
        in notice
    )
    assert "ERROR" not in err  # pip's own report went to the log, not the screen
    assert "No matching distribution" in (tmp_path / ".venv/tensorrt-install.log").read_text()
    assert out[-1] == "fake assistant: models fetch"  # setup went on to the models
    stamp = tmp_path / ".venv/.setup-stamp"
    assert stamp.read_text().endswith(
        "extras=[gpu-cu13] gpu=1 tensorrt=tensorrt-cu13 (tensorrt install failed)\n"
    )

    # The next start does not retry (run.sh runs setup every time): nothing is installed.
    status, out, err = setup_sh(tmp_path)
    assert (status, out) == (0, ["fake assistant: models fetch"]), err

    # Another choice is another install.
    status, out, err = setup_sh(tmp_path, ASSISTANT_TENSORRT="none")
    assert status == 0, (out, err)
    assert "no TensorRT, as ASSISTANT_TENSORRT=none asks; cuda-python 13" in out[0]
    assert out[1:] == [
        "[setup] installing the assistant with extras [gpu-cu13]",
        "fake assistant: models fetch",
    ]
    assert stamp.read_text().endswith("extras=[gpu-cu13] gpu=1 tensorrt=none\n")


# --- cuda-python too new for the driver -------------------------------------------------------


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
