"""The CUDA-graph step's static-shape math on the CPU (everything but the capture itself).

``CudaGraphStep(capture=False)`` runs the very functions a CUDA graph records: fused
projections, matmul attention over the whole cache, left-padded buckets, chunked prefill,
on-device token choice. Here they must match the eager step on a small random Llama/Qwen2.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engines.base import GenerationOptions, StopReason
from engines.cuda_graph import CudaGraphStep, GraphOptions
from engines.driver import DecoderDriver
from engines.torch_backend import TorchBackendOptions, TorchStep, use_cuda_graph
from models.config import DecoderConfig
from models.decoder import Decoder, grouped_attention

CAPACITY = 96


class LetterTokenizer:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(65 + i % 26) for i in ids)


def small_model(model_type: str) -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=6,
        num_kv_heads=2,
        head_dim=16,
        model_type=model_type,
        attention_bias=model_type == "qwen2",
    )
    return Decoder(config).eval()


def drivers(
    model_type: str, buckets=(4, 8), windows=(64,), capacity=CAPACITY
) -> tuple[DecoderDriver, DecoderDriver]:
    model = small_model(model_type)
    eager = DecoderDriver(TorchStep(copy.deepcopy(model), capacity), LetterTokenizer(), [])
    options = GraphOptions(buckets, windows, capture=False)
    static_step = CudaGraphStep(copy.deepcopy(model), capacity, options)
    return eager, DecoderDriver(static_step, LetterTokenizer(), [])


def count_windows(step: CudaGraphStep) -> dict[int, int]:
    """Count the decode steps each window's graph runs (plain or chained)."""
    counts = dict.fromkeys(step.windows, 0)

    def counted(run, window):
        def wrapper():
            counts[window] += 1
            run()

        return wrapper

    for table in (step.decodes, step.chains):
        for w, run in table.items():
            table[w] = counted(run, w)
    return counts


def ids(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 320, n).tolist()


