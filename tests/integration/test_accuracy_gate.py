"""The accuracy gate (``engines/verify.py``), with ONNX Runtime as the decoder under test.

No TensorRT engine runs here, so the gate's logic is checked on a stand-in that runs the very
graph TensorRT builds from: a faithful candidate (ONNX Runtime fp32) must pass, a degraded one
(the same step with noisy logits) must be refused with the thresholds it missed. On a machine
with a supported GPU, ``assistant engine verify`` runs the same gate on the engine.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from assistant.config import DEFAULT_SYSTEM_PROMPT
from engines.driver import DecoderDriver
from engines.onnxruntime_backend import OnnxRuntimeOptions, load_onnxruntime_decoder
from engines.verify import Thresholds, verify_decoder
from tests.helpers.cli import run_cli

PROMPTS = ("What is the capital of France?", "How many days are in a leap year?")


class NoisyStep:
    """A step whose logits are perturbed, as a badly quantized engine's would be."""

    def __init__(self, step, scale, seed=0):
        self.step, self.scale = step, scale
        self.name, self.capacity_tokens = f"noisy {step.name}", step.capacity_tokens
        self.identity = step.identity
        self.rng = np.random.default_rng(seed)

    def forward(self, token_ids, start_pos):
        logits = self.step.forward(token_ids, start_pos)
        return logits + self.rng.normal(0, self.scale * logits.std(), logits.shape).astype(np.float32)

    def close(self):
        self.step.close()


@pytest.fixture(scope="module")
def ort32(smollm2_export, onnx_model_dir, tokenizer):
    smollm2_export("fp32")
    return load_onnxruntime_decoder(onnx_model_dir, tokenizer, OnnxRuntimeOptions(threads=2))


def test_faithful_candidate_passes_the_gate(ort32, decoder, tokenizer):
    report = verify_decoder(
        ort32, decoder, tokenizer, prompts=PROMPTS, max_new_tokens=24, system_prompt=DEFAULT_SYSTEM_PROMPT
    )
    print(
        f"\nonnxruntime fp32 vs pytorch fp32: agreement {report.token_agreement:.1%}, max logits err "
        f"{report.max_logits_rel_err:.2e}, ROUGE-L {report.rouge_l:.3f}"
    )
    assert report.passed, report.failures
    assert report.token_agreement == 1.0 and report.rouge_l == 1.0
    assert report.max_logits_rel_err < 1e-4
    assert "Paris" in report.results[0].reference_reply == report.results[0].candidate_reply
    assert json.loads(json.dumps(report.to_record()))["passed"] is True


def test_degraded_candidate_is_refused_naming_the_thresholds(ort32, decoder, tokenizer):
    noisy = DecoderDriver(NoisyStep(ort32.step, scale=1.5), tokenizer, sorted(ort32.eos_token_ids))
    report = verify_decoder(noisy, decoder, tokenizer, prompts=PROMPTS[:1], max_new_tokens=12)
    assert not report.passed
    assert any("logits relative error" in f for f in report.failures)
    assert any("token agreement" in f for f in report.failures)
    assert report.to_record()["passed"] is False
    strict = verify_decoder(ort32, decoder, tokenizer, prompts=PROMPTS[:1], max_new_tokens=8,
                            thresholds=Thresholds(max_logits_rel_err=0.0))  # fmt: skip
    assert [f.split(" ")[0] for f in strict.failures] == ["logits"]


def test_cli_verify_onnx_stand_in_passes_and_engine_verify_needs_a_gpu(smollm2_export, onnx_model_dir):
    store = str(onnx_model_dir.parent.parent)
    smollm2_export("fp16")  # an fp16 engine is built from this graph: the stand-in runs it
    out = run_cli("engine", "verify", "--store", store, "--onnxruntime", "--max-new-tokens-per-reply", "6")
    assert out.returncode == 0, out.stderr
    assert "onnxruntime-cpu fp16 vs pytorch-cpu fp32: token agreement" in out.stdout
    assert "PASSED" in out.stdout
    assert "no engine marked" in out.stdout
    out = run_cli("engine", "verify", "--store", store, "--flavour", "tensorrt-rtx")
    assert out.returncode == 2 and "runs on an NVIDIA GPU" in out.stderr and "Traceback" not in out.stderr
