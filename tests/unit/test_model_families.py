"""Architecture variants the bundled model does not exercise, against transformers.

Qwen2 (q/k/v biases, untied LM head), Llama 3 RoPE scaling, Llama's attention/MLP biases and
every other supported family (Qwen3, Gemma 2/3, Phi-3/Phi-4-mini, Mistral/Ministral: see
tests/helpers/families.py) are checked on tiny random-weight models built from transformers' own
classes (no such checkpoints ship in a registry package); the math is the same at any size.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engines.cuda_graph import CudaGraphStep, GraphOptions
from engines.driver import DecoderDriver
from engines.torch_backend import TorchBackendOptions, load_torch_decoder
from models.config import SUPPORTED_MODEL_TYPES, DecoderConfig, InvalidConfig, UnsupportedModel
from models.decoder import KVCache
from models.shapes import check_sizes
from models.weights import load_decoder
from tests.helpers.families import (
    COMMON,
    FAMILIES,
    VOCAB,
    Family,
    NoTokenizer,
    family_prompt,
    greedy_run,
    llama3_scaled,
    qwen2,
    reference_family,
    rel_err,
    save_family,
)  # fmt: skip


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
    from models.rope import rope_inv_freq

    llama3_scaled().save_pretrained(tmp_path)
    ours = load_decoder(tmp_path, dtype=torch.bfloat16)
    assert next(ours.parameters()).dtype == torch.bfloat16
    assert ours.rope["full_attention"].inv_freq.dtype == torch.float32
    assert torch.equal(ours.rope["full_attention"].inv_freq, rope_inv_freq(ours.config))


# Each supported family against transformers: tiny random models of real config shapes
# (tests/helpers/families.py), prefill then cached decode, on the engines' PyTorch paths.


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory) -> Family:
    return reference_family(request.param, tmp_path_factory.mktemp(request.param))


def static_driver(folder) -> DecoderDriver:
    """The CUDA-graph step's static math, run eagerly on the CPU: fused weights, matmul
    attention over the whole cache, prefill chunked into 16-token buckets, decode windows."""
    model = load_decoder(folder)
    step = CudaGraphStep(model, 128, GraphOptions((4, 16), (64,), capture=False))
    return DecoderDriver(step, NoTokenizer(), [], rope_switch_tokens=model.config.rope_switch_tokens)


@pytest.mark.parametrize("path", ["eager", "static"])
def test_family_matches_transformers_through_prefill_and_cached_decode(family, path):
    name, folder, expected_tokens, expected_logits = family
    if path == "eager":
        options = TorchBackendOptions(device="cpu", dtype="fp32", capacity_tokens=128, threads=1)
        driver = load_torch_decoder(folder, NoTokenizer(), options)
    else:
        driver = static_driver(folder)
    tokens, logits = greedy_run(driver, family_prompt())
    errors = [rel_err(g, e) for g, e in zip(logits, expected_logits, strict=True)]
    print(f"{name} {path}: max logits rel err {max(errors):.1e}")
    assert tokens == expected_tokens
    assert max(errors) < 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_family_half_precision_static_step_tracks_transformers_fp32(family, dtype):
    """The CUDA-graph step's fused math in half precision (what the GPU runs), on the CPU,
    teacher-forced on transformers' tokens: tests/gpu/test_cuda_decoder.py's bounds, met here already.
    bf16 (the coarser one) on the families with their own fused code: (1 + w) norms, q/k norms,
    soft-caps, stored fused weights and longrope (by hand: all 7 families, fp16 and bf16, within
    these bounds with top-1 agreement >= 97%)."""
    if family.name not in ("gemma3", "gemma2", "phi4-mini"):
        pytest.skip("CPU half precision is slow; the other families share these kernels")
    model = load_decoder(family.folder, dtype=dtype)
    step = CudaGraphStep(model, 128, GraphOptions((4, 16), (64,), capture=False))
    driver = DecoderDriver(step, NoTokenizer(), [], rope_switch_tokens=model.config.rope_switch_tokens)
    driver.reset()
    logits = [driver.prefill(family_prompt())] + [driver.decode(t) for t in family.tokens[:-1]]
    errors = [rel_err(g, e) for g, e in zip(logits, family.logits, strict=True)]
    agree = np.mean([int(g.argmax() == e.argmax()) for g, e in zip(logits, family.logits, strict=True)])
    print(f"{family.name} static {dtype}: max rel err {max(errors):.1e}, top-1 agreement {agree:.0%}")
    assert max(errors) < (2e-2 if dtype == torch.float16 else 5e-2)
    assert agree >= 0.8


def test_longrope_prompt_past_the_switch_in_chunks_matches_one_call(tmp_path):
    """A 70-token prompt runs in 16-token chunks (the first ones end before the switch at 64):
    all of them must take the long factors, as the one eager call (= transformers) does."""
    save_family("phi4-mini", tmp_path)
    options = TorchBackendOptions(device="cpu", dtype="fp32", capacity_tokens=128, threads=1)
    eager = load_torch_decoder(tmp_path, NoTokenizer(), options)
    prompt = np.random.default_rng(1).integers(0, VOCAB, 70).tolist()
    tokens, logits = greedy_run(eager, prompt, 8)
    got_tokens, got_logits = greedy_run(static_driver(tmp_path), prompt, 8)
    assert got_tokens == tokens
    assert max(rel_err(g, e) for g, e in zip(got_logits, logits, strict=True)) < 1e-4


def test_family_configs_read_their_differences(family):
    name, folder, *_ = family
    config = DecoderConfig.from_dir(folder)
    sliding = [config.layer_type(i) == "sliding_attention" for i in range(config.num_layers)]
    expected = {
        "qwen3": dict(qk_norm=True, sliding=[False] * 2),
        "gemma3": dict(qk_norm=True, norm_plus_one=True, sandwich_norms=True, local_rope_theta=10000.0,
                       attention_scale=24**-0.5, sliding=[True] * 5 + [False]),
        "gemma2": dict(attn_logit_softcap=50.0, final_logit_softcap=30.0, sliding=[True, False] * 2),
        "phi4-mini": dict(fused_projections=True, partial_rotary_factor=0.75, sliding=[False] * 2),
        "phi3-mini-4k": dict(fused_projections=True, sliding=[True] * 2),
        "mistral": dict(sliding_window=8, sliding=[True] * 2),
        "ministral": dict(sliding=[True, False]),
    }[name]  # fmt: skip
    assert sliding == expected.pop("sliding")
    assert {k: getattr(config, k) for k in expected} == expected


def test_family_config_sizes_agree_with_its_weight_headers_and_a_changed_one_is_named(family):
    """The start-up size check (models.shapes) passes every supported family's own weights."""
    name, folder, *_ = family
    config = DecoderConfig.from_dir(folder)
    check_sizes(folder, config)  # no false alarm: fused Phi-3 projections, Gemma's head_dim...
    with pytest.raises(InvalidConfig, match=r"'num_hidden_layers' is 1,000, but .* holds \d+ layers"):
        check_sizes(folder, dataclasses.replace(config, num_layers=1000))


