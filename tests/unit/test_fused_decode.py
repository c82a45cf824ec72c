"""The fused batch-1 decode step (engines/fused_decode.py) against the eager model's logits.

Tiny random Llama/Qwen2 models (randomised norms and biases). The torch decomposition runs
everywhere; the Triton kernels run here only when Triton is importable, under its CPU
interpreter (``TRITON_INTERPRET=1``); tests/gpu runs them compiled on CUDA.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from engines.cuda_graph import CudaGraphStep, GraphOptions
from engines.fused_decode import FusedDecode, unsupported
from models.config import DecoderConfig
from models.decoder import Decoder, KVCache
from models.weights import load_decoder
from tests.helpers.families import randomise_norms_and_biases

COMMON = dict(
    vocab_size=300,
    hidden_size=192,  # 6 heads of 32: a group of 3 query heads per KV head, as SmolLM2
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=512,
    eos_token_id=None,
)
INTERPRETED = importlib.util.find_spec("triton") is not None and os.environ.get("TRITON_INTERPRET") == "1"


def tiny(tmp_path, family="llama", seed=0):
    torch.manual_seed(seed)
    if family == "qwen2":  # q/k/v biases
        hf = Qwen2ForCausalLM(Qwen2Config(**COMMON, tie_word_embeddings=False, rope_theta=1e6))
    else:
        hf = LlamaForCausalLM(LlamaConfig(**COMMON, rope_theta=1e4))
    randomise_norms_and_biases(hf).save_pretrained(tmp_path)
    return load_decoder(tmp_path, dtype=torch.float32, device="cpu")


def eager_logits(model: Decoder, ids: list[int], capacity: int) -> list[torch.Tensor]:
    """Each position's logits, one token at a time through the eager (unfused) model."""
    cache = KVCache.allocate(model.config, capacity)
    out = []
    with torch.inference_mode():
        for p, t in enumerate(ids):
            logits = model(torch.tensor([[t]]), torch.tensor([p]), cache, kv_len=capacity)
            out.append(logits[0, -1])
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_fused_decode_matches_eager_logits(tmp_path, family):
    eager = tiny(tmp_path, family)
    fused_model = tiny(tmp_path, family)
    fused_model.fuse()
    capacity = 192  # window 192: 3 attention splits of 64 slots, the first 2 reached below
    ids = np.random.default_rng(1).integers(0, COMMON["vocab_size"], 100).tolist()
    expected = eager_logits(eager, ids, capacity)
    cache = KVCache.allocate(fused_model.config, capacity, separate_layers=True)
    step = FusedDecode(fused_model, cache, use_triton=False)
    assert step.backend == "torch"
    worst = 0.0
    with torch.inference_mode():
        for p, t in enumerate(ids):
            got = step(torch.tensor([[t]]), torch.tensor([p]), capacity)[0]
            worst = max(worst, float((got - expected[p]).norm() / expected[p].norm()))
            assert int(got.argmax()) == int(expected[p].argmax()), f"top-1 differs at position {p}"
    assert worst < 1e-5, worst


@pytest.mark.skipif(not INTERPRETED, reason="needs Triton and TRITON_INTERPRET=1 (slow: ~1 s a step)")
def test_triton_kernels_match_eager_logits_interpreted(tmp_path):
    """The kernels themselves, interpreted: positions 60-67 cross the first split (64 slots)."""
    eager = tiny(tmp_path, "qwen2")
    fused_model = tiny(tmp_path, "qwen2")
    fused_model.fuse()
    capacity, first = 192, 60
    ids = np.random.default_rng(1).integers(0, COMMON["vocab_size"], first + 8).tolist()
    expected = eager_logits(eager, ids, capacity)
    cache = KVCache.allocate(fused_model.config, capacity, separate_layers=True)
    torch_step = FusedDecode(fused_model, cache, use_triton=False)  # fills the cache quickly
    triton_step = FusedDecode(fused_model, cache, use_triton=True, programs=1)
    with torch.inference_mode():
        for p, t in enumerate(ids):
            step = torch_step if p < first else triton_step
            got = step(torch.tensor([[t]]), torch.tensor([p]), capacity)[0]
            assert float((got - expected[p]).norm() / expected[p].norm()) < 1e-5
            assert int(got.argmax()) == int(expected[p].argmax())


def test_graph_step_decodes_with_kernels_like_without(tmp_path, monkeypatch):
    """CudaGraphStep(decode_kernels) without capture: the same greedy tokens and logits."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the torch operations: seconds, not minutes
    tiny(tmp_path)  # writes the folder
    options = GraphOptions((4, 16), (64,), capture=False)
    plain = CudaGraphStep(load_decoder(tmp_path), 128, options)
    kernels = GraphOptions((4, 16), (64,), capture=False, decode_kernels=True)
    fused = CudaGraphStep(load_decoder(tmp_path), 128, kernels)
    assert fused.fused is not None and fused.name.endswith("-decode")
    prompt = np.random.default_rng(2).integers(0, COMMON["vocab_size"], 9).tolist()
    a, b = plain.forward(prompt, 0), fused.forward(prompt, 0)
    for step in range(70):  # crosses the 64-slot window
        token = int(a.argmax())
        assert token == int(b.argmax())
        a, b = plain.forward([token], len(prompt) + step), fused.forward([token], len(prompt) + step)
        assert float(np.abs(a - b).max()) < 1e-4


def test_unsupported_families_are_named():
    base = DecoderConfig(vocab_size=10, hidden_size=64, intermediate_size=64, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=32)  # fmt: skip
    assert unsupported(base) is None
    gemma = DecoderConfig(**{**base.__dict__, "norm_plus_one": True, "hidden_act": "gelu_pytorch_tanh"})
    reason = unsupported(gemma)
    assert reason is not None and "(1 + w) norms" in reason and "gelu_pytorch_tanh" in reason
