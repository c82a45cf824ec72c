"""Tiny random-weight models of each supported family, built with transformers' own classes.

Each keeps the fields of a real checkpoint's ``config.json`` that make its family differ from
Llama (named in the comment), at small sizes: sliding windows of 8 positions and a longrope
switch at 64 positions, so a 40-token prompt and 32 generated tokens cross both. No such
checkpoints ship in a registry package; the math is the same at any size. Norm weights and
biases are randomised so a norm or bias that is loaded wrong (or not applied) changes the logits.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MinistralConfig,
    MinistralForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

VOCAB = 300
SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    eos_token_id=None,  # random weights: generate the full length on both sides
)
WINDOW = 8  # sliding windows, crossed by every test prompt
LONGROPE_SWITCH = 64  # original_max_position_embeddings of the longrope models


def qwen3() -> PreTrainedModel:
    """Qwen3-0.6B: per-head q/k RMSNorm, head_dim 128 != hidden / heads, tied, theta 1e6."""
    config = Qwen3Config(**SMALL, head_dim=32, rope_theta=1e6, tie_word_embeddings=True)
    return Qwen3ForCausalLM(config)


def gemma3() -> PreTrainedModel:
    """Gemma 3 4B text: 5 sliding (local base 1e4) per global layer (base 1e6, linear x8),
    query_pre_attn_scalar, (1 + w) norms, sandwich norms, gelu-tanh, scaled embeddings."""
    config = Gemma3TextConfig(
        **{**SMALL, "num_hidden_layers": 6, "num_key_value_heads": 1},
        head_dim=32,
        query_pre_attn_scalar=24,  # 27B: 168 with head_dim 128, so not head_dim's scale
        sliding_window=WINDOW,
        rope_theta=1e6,
        rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        attn_implementation="eager",
    )
    return Gemma3ForCausalLM(config)


def gemma2() -> PreTrainedModel:
    """Gemma 2 2B: alternating sliding/global layers, attention and final logit soft-capping."""
    config = Gemma2Config(
        **{**SMALL, "num_hidden_layers": 4},
        head_dim=32,
        query_pre_attn_scalar=32,
        sliding_window=WINDOW,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        attn_implementation="eager",
    )
    return Gemma2ForCausalLM(config)


def phi4_mini() -> PreTrainedModel:
    """Phi-4-mini: fused qkv/gate_up weights, partial rotary 0.75, longrope, tied embeddings."""
    rotary_half = int(16 * 0.75) // 2
    config = Phi3Config(
        **{**SMALL, "num_attention_heads": 4, "num_key_value_heads": 2},
        partial_rotary_factor=0.75,
        original_max_position_embeddings=LONGROPE_SWITCH,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0 + 0.05 * i for i in range(rotary_half)],
            "long_factor": [1.5 + 0.5 * i for i in range(rotary_half)],
        },
        tie_word_embeddings=True,
        pad_token_id=VOCAB - 1,
    )
    return Phi3ForCausalLM(config)


def phi3_mini_4k() -> PreTrainedModel:
    """Phi-3-mini-4k: fused weights, sliding_window (2047 there), no longrope."""
    return Phi3ForCausalLM(Phi3Config(**SMALL, sliding_window=WINDOW, pad_token_id=VOCAB - 1))


def mistral() -> PreTrainedModel:
    """Mistral 7B v0.1 (Nemo's explicit head_dim): a sliding window on every layer."""
    return MistralForCausalLM(MistralConfig(**SMALL, head_dim=32, sliding_window=WINDOW))


def ministral() -> PreTrainedModel:
    """Ministral 8B: sliding and full layers mixed by ``layer_types``."""
    types = ["sliding_attention", "full_attention"]
    config = MinistralConfig(**SMALL, head_dim=16, sliding_window=WINDOW, layer_types=types, rope_theta=1e8)
    return MinistralForCausalLM(config)


FAMILIES: dict[str, Callable[[], PreTrainedModel]] = {
    "qwen3": qwen3,
    "gemma3": gemma3,
    "gemma2": gemma2,
    "phi4-mini": phi4_mini,
    "phi3-mini-4k": phi3_mini_4k,
    "mistral": mistral,
    "ministral": ministral,
}


def randomise_norms_and_biases(model: PreTrainedModel) -> PreTrainedModel:
    """Give norm weights and biases random values (transformers initialises them to 1, 0)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                param.add_(torch.randn_like(param) * 0.2)
    return model


def save_family(name: str, folder: Path, seed: int = 0) -> PreTrainedModel:
    """Build family ``name`` with random weights (seeded), save it to ``folder``; the model, eval."""
    torch.manual_seed(seed)
    model = randomise_norms_and_biases(FAMILIES[name]()).eval()
    model.save_pretrained(folder)
    return model


PROMPT_TOKENS = 40  # > the sliding window (8); + 32 generated tokens cross longrope's 64


class NoTokenizer:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(65 + i % 26) for i in ids)


class Family(NamedTuple):
    """A saved family model and transformers' greedy run of :func:`family_prompt` on it."""

    name: str
    folder: Path
    tokens: list[int]  # 32 greedy tokens
    logits: list[np.ndarray]  # the logits each token was chosen from (prefill, then decode)


def family_prompt(seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, PROMPT_TOKENS).tolist()


def reference_family(name: str, folder: Path) -> Family:
    """Save family ``name`` to ``folder`` and run transformers' ``generate`` (32 greedy tokens)."""
    reference = save_family(name, folder)
    ids = family_prompt()
    prompt = torch.tensor([ids])
    with torch.inference_mode():  # an explicit mask: Gemma's pad id 0 may be in the prompt
        out = reference.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, do_sample=False,
            output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
    tokens = out.sequences[0, len(ids) :].tolist()
    return Family(name, folder, tokens, [s[0].float().numpy() for s in out.logits])


def greedy_run(driver, ids, n=32):
    """Greedy tokens and the logits of every step: prefill, then one cached decode per token."""
    driver.reset()
    logits = [driver.prefill(ids)]
    tokens = [int(logits[-1].argmax())]
    while len(tokens) < n:
        logits.append(driver.decode(tokens[-1]))
        tokens.append(int(logits[-1].argmax()))
    return tokens, logits


def rel_err(got, expected) -> float:
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


COMMON = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


def qwen2():
    return Qwen2ForCausalLM(Qwen2Config(**COMMON, tie_word_embeddings=False, rope_theta=1e6))


def llama3_scaled():
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    return LlamaForCausalLM(LlamaConfig(**COMMON, rope_theta=500000.0, rope_scaling=scaling))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def copy_tokenizer(model_dir: Path, folder: Path) -> Path:
    """SmolLM2's tokenizer files (:data:`TOKENIZER_FILES`) copied from ``model_dir`` into ``folder``."""
    for name in TOKENIZER_FILES:
        (folder / name).write_bytes((model_dir / name).read_bytes())
    return folder


def tiny_smollm2(folder: Path, model_dir: Path) -> Path:
    """A random-weight Llama of SmolLM2's vocabulary with its tokenizer files, in ``folder``.

    For tests of what the app does around a model (loading, caches, the status bar), not of
    what it says: it loads and exports like SmolLM2 in well under a second.
    """
    torch.manual_seed(0)
    config = LlamaConfig(**{**SMALL, "vocab_size": 49152, "eos_token_id": 2, "tie_word_embeddings": True})
    LlamaForCausalLM(config).save_pretrained(folder)
    return copy_tokenizer(model_dir, folder)
