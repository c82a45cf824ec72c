"""``--backend auto`` on a machine without a CUDA GPU: ONNX Runtime on the CPU (pure logic + CLI)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from assistant.config import DecoderSettings
from assistant.stages.llm import onnx_dtype, resolve_auto_backend
from engines import selection
from engines.selection import Probe, choose_backend, probe
from engines.tensorrt.cuda_mem import GpuInfo
from tests.speech import read_wav, speak
from tests.test_voice import assistant, transcribe

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


def test_cli_auto_on_a_cpu_machine_answers_a_spoken_question_with_onnxruntime(store, tmp_path):
    found = probe()
    if found.gpu is not None or found.torch_cuda:
        pytest.skip("this machine has a CUDA GPU: auto picks a GPU backend here")
    speak("What is the capital of France?", tmp_path, "question")
    out, log = tmp_path / "reply.wav", tmp_path / "turns.jsonl"
    result = assistant(
        "--backend", "auto", "run", "--input", str(tmp_path / "question.wav"),
        "--output", str(out), "--log", str(log),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = re.search(r"backend auto: (\S+) \((.+)\)", result.stderr)
    assert said and said[1] == "onnxruntime" and said[2] == choose_backend(found).reason, result.stderr
    (line,) = log.read_text().splitlines()
    record = json.loads(line)
    assert record["backend"].startswith("onnxruntime-cpu"), record["backend"]
    assert "capital of france" in re.sub(r"[^a-z ]", "", record["transcript"].lower())
    assert "Paris" in record["reply"]
    from faster_whisper import WhisperModel

    whisper = WhisperModel(
        str(store.fetch("whisper-tiny.en", progress=lambda _m: None)),
        device="cpu",
        compute_type="int8",
        cpu_threads=2,
    )
    reply = read_wav(out)
    assert np.abs(reply).max() > 0.05
    assert "paris" in transcribe(whisper, reply).lower()
