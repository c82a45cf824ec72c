"""CUDA paths of the PyTorch backend (run on the GPU machine): half precision and CUDA graphs.

Random weights of the real SmolLM2-135M shape (the GPU machine has no model store); the
numerics checked do not depend on the values. Skipped without CUDA.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers
from torch._dynamo.utils import counters
from transformers import LlamaConfig, LlamaForCausalLM

from engines.base import GenerationOptions
from engines.cuda_graph import PRECISION, CudaGraphStep, GraphOptions
from engines.driver import DecoderDriver
from engines.serving.batched_step import BatchedTorchStep
from engines.serving.batching import BatchScheduler
from engines.serving.batching_graph import BatchedGraphStep, load_batched_step
from engines.torch_backend import TorchBackendOptions, load_torch_decoder
from models.config import DecoderConfig
from models.weights import load_decoder
from tests.helpers.families import FAMILIES, Family, family_prompt, greedy_run, reference_family, rel_err
from tests.helpers.graph_steps import record_buckets, record_packings

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


def save_random(folder, **overrides):
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**{**SMOLLM2_135M, **overrides})).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random(tmp_path_factory.mktemp("smollm2-shape"))


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    """The SmolLM2 widths with 4 layers: torch.compile takes seconds, not minutes."""
    return save_random(tmp_path_factory.mktemp("smollm2-4-layers"), num_hidden_layers=4)


def gpu(model_dir, dtype, cuda_graph, compile=False):
    options = TorchBackendOptions(device="cuda", dtype=dtype, cuda_graph=cuda_graph, compile=compile)
    return load_torch_decoder(model_dir, NoTokenizer(), options)


def greedy(driver, prompt, n=64):
    driver.reset()
    driver.eos_token_ids = frozenset()  # random weights: keep going for all n tokens
    return [
        c.token_id for c in driver.generate(prompt, GenerationOptions(max_new_tokens=n)) if c.token_id >= 0
    ]


@pytest.mark.parametrize("cuda_graph", ["off", "on"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_cuda_half_logits_track_cpu_fp32_through_prefill_and_decode(model_dir, dtype, cuda_graph):
    cpu = load_torch_decoder(model_dir, NoTokenizer(), TorchBackendOptions(device="cpu", dtype="fp32"))
    half = gpu(model_dir, dtype, cuda_graph)
    assert half.name == f"pytorch-cuda {dtype}" + (" cuda-graph" if cuda_graph == "on" else "")
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 49152, 300).tolist()
    pairs = [(cpu.prefill(prompt), half.prefill(prompt))]
    for token in rng.integers(0, 49152, 32).tolist():  # teacher-forced, so both see the same ids
        pairs.append((cpu.decode(token), half.decode(token)))
    errors = [np.linalg.norm(g - c) / np.linalg.norm(c) for c, g in pairs]
    agree = np.mean([int(np.argmax(c) == np.argmax(g)) for c, g in pairs])
    print(
        f"{dtype} cuda_graph={cuda_graph}: max logits rel err {max(errors):.2e}, top-1 agreement {agree:.0%}"
    )
    assert max(errors) < (2e-2 if dtype == "fp16" else 5e-2)
    # Random weights give flat logits, so half precision may swap near-tied top tokens (bf16
    # eager agreed on 88% in the first H200 run). Where the GPU picks another token, fp32 must
    # rank it within rounding of its top; a wrong position or cache would pick far off.
    for c, g in pairs:
        assert c.max() - c[np.argmax(g)] <= 4 * np.abs(g - c).max()
    assert agree >= 0.8


def test_cuda_graph_greedy_tokens_are_identical_to_eager_fp32(model_dir):
    # fp32, so rounding cannot flip a near-tie; 700 prompt tokens: chunks of 512 and 188 (bucket
    # 256). 230 and 1000 tokens + 64 new cross the decode windows of 256 and 1024 slots.
    eager, graph = gpu(model_dir, "fp32", "off"), gpu(model_dir, "fp32", "on")
    assert graph.name == "pytorch-cuda fp32 cuda-graph"
    assert graph.step.windows == [256, 512, 1024, 2048]
    for n in (5, 128, 230, 700, 1000):
        prompt = np.random.default_rng(n).integers(0, 49152, n).tolist()
        assert greedy(graph, prompt) == greedy(eager, prompt), f"{n}-token prompt"


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_cuda_graph_replay_gives_the_tokens_of_the_same_step_run_without_capture(model_dir, dtype):
    config = DecoderConfig.from_dir(model_dir)
    model = load_decoder(
        model_dir, dtype={"fp16": torch.float16, "bf16": torch.bfloat16}[dtype], device="cuda"
    )
    steps = [CudaGraphStep(copy.deepcopy(model), 2048, GraphOptions(capture=c)) for c in (True, False)]
    graph, plain = (DecoderDriver(s, NoTokenizer(), config.eos_token_ids) for s in steps)
    prompt = np.random.default_rng(1).integers(0, 49152, 200).tolist()
    tokens = greedy(graph, prompt)
    assert tokens == greedy(plain, prompt)
    graph.reset()
    plain.reset()
    diff = np.abs(graph.prefill(prompt) - plain.prefill(prompt)).max()
    print(f"{dtype}: graph vs uncaptured max |logits diff| {diff:.2e}")
    assert diff < 1e-2


def test_cuda_graph_sampling_on_device_is_seeded_and_top_k_1_is_greedy(model_dir):
    graph = gpu(model_dir, "fp16", "on")
    prompt = np.random.default_rng(2).integers(0, 49152, 50).tolist()
    graph.eos_token_ids = frozenset()
    seeded = GenerationOptions(max_new_tokens=32, temperature=1.0, top_p=0.9, seed=5)
    first = [c.token_id for c in graph.generate(prompt, seeded)]
    again = [c.token_id for c in graph.generate(prompt, seeded)]
    assert first == again
    top1 = GenerationOptions(max_new_tokens=32, temperature=1.0, top_k=1, seed=5)
    assert [c.token_id for c in graph.generate(prompt, top1)] == greedy(graph, prompt, 32)


def test_compiled_cuda_graph_greedy_tokens_are_identical_to_eager_fp32(small_dir):
    eager = gpu(small_dir, "fp32", "off")
    before = counters["stats"]["unique_graphs"]
    compiled = gpu(small_dir, "fp32", "on", compile=True)
    # Start-up cost: one compile for every prefill bucket, one for every decode window.
    assert counters["stats"]["unique_graphs"] - before == 2
    assert compiled.name == "pytorch-cuda fp32 cuda-graph+compile"
    for n in (7, 240, 300):  # 240 + 64 crosses from the 256-slot window to the 512 one
        prompt = np.random.default_rng(n).integers(0, 49152, n).tolist()
        assert greedy(compiled, prompt) == greedy(eager, prompt), f"{n}-token prompt"


# Batched decoding (engines/serving/batching_graph.py): one CUDA-graph replay per step of up to 8 rows,
# each row at its own position; rows of the bucket that are not decoding run as fillers.

BATCH_PROMPT_TOKENS = (5, 130, 40, 300, 17, 64, 1, 250)  # one prompt per row


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_batched_graph_decode_logits_track_the_eager_batched_step(small_dir, dtype):
    model = load_decoder(small_dir, dtype=dtype, device="cuda")
    eager = BatchedTorchStep(copy.deepcopy(model), 8, 512)
    graph = BatchedGraphStep(model, 8, 512, GraphOptions(capture=True))
    assert graph.name == f"pytorch-cuda {PRECISION[dtype]} cuda-graph batched x8"
    assert graph.buckets == [1, 2, 4, 8] and len(graph.graphs) == 4
    rng = np.random.default_rng(3)
    positions = list(BATCH_PROMPT_TOKENS)
    pairs = []
    for row, n in enumerate(BATCH_PROMPT_TOKENS):
        prompt = rng.integers(0, 49152, n).tolist()
        pairs.append((eager.prefill(row, prompt, 0)[None], graph.prefill(row, prompt, 0)[None]))
    # Buckets 1, 4, 8, 8, 8, 8, 8, 4, twice: rows decode after steps where they were fillers.
    for rows in [[0], [0, 2], [1, 3, 4], [0, 2, 4], list(range(8)), [7, 5], [6], [1, 3]] * 2:
        tokens, at = rng.integers(0, 49152, len(rows)).tolist(), [positions[r] for r in rows]
        pairs.append((eager.decode(rows, tokens, at), graph.decode(rows, tokens, at)))
        for r in rows:
            positions[r] += 1
    rows_e = torch.cat([e for e, _ in pairs]).cpu().numpy()
    rows_g = torch.cat([g for _, g in pairs]).cpu().numpy()
    errors = [rel_err(g, e) for e, g in zip(rows_e, rows_g, strict=True)]
    agree = np.mean([int(g.argmax() == e.argmax()) for e, g in zip(rows_e, rows_g, strict=True)])
    name = PRECISION[dtype]
    print(f"{name} batched graph vs eager: max logits rel err {max(errors):.1e}, top-1 agreement {agree:.0%}")
    if dtype == torch.float32:
        assert max(errors) < 1e-4  # other kernels (fused matmuls, matmul attention), same math
        assert agree == 1.0
    else:
        assert max(errors) < 1e-2
        # Where half precision picks another near-tied token, eager must rank it within rounding
        # of its top; a wrong row, position or filler write would pick far off.
        for e, g in zip(rows_e, rows_g, strict=True):
            assert e.max() - e[g.argmax()] <= 4 * np.abs(g - e).max()


@pytest.mark.parametrize("prefill_chunk", [0, 512], ids=["prefill between steps", "chunked prefill"])
def test_eight_concurrent_sequences_on_batched_graphs_get_their_batch1_greedy_tokens_fp32(
    small_dir, prefill_chunk
):
    """Chunked: the captured mixed steps (prompts riding in decode steps) give the same tokens."""
    step = load_batched_step(
        small_dir, 8, 512, "cuda", torch.float32, graphs=True, prefill_chunk=prefill_chunk
    )
    assert isinstance(step, BatchedGraphStep)
    ran, mixed = record_buckets(step), record_packings(step)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 49152, n).tolist() for n in BATCH_PROMPT_TOKENS]
    # Rows leave in the order 4, 7, 2, 5, 6, 1, 3, 0: buckets 8, 4 and 1, with filler rows.
    new_tokens = [40, 24, 12, 30, 8, 16, 20, 10]
    scheduler = BatchScheduler(step, eos_token_ids=[])
    try:
        requests = [
            scheduler.submit(f"s{i}", p, GenerationOptions(max_new_tokens=n))
            for i, (p, n) in enumerate(zip(prompts, new_tokens, strict=True))
        ]
        got = [[t for t, _ in r.tokens()] for r in requests]
        assert max(scheduler.counts.batch_sizes) == 8
    finally:
        scheduler.close()
    assert {1, 4, 8} <= set(ran)
    if prefill_chunk:  # all eight prompts start in the first step; the long ones finish beside running rows
        assert mixed[0].n == 0 and mixed[0].shape.slots == 8 and any(p.n for p in mixed)
    else:
        assert not mixed
    for driver in (gpu(small_dir, "fp32", "on"), gpu(small_dir, "fp32", "off")):
        expected = [greedy(driver, p, n) for p, n in zip(prompts, new_tokens, strict=True)]
        assert got == expected, driver.name


# Every supported family (tests/helpers/families.py: tiny random models of real config shapes, sliding
# windows of 8, longrope's switch at 64) on the GPU paths, against transformers' CPU greedy run.


# transformers 5.17 (the GPU machine's) and 5.25 (CI's) disagree from longrope's switch on: the
# GPU machine's generate matched ours to 2e-7 up to position 63 and was 0.6 apart from 64 on
# (docs/models.md). Ours follows 5.25, which tests/unit/test_model_families.py checks on the CPU in CI.
LONGROPE_REFERENCE = (5, 25)


def our_cpu_reference(family: Family) -> Family:
    """Our fp32 eager CPU run of ``family``: the reference where transformers' switch differs."""
    options = TorchBackendOptions(device="cpu", dtype="fp32", cuda_graph="off")
    tokens, logits = greedy_run(load_torch_decoder(family.folder, NoTokenizer(), options), family_prompt())
    return Family(family.name, family.folder, tokens, logits)