@torch.inference_mode()
def test_llama_attention_bias_gives_o_proj_its_bias_as_transformers_does(tmp_path):
    torch.manual_seed(0)
    reference = LlamaForCausalLM(LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True)).eval()
    assert reference.model.layers[0].self_attn.o_proj.bias is not None
    for name, param in reference.named_parameters():
        if name.endswith(".bias"):
            param.normal_()
    reference.save_pretrained(tmp_path)
    ours = load_decoder(tmp_path)
    assert ours.config.attention_out_bias and ours.config.mlp_bias
    ids = torch.randint(0, 300, (1, 50))
    expected = reference(ids).logits
    got = ours(ids, torch.arange(50), KVCache.allocate(ours.config, 64))
    assert float((got - expected).norm() / expected.norm()) < 1e-4


def test_unsupported_model_type_names_every_supported_one():
    with pytest.raises(UnsupportedModel) as e:
        DecoderConfig.from_hf({"model_type": "gpt2", "hidden_size": 64})
    assert all(t in str(e.value) for t in SUPPORTED_MODEL_TYPES if t != "gemma3")
    with pytest.raises(UnsupportedModel, match="'yarn' is not supported"):
        DecoderConfig.from_hf(
            {**COMMON, "model_type": "qwen3", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
        )


@torch.inference_mode()
def test_multimodal_gemma3_folder_loads_its_text_decoder(tmp_path):
    """Gemma 3 4B and up ship as Gemma3ForConditionalGeneration (model_type gemma3, the text
    model's settings in text_config, its weights under language_model.): the text decoder
    loads and matches transformers' text model; the vision tower is left out."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = dict(
        COMMON, num_key_value_heads=1, head_dim=32, sliding_window=8, query_pre_attn_scalar=24,
        eos_token_id=None,
    )  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=28, patch_size=14)  # fmt: skip
    torch.manual_seed(0)
    reference = Gemma3ForConditionalGeneration(
        Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    ).eval()
    reference.save_pretrained(tmp_path)
    ours = load_decoder(tmp_path)
    assert ours.config.model_type == "gemma3_text" and ours.config.qk_norm
    ids = torch.randint(0, 300, (1, 30))  # past the window of 8
    expected = reference(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    got = ours(ids, torch.arange(30), KVCache.allocate(ours.config, 32))
    assert float((got - expected).norm() / expected.norm()) < 1e-4


LEGACY_CONFIGS = {  # fields as real config.json files written by transformers 4.x carry them
    "gemma3_text": dict(
        sliding_window=512, sliding_window_pattern=6, rope_theta=1e6, rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, query_pre_attn_scalar=256, head_dim=256,
        num_hidden_layers=12,
    ),
    "gemma2": dict(sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                   query_pre_attn_scalar=256, head_dim=256, num_hidden_layers=4),
    "qwen3": dict(use_sliding_window=False, sliding_window=None, max_window_layers=28, head_dim=128),
    "qwen2": dict(use_sliding_window=False, sliding_window=32768, max_window_layers=21),
    "qwen2-sliding": dict(model_type="qwen2", use_sliding_window=True, sliding_window=64,
                          max_window_layers=1),
    "phi3": dict(partial_rotary_factor=0.75, original_max_position_embeddings=4096, rms_norm_eps=1e-5,
                 max_position_embeddings=131072, sliding_window=262144,
                 rope_scaling={"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}),
    "mistral": dict(sliding_window=4096),
}  # fmt: skip


@pytest.mark.parametrize("model_type", list(LEGACY_CONFIGS))
def test_legacy_config_fields_read_as_transformers_5_reads_them(model_type):
    """Older config.json files (flat rope_scaling, rope_local_base_freq, sliding_window_pattern,
    no layer_types) give the same DecoderConfig as transformers' own reading of them, saved."""
    from transformers import AutoConfig

    legacy = {**COMMON, "num_attention_heads": 8, "num_key_value_heads": 4, "hidden_size": 1024,
              "model_type": model_type, "eos_token_id": 2, **LEGACY_CONFIGS[model_type]}  # fmt: skip
    normalized = AutoConfig.for_model(**legacy).to_dict()
    ours = DecoderConfig.from_hf(legacy)
    assert ours == DecoderConfig.from_hf(normalized)
    if model_type == "qwen2-sliding":  # layers from max_window_layers on slide
        assert [ours.layer_type(i) for i in range(2)] == ["full_attention", "sliding_attention"]
