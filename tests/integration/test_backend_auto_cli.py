"""``--backend auto`` without a CUDA GPU, through the CLI: a spoken question answered by ONNX Runtime."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from bench.speech import read_wav, speak
from engines.selection import choose_backend, probe
from tests.helpers.voice import assistant, transcribe


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
