"""Our models/ decoder against transformers' own Llama on the real SmolLM2 weights (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from bench.corpus import PARITY_PROMPTS as PROMPTS
from models.decoder import KVCache
from models.weights import load_decoder


@pytest.fixture(scope="module")
def ours(model_dir):
    return load_decoder(model_dir)


@pytest.fixture(scope="module")
def reference(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("prompt", PROMPTS)
@torch.inference_mode()
def test_prefill_logits_match_transformers(ours, reference, tokenizer, prompt):
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    expected = reference(ids).logits
    cache = KVCache.allocate(ours.config, 64)
    got = ours(ids, torch.arange(ids.shape[1]), cache)  # full-capacity attention, masked
    assert rel_err(got, expected) < 1e-4


@torch.inference_mode()
def test_incremental_decode_through_cache_matches_full_forward(ours, reference, tokenizer):
    ids = torch.tensor([tokenizer.encode(PROMPTS[2], add_special_tokens=False)])
    n = ids.shape[1]
    expected = reference(ids).logits
    cache = KVCache.allocate(ours.config, 128)
    split = n - 5
    parts = [ours(ids[:, :split], torch.arange(split), cache, kv_len=split)]
    for i in range(split, n):
        parts.append(ours(ids[:, i : i + 1], torch.tensor([i]), cache, kv_len=i + 1))
    assert rel_err(torch.cat(parts, dim=1), expected) < 1e-4


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_64_tokens_identical_to_transformers_generate(reference, pytorch_greedy, prompt):
    """Our PyTorch backend's 64 greedy tokens (conftest's ``pytorch_greedy``, EOS masked) = transformers'."""
    ids, got, _ = pytorch_greedy[prompt]
    with torch.inference_mode():
        # min_new_tokens masks EOS, so both sides produce exactly 64 tokens.
        out = reference.generate(
            torch.tensor([ids]), max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=2
        )
    expected = out[0, len(ids) :].tolist()
    assert got == expected
