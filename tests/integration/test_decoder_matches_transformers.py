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
@torch.inference_mode()
def test_greedy_64_tokens_identical_to_transformers_greedy(reference, pytorch_greedy, prompt):
    """Each of our PyTorch backend's 64 greedy tokens (conftest's ``pytorch_greedy``, EOS masked)
    is transformers' argmax after the prompt and our tokens before it.

    So transformers' greedy decoding, EOS masked as ``min_new_tokens`` masks it, gives the same
    64 tokens. Its logits at every step come from one forward pass over the prompt and our
    tokens, not from ``generate``'s 64 steps (22 s of CPU for the three prompts, against 2).
    """
    ids, got, _ = pytorch_greedy[prompt]
    logits = reference(torch.tensor([ids + got])).logits[0, len(ids) - 1 : -1]
    eos = reference.generation_config.eos_token_id
    logits[:, [eos] if isinstance(eos, int) else list(eos)] = -torch.inf
    expected = logits.argmax(dim=-1).tolist()
    assert got == expected  # pytest names the first step that differs
