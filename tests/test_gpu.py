"""CUDA half-precision paths of the PyTorch backend against CPU fp32 (run on the GPU machine).

Random weights of the real SmolLM2-135M shape (the GPU machine has no model store); the
numerics checked do not depend on the values. Skipped without CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engines.torch_backend import TorchBackendOptions, load_torch_decoder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SMOLLM2_135M = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    eos_token_id=2,
)


class NoTokenizer:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(65 + i % 26) for i in ids)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("smollm2-shape")
    LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_cuda_half_logits_track_cpu_fp32_through_prefill_and_decode(model_dir, dtype):
    cpu = load_torch_decoder(model_dir, NoTokenizer(), TorchBackendOptions(device="cpu", dtype="fp32"))
    gpu = load_torch_decoder(model_dir, NoTokenizer(), TorchBackendOptions(device="cuda", dtype=dtype))
    assert gpu.name == f"pytorch-cuda {dtype}"
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 49152, 300).tolist()
    pairs = [(cpu.prefill(prompt), gpu.prefill(prompt))]
    for token in rng.integers(0, 49152, 32).tolist():  # teacher-forced, so both see the same ids
        pairs.append((cpu.decode(token), gpu.decode(token)))
    errors = [np.linalg.norm(g - c) / np.linalg.norm(c) for c, g in pairs]
    agree = np.mean([int(np.argmax(c) == np.argmax(g)) for c, g in pairs])
    print(f"{dtype}: max logits rel err {max(errors):.2e}, top-1 agreement {agree:.0%}")
    assert max(errors) < (2e-2 if dtype == "fp16" else 5e-2)
    assert agree >= 0.9
