"""Chunked prefill: newcomers' prompts ride in the decode steps (engines/serving/mixed_step.py).

A mixed step must compute exactly what a prefill forward followed by decode steps computes:
the same logits for the decoding rows and for each prompt's last token, the same keys in the
cache, for every family the batched server takes. The scheduler must then never run a forward
that leaves the running sessions waiting, and still give the greedy tokens of the old order.
Small random models on the CPU; the CUDA-graph capture of these steps is tests/gpu's.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from engines.base import GenerationOptions
from engines.cuda_graph import GraphOptions
from engines.serving.batched_step import BatchedTorchStep
from engines.serving.batching import BatchScheduler
from engines.serving.batching_graph import BatchedGraphStep
from engines.serving.mixed_step import Chunk, ChunkShape, Packing, chunk_shapes, plan_chunks
from models.weights import load_decoder
from tests.helpers.batching import CAPACITY, ROWS, conversation, ids, tiny_decoder
from tests.helpers.families import save_family
from tests.helpers.graph_steps import record_packings


def test_chunk_shapes_fit_the_budget_and_a_burst_of_newcomers_completes_soonest():
    assert chunk_shapes(0) == []
    assert [(s.size, s.slots, s.width) for s in chunk_shapes(40)] == [
        (40, 1, 40), (40, 2, 25), (40, 4, 13), (40, 8, 7), (40, 16, 4)
    ]
    shapes = chunk_shapes(1024)
    assert [(s.size, s.slots, s.width) for s in shapes[10:]] == [
        (1024, 1, 1024), (1024, 2, 640), (1024, 4, 320), (1024, 8, 160), (1024, 16, 80)
    ]
    assert plan_chunks([20], shapes) == (ChunkShape(64, 1, 64), [20])  # the smallest among equals
    assert plan_chunks([700], shapes) == (ChunkShape(1024, 1, 1024), [700])
    assert plan_chunks([128] * 20, shapes) == (ChunkShape(1024, 8, 160), [128] * 8)  # 8 first tokens at once
    # No pads between chunks: seven 129-token prompts complete and the eighth starts (with a
    # slot per 256 tokens, 4 would complete and half the step would be pads).
    assert plan_chunks([129] * 20, shapes) == (ChunkShape(1024, 8, 160), [129] * 7 + [121])
    assert plan_chunks([3000, 20, 20], shapes) == (ChunkShape(1024, 4, 320), [320, 20, 20])  # long ones too
    assert plan_chunks([3000], shapes) == (ChunkShape(1024, 1, 1024), [1024])
    with pytest.raises(ValueError, match="chunked prefill is off"):
        plan_chunks([5], [])


def mixed_against_prefill_then_decode(model, capacity: int, rows: int = 6) -> None:
    """Rows 0-2 decode while rows 3 and 4 prefill in chunks (4 in two steps); same logits, same keys."""
    before, mixed = (
        BatchedTorchStep(copy.deepcopy(model), rows, capacity),
        BatchedTorchStep(model, rows, capacity, 64),
    )
    vocab = model.config.vocab_size
    torch.manual_seed(1)
    lengths = [5, 12, 9]
    for row, n in enumerate(lengths):
        prompt = torch.randint(0, vocab, (n,)).tolist()
        torch.testing.assert_close(mixed.prefill(row, prompt, 0), before.prefill(row, prompt, 0))
    long_prompt, short_prompt = (
        torch.randint(0, vocab, (20,)).tolist(),
        torch.randint(0, vocab, (7,)).tolist(),
    )
    expected_long = before.prefill(3, long_prompt, 0)
    expected_short = before.prefill(4, short_prompt, 0)
    positions = list(lengths)
    plans = [
        [Chunk(3, long_prompt[:13], 0), Chunk(4, short_prompt, 0)],
        [Chunk(3, long_prompt[13:], 13)],
        [],
    ]
    for step, chunks in enumerate(plans):
        decoding = [0, 1, 2] if step < 2 else [0, 1, 2, 3, 4]
        at = positions[:3] + ([20, 7] if step == 2 else [])
        tokens = torch.randint(0, vocab, (len(decoding),)).tolist()
        got, last = mixed.mixed(decoding, tokens, at, chunks)
        torch.testing.assert_close(got, before.decode(decoding, tokens, at), rtol=1e-4, atol=1e-4)
        assert last.shape == (len(chunks), vocab) and got.dtype == last.dtype == torch.float32
        if step == 0:
            torch.testing.assert_close(last[1], expected_short, rtol=1e-4, atol=1e-4)
        if step == 1:  # the long prompt's last chunk: its next-token logits
            torch.testing.assert_close(last[0], expected_long, rtol=1e-4, atol=1e-4)
        for r in range(3):
            positions[r] += 1
    for mine, theirs in ((mixed.cache.k, before.cache.k), (mixed.cache.v, before.cache.v)):
        assert isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor)
        torch.testing.assert_close(mine[:, :, :, : capacity - 1], theirs[:, :, :, : capacity - 1])


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_a_mixed_step_computes_what_prefill_then_decode_computes(model_type):
    mixed_against_prefill_then_decode(tiny_decoder(model_type), CAPACITY)


@pytest.mark.parametrize("family", ["gemma3", "gemma2", "qwen3"])
def test_a_mixed_step_keeps_each_familys_windows_norms_and_caps(family, tmp_path):
    """Sliding windows (8 positions, crossed by the 20-token prompt), q/k norms, soft-caps, local RoPE."""
    save_family(family, tmp_path)
    mixed_against_prefill_then_decode(load_decoder(tmp_path), 64)


def test_a_longrope_model_prefills_between_steps(tmp_path):
    """longrope picks its factors by one sequence's length, which a packed step cannot give."""
    save_family("phi4-mini", tmp_path)
    step = BatchedTorchStep(load_decoder(tmp_path), 2, 64, prefill_chunk=512)
    assert step.chunk_shapes == []


