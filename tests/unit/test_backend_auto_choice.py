"""``--backend auto`` on a machine without a CUDA GPU: ONNX Runtime on the CPU (pure logic + CLI)."""

from __future__ import annotations

import pytest

from assistant.config import DecoderSettings
from assistant.stages.llm import onnx_dtype, resolve_auto_backend
from engines import selection
from engines.selection import Probe, choose_backend, probe
from engines.tensorrt.cuda_mem import GpuInfo

RTX4090 = GpuInfo("NVIDIA GeForce RTX 4090", (8, 9), 24 << 30)


NO_GPU_WITH_ORT = Probe(None, None, None, False, True)


def test_no_cuda_gpu_picks_onnxruntime_on_the_cpu_and_says_it_was_measured_faster():
    choice = choose_backend(NO_GPU_WITH_ORT)
    assert (choice.backend, choice.device) == ("onnxruntime", "cpu")
    assert "no CUDA GPU" in choice.reason and "faster" in choice.reason and "measured" in choice.reason
    # TensorRT installed without a GPU to run it changes nothing.
    assert choose_backend(Probe("10.13", "1.7.1", None, False, True)) == choice


def test_no_cuda_gpu_and_no_onnxruntime_falls_back_to_pytorch_on_the_cpu():
    choice = choose_backend(Probe(None, None, None, False, False))
    assert (choice.backend, choice.device) == ("pytorch", "cpu")
    assert "onnxruntime" in choice.reason and "not installed" in choice.reason


@pytest.mark.parametrize(
    ("found", "backend", "device"),
    [
        (Probe(None, None, RTX4090, True, True), "pytorch", "cuda"),  # a GPU still beats ONNX Runtime's CPU
        (Probe(None, "1.7.1", RTX4090, True, True), "tensorrt-rtx", "cuda"),
        (Probe(None, None, None, True, True), "pytorch", "cuda"),  # torch sees CUDA, cuda-python does not
    ],
)
def test_cuda_choices_do_not_change_with_onnxruntime_installed(found, backend, device):
    choice = choose_backend(found)
    assert (choice.backend, choice.device) == (backend, device)


def test_probe_reports_onnxruntime_importable():
    assert probe().onnxruntime is True  # a dependency of the project, installed here


def test_auto_settings_load_as_the_fp32_cpu_onnxruntime_backend(monkeypatch):
    monkeypatch.setattr(selection, "probe", lambda: NO_GPU_WITH_ORT)
    decoder, reason = resolve_auto_backend(DecoderSettings(backend="auto"))
    assert decoder.backend == "onnxruntime" and decoder.device in ("auto", "cpu")
    assert onnx_dtype(decoder.dtype) == "fp32"
    assert reason == choose_backend(NO_GPU_WITH_ORT).reason


def test_auto_with_a_dtype_onnx_has_not_runs_pytorch_and_says_why(monkeypatch):
    monkeypatch.setattr(selection, "probe", lambda: NO_GPU_WITH_ORT)
    decoder, reason = resolve_auto_backend(DecoderSettings(backend="auto", dtype="bf16"))
    assert (decoder.backend, decoder.device, decoder.dtype) == ("pytorch", "cpu", "bf16")
    assert "bf16 is not exported to ONNX" in reason
