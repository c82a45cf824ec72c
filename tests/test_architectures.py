"""Architecture variants the bundled model does not exercise, against transformers.

Qwen2 (q/k/v biases, untied LM head) and Llama 3 RoPE scaling are checked on tiny
random-weight models built from transformers' own classes (no such checkpoints ship in a
registry package); the math is the same at any size.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from models.decoder import KVCache
from models.weights import load_decoder

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


def llama_linear():
    return LlamaForCausalLM(LlamaConfig(**COMMON, rope_scaling={"rope_type": "linear", "factor": 4.0}))


@pytest.mark.parametrize("build", [qwen2, llama3_scaled, llama_linear])
@torch.inference_mode()
def test_variant_logits_match_transformers(build, tmp_path):
    torch.manual_seed(0)
    reference = build().eval()
    if build is qwen2:  # random, non-zero biases so they are really checked
        for layer in reference.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_()
    reference.save_pretrained(tmp_path)
    ours = load_decoder(tmp_path)
    assert ours.config.attention_bias == (build is qwen2)
    ids = torch.randint(0, 300, (1, 200))  # positions past original_max_position_embeddings
    expected = reference(ids).logits
    got = ours(ids, torch.arange(200), KVCache.allocate(ours.config, 256))
    assert float((got - expected).norm() / expected.norm()) < 1e-4


def test_half_precision_load_keeps_rope_frequencies_fp32(tmp_path):
    from models.decoder import rope_inv_freq

    llama3_scaled().save_pretrained(tmp_path)
    ours = load_decoder(tmp_path, dtype=torch.bfloat16)
    assert next(ours.parameters()).dtype == torch.bfloat16
    assert ours.inv_freq.dtype == torch.float32
    assert torch.equal(ours.inv_freq, rope_inv_freq(ours.config))
