"""``scripts/setup.sh``'s GPU branch end to end, with a fake ``nvidia-smi`` and an unreachable index."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from setup_gpu import FLAVOUR_CUDA
from tests.helpers.nvidia import H100
from tests.helpers.paths import ROOT as REPO

# A fake nvidia-smi: this machine has no GPU. It answers the two queries setup.sh makes.
FAKE_NVIDIA_SMI = """#!/bin/sh
# Fake nvidia-smi for tests/unit/test_setup_gpu.py (the CI machine has no GPU).
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


def setup_sh(root: Path, *args: str, **env: str) -> tuple[int, list[str], str]:
    """Run the copy's setup.sh offline: (exit status, stdout lines without colours, stderr)."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "ASSISTANT_", "VIRTUAL_ENV"))}
    result = subprocess.run(
        ["bash", "scripts/setup.sh", *args],
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


def skip_unless_installed(packages: str) -> None:
    """Skip when setup.sh would install system packages first (it needs root and the network)."""
    missing = subprocess.run(
        f"for p in {packages}; do "
        "dpkg-query -W -f='${Status}' $p 2>/dev/null | grep -q 'ok installed' || echo $p; done",
        shell=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    if missing:
        pytest.skip(f"setup.sh would install system packages first: {missing}")


def test_setup_on_a_gpu_machine_says_in_one_line_that_tensorrt_failed_and_still_succeeds(tmp_path):
    skip_unless_installed("libportaudio2 libespeak-ng1 espeak-ng alsa-utils")
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


def test_a_start_after_the_test_set_up_installs_nothing_and_a_missing_extra_is_installed(tmp_path):
    """run.sh runs setup.sh at every start: after test.sh's ``--dev`` set-up, which installed
    more, a start installed everything again (and the next test run again: ~9 s of pip at every
    switch). A stamp with more extras now counts as done; one that lacks an extra does not."""
    skip_unless_installed(
        "libportaudio2 libespeak-ng1 espeak-ng alsa-utils pulseaudio pulseaudio-utils "
        "libasound2-plugins sox tmux prometheus"
    )
    fake_project(tmp_path)
    fetched = "fake assistant: models fetch"

    status, out, err = setup_sh(tmp_path, "--dev", ASSISTANT_TENSORRT="none")
    assert status == 0, (out, err)
    assert "[setup] installing the assistant with extras [gpu-cu13,dev,piper]" in out
    stamp = (tmp_path / ".venv/.setup-stamp").read_text()

    status, out, err = setup_sh(tmp_path, ASSISTANT_TENSORRT="none")  # scripts/run.sh
    assert (status, out) == (0, [fetched]), err
    status, out, err = setup_sh(tmp_path, "--dev", ASSISTANT_TENSORRT="none")  # scripts/test.sh
    assert (status, out) == (0, [fetched]), err
    assert (tmp_path / ".venv/.setup-stamp").read_text() == stamp

    status, out, err = setup_sh(tmp_path, "--serve", ASSISTANT_TENSORRT="none")
    assert status == 0 and "[setup] installing the assistant with extras [gpu-cu13,serve]" in out, (out, err)