def family_reference(name: str, folder) -> Family:
    """transformers' greedy run of family ``name``, or ours on the CPU where its longrope differs."""
    reference = reference_family(name, folder)
    version = tuple(int(p) for p in transformers.__version__.split(".")[:2])
    if name == "phi4-mini" and version < LONGROPE_REFERENCE:
        print(f"phi4-mini: transformers {transformers.__version__}: our CPU run is the reference")
        return our_cpu_reference(reference)
    return reference


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory) -> Family:
    return family_reference(request.param, tmp_path_factory.mktemp(request.param))


def family_gpu(family, dtype, cuda_graph, compile=False):
    # 16-token buckets chunk the 40-token prompt; 64-slot decode windows are crossed at 64.
    options = TorchBackendOptions(
        device="cuda", dtype=dtype, cuda_graph=cuda_graph, compile=compile, capacity_tokens=128,
        prefill_buckets=(4, 16), decode_windows=(64,),
    )  # fmt: skip
    return load_torch_decoder(family.folder, NoTokenizer(), options)


@pytest.mark.parametrize("cuda_graph", ["off", "on"])
def test_family_fp32_on_cuda_gives_transformers_tokens(family, cuda_graph):
    driver = family_gpu(family, "fp32", cuda_graph)
    tokens, logits = greedy_run(driver, family_prompt())
    errors = [rel_err(g, e) for g, e in zip(logits, family.logits, strict=True)]
    print(f"{family.name} cuda fp32 cuda_graph={cuda_graph}: max logits rel err {max(errors):.1e}")
    assert tokens == family.tokens
    assert max(errors) < 1e-3  # cuBLAS sums in another order than the CPU


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_family_half_cuda_graph_tracks_transformers_fp32(family, dtype):
    driver = family_gpu(family, dtype, "on")
    driver.reset()  # teacher-forced: both see transformers' tokens
    logits = [driver.prefill(family_prompt())] + [driver.decode(t) for t in family.tokens[:-1]]
    errors = [rel_err(g, e) for g, e in zip(logits, family.logits, strict=True)]
    agree = np.mean([int(g.argmax() == e.argmax()) for g, e in zip(logits, family.logits, strict=True)])
    print(f"{family.name} cuda-graph {dtype}: max rel err {max(errors):.1e}, top-1 agreement {agree:.0%}")
    assert max(errors) < (2e-2 if dtype == "fp16" else 5e-2)
    assert agree >= 0.8


@pytest.mark.parametrize("name", ["gemma2", "phi4-mini"])
def test_family_compiled_cuda_graph_gives_transformers_tokens(name, tmp_path):
    family = family_reference(name, tmp_path / name)
    tokens, _ = greedy_run(family_gpu(family, "fp32", "on", compile=True), family_prompt())
    assert tokens == family.tokens