def recorded_calls(step: BatchedTorchStep) -> list[tuple[str, list[int], int]]:
    """Each forward the scheduler asks of ``step``: (kind, decoding rows, prompt chunks)."""
    calls: list[tuple[str, list[int], int]] = []
    for name in ("prefill", "prefill_many", "decode", "mixed"):
        plain = getattr(step, name)

        def wrapper(*args, _name=name, _plain=plain):
            rows = list(args[0]) if _name in ("decode", "mixed") else []
            calls.append((_name, rows, len(args[3]) if _name == "mixed" else 1))
            return _plain(*args)

        setattr(step, name, wrapper)
    return calls


@pytest.mark.parametrize("graph_step", [False, True], ids=["eager", "static graph step"])
def test_newcomers_ride_in_decode_steps_and_the_greedy_tokens_stay_the_same(graph_step):
    """No forward of its own for a prompt: running sessions get a token in every step while others join."""
    model = tiny_decoder()
    runs, calls = [], []
    for chunk in (0, 64):
        if graph_step:
            step: BatchedTorchStep = BatchedGraphStep(copy.deepcopy(model), ROWS, CAPACITY, False, chunk)
        else:
            step = BatchedTorchStep(copy.deepcopy(model), ROWS, CAPACITY, chunk)
        calls = recorded_calls(step)
        scheduler = BatchScheduler(step, eos_token_ids=[])
        try:
            runs.append(conversation(scheduler))
        finally:
            scheduler.close()
    assert runs[1] == runs[0]
    assert not {"prefill", "prefill_many"} & {kind for kind, _, _ in calls}  # no forward between steps
    assert any(rows and chunks for _, rows, chunks in calls)  # prompts joined running sessions
    assert max(chunks for _, _, chunks in calls) >= 2  # the first newcomers shared a step


def test_the_graph_step_runs_the_smallest_shape_holding_the_chunks():
    step = BatchedGraphStep(tiny_decoder(), ROWS, CAPACITY, GraphOptions(capture=False), prefill_chunk=512)
    assert len(step.packings) == 5 * 10  # decode buckets 0, 1, 2, 4, 8 times shapes of 64 and 256 tokens
    ran = record_packings(step)
    step.mixed([0, 2], [1, 2], [0, 0], [Chunk(5, ids(20, 0), 0)])
    step.mixed([], [], [], [Chunk(5, ids(40, 1), 20), Chunk(6, ids(3, 2), 0)])
    step.mixed([1], [3], [1], [Chunk(r, ids(30, r), 0) for r in (5, 6, 7)])
    assert ran == [
        Packing(4, ChunkShape(64, 1, 64)),
        Packing(0, ChunkShape(64, 2, 40)),  # 43 tokens packed back to back
        Packing(2, ChunkShape(256, 4, 80)),  # 90 tokens: over 64
    ]
    with pytest.raises(ValueError, match="fit no shape"):
        step.mixed([0], [1], [2], [Chunk(5, ids(200, 4), 0), Chunk(6, ids(100, 5), 0)])


def test_the_static_step_with_pads_gives_the_eager_steps_logits():
    """The graph step's bucketed shape (pads after the chunks, empty slots) against exact sizes."""
    model = tiny_decoder()
    eager = BatchedTorchStep(copy.deepcopy(model), ROWS, CAPACITY, 256)
    static = BatchedGraphStep(model, ROWS, CAPACITY, GraphOptions(capture=False), prefill_chunk=256)
    for step in (eager, static):
        step.prefill(0, ids(9, 0), 0)
    plans = [
        [Chunk(3, ids(50, 3)[:37], 0), Chunk(5, ids(11, 5), 0)],  # 48 tokens: a 64-token step, 2 slots
        [Chunk(3, ids(50, 3)[37:], 37), Chunk(6, ids(70, 6), 0), Chunk(7, ids(2, 7), 0)],  # 85: 256, 4 slots
    ]
    for i, chunks in enumerate(plans):
        got = [step.mixed([0], [4 + i], [9 + i], chunks) for step in (eager, static)]
        for mine, theirs in zip(got[1], got[0], strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    for mine, theirs in ((static.cache.k, eager.cache.k), (static.cache.v, eager.cache.v)):
        assert isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor)
        torch.testing.assert_close(mine[:, :, :, :95], theirs[:, :, :, :95], rtol=1e-4, atol=1e-4)


def test_a_prompt_longer_than_a_step_is_answered_when_nothing_else_runs():
    """Its later chunks are the only work left: the scheduler must not sleep until the next request."""
    scheduler = BatchScheduler(BatchedTorchStep(tiny_decoder(), ROWS, CAPACITY, 64), eos_token_ids=[])
    try:
        request = scheduler.submit("a", ids(90, 7), GenerationOptions(max_new_tokens=3))  # 64 + 26
        done = threading.Event()
        threading.Thread(target=lambda: (list(request.tokens()), done.set()), daemon=True).start()
        assert done.wait(10), f"stuck after {scheduler.counts.prefills} chunk steps"
        assert request.generated_tokens == 3 and scheduler.counts.prefills == 2
    finally:
        scheduler.close()