def test_grouped_attention_equals_sdpa_with_gqa():
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 6, 5, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    mask = torch.rand(1, 1, 5, 9) > 0.3
    mask[..., 0] = True  # every query attends something
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(grouped_attention(q, k, v, mask), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_static_step_logits_match_eager_across_buckets_chunks_and_prefix_reuse(model_type):
    eager, static = drivers(model_type)
    # 21 tokens: chunks of 8, 8 and 5 (bucket 8 with 3 pads); then 1..7-token continuations.
    prompt = ids(21)
    pairs = [(eager.prefill(prompt), static.prefill(prompt))]
    for extra in ([5], ids(3, 1), ids(7, 2), ids(2, 3)):
        prompt = prompt + extra  # the drivers reuse the cached prefix and run only `extra`
        pairs.append((eager.prefill(prompt), static.prefill(prompt)))
    for token in ids(4, 4):
        pairs.append((eager.decode(token), static.decode(token)))
    for e, s in pairs:
        np.testing.assert_allclose(s, e, rtol=1e-4, atol=1e-5)


def test_static_step_greedy_generation_is_identical_to_eager_and_stops_the_same():
    eager, static = drivers("llama")
    options = GenerationOptions(max_new_tokens=40)
    prompt = ids(13)
    runs = []
    for driver in (eager, static):
        gen = driver.generate(prompt, options)
        runs.append(([c.token_id for c in gen if c.token_id >= 0], gen.stats.stop_reason))
    assert runs[0] == runs[1]
    assert runs[1][1] is StopReason.MAX_TOKENS and len(runs[1][0]) == 40


def test_a_step_started_ahead_serves_the_next_request_only_when_it_continues_exactly():
    eager, static = drivers("qwen2")
    options = GenerationOptions(max_new_tokens=10)
    prompt = ids(12)
    replies = [[c.token_id for c in d.generate(prompt, options)] for d in (eager, static)]
    assert replies[0] == replies[1]
    # The cache holds prompt + 9 tokens; the 10th was started ahead. Continuing with exactly
    # that token uses the early step; a different last token must not.
    for follow in (prompt + replies[0], prompt + replies[0][:9] + [(replies[0][9] + 1) % 320]):
        out = [[c.token_id for c in d.generate(follow, options)] for d in (eager, static)]
        assert out[0] == out[1]
        assert static.step.ahead is not None


def test_decode_windows_are_aligned_and_the_smallest_holding_the_position_runs():
    _, static = drivers("llama", windows=(40, 64, 128, 500), capacity=200)
    step = static.step
    assert step.windows == [64, 128, 256]  # 40 -> 64; 500 >= the capacity; 256 covers all of it
    assert step.cache.capacity_tokens == 320  # + a row for the scratch slot: windows < cache
    assert [step.window_for(p) for p in (0, 63, 64, 127, 128, 199)] == [64, 64, 128, 128, 256, 256]


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_greedy_tokens_cross_decode_windows_like_eager(model_type):
    eager, static = drivers(model_type, windows=(64, 128), capacity=200)
    counts = count_windows(static.step)
    prompt = ids(50, 5)
    options = GenerationOptions(max_new_tokens=120)  # positions 50..169: windows 64, 128, 256
    out = [[c.token_id for c in d.generate(prompt, options)] for d in (eager, static)]
    assert out[0] == out[1] and len(out[1]) == 120
    assert all(n > 0 for n in counts.values()), counts


def test_prefix_reuse_and_rewind_across_windows_give_eager_tokens():
    eager, static = drivers("qwen2", windows=(64, 128), capacity=200)
    options = GenerationOptions(max_new_tokens=40)
    first = ids(100, 6)
    reply = [[c.token_id for c in d.generate(first, options)] for d in (eager, static)]
    assert reply[0] == reply[1]  # decoded at 100..139: windows 128 and 256
    for prompt in (
        first + reply[0],  # continue: reuse all of it, decode in window 256
        first[:30] + ids(5, 7),  # rewind to 30 tokens: back into window 64
        first[:30] + ids(5, 7) + reply[0][:20] + ids(3, 8),  # and grow again
    ):
        assert static.step.ahead is not None  # the last reply left a step queued ahead
        out = [[c.token_id for c in d.generate(prompt, options)] for d in (eager, static)]
        assert out[0] == out[1]


def test_static_step_fills_the_whole_cache_and_reports_context_full():
    eager, static = drivers("llama", buckets=(16,))
    prompt = ids(CAPACITY - 5)
    out = [
        [c.token_id for c in d.generate(prompt, GenerationOptions(max_new_tokens=50))]
        for d in (eager, static)
    ]
    assert out[0] == out[1]
    assert static.cached_ids[-1] == out[1][-2] and len(static.cached_ids) == CAPACITY


def test_device_choice_covers_greedy_and_sampling_but_not_repetition_penalty():
    _, static = drivers("llama")
    step = static.step
    assert step.begin_choosing(GenerationOptions(temperature=0.7, top_k=20, top_p=0.9))
    assert not step.begin_choosing(GenerationOptions(repetition_penalty=1.3))


def test_repetition_penalty_falls_back_to_host_sampling_with_the_same_tokens():
    eager, static = drivers("qwen2")
    options = GenerationOptions(max_new_tokens=24, repetition_penalty=1.5)
    prompt = ids(10)
    tokens = [[c.token_id for c in d.generate(prompt, options)] for d in (eager, static)]
    assert tokens[0] == tokens[1]


def test_device_sampling_is_seeded_and_respects_top_k():
    eager, static = drivers("llama")
    prompt = ids(9)
    options = GenerationOptions(max_new_tokens=30, temperature=1.5, top_k=3, seed=7)
    first = [c.token_id for c in static.generate(prompt, options)]
    again = [c.token_id for c in static.generate(prompt, options)]
    other = [
        c.token_id for c in static.generate(prompt, GenerationOptions(**{**options.__dict__, "seed": 8}))
    ]
    assert first == again and first != other
    # Replay the sampled tokens through the eager model: each must be among that step's top 3.
    eager.reset()
    logits = eager.prefill(prompt)
    for token in first:
        assert token in np.argsort(-logits)[:3]
        logits = eager.decode(token)


def test_top_k_1_and_tiny_top_p_sample_the_greedy_token():
    _, static = drivers("llama")
    prompt = ids(11)
    greedy = [c.token_id for c in static.generate(prompt, GenerationOptions(max_new_tokens=20))]
    for opts in (dict(top_k=1), dict(top_p=1e-6)):
        sampled = GenerationOptions(max_new_tokens=20, temperature=1.0, seed=3, **opts)
        assert [c.token_id for c in static.generate(prompt, sampled)] == greedy


def test_cuda_graph_setting_is_validated_and_auto_means_eager_on_cpu():
    cpu = torch.device("cpu")
    assert use_cuda_graph(TorchBackendOptions(cuda_graph="auto"), cpu) is False
    assert use_cuda_graph(TorchBackendOptions(cuda_graph="auto"), torch.device("cuda")) is True
    with pytest.raises(ValueError, match="needs a CUDA device"):
        use_cuda_graph(TorchBackendOptions(cuda_graph="on"), cpu)
    with pytest.raises(ValueError, match="unknown"):
        use_cuda_graph(TorchBackendOptions(cuda_graph="yes"), cpu)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        CudaGraphStep(small_model("llama"), CAPACITY, GraphOptions(capture=True))
