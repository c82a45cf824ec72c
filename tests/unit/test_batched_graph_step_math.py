"""The batched CUDA-graph step's static math on the CPU (everything but the capture itself).

``BatchedGraphStep(capture=False)`` runs the functions its graphs record: the fused model,
matmul attention over the whole aligned cache, one fixed batch bucket per step with filler
rows. Its logits, its cache and the scheduler's greedy tokens must be those of the eager
``BatchedTorchStep`` on a small random Llama/Qwen2.
"""

from __future__ import annotations

import copy
import json
import queue

import pytest
import torch
from safetensors.torch import save_file

from engines.base import GenerationOptions
from engines.cuda_graph import GraphOptions
from engines.serving.batched_step import BatchedTorchStep
from engines.serving.batching import BatchScheduler
from engines.serving.batching_graph import BatchedGraphStep, batch_buckets, load_batched_step
from models.decoder import KVCache
from tests.helpers.batching import CAPACITY, ROWS, VOCAB, conversation, ids, tiny_decoder
from tests.helpers.graph_steps import record_buckets


def steps(model_type: str = "llama", rows: int = ROWS) -> tuple[BatchedTorchStep, BatchedGraphStep]:
    model = tiny_decoder(model_type)
    eager = BatchedTorchStep(copy.deepcopy(model), rows, CAPACITY)
    return eager, BatchedGraphStep(model, rows, CAPACITY, GraphOptions(capture=False))


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_bucketed_decode_gives_the_eager_batched_logits_and_keys(model_type):
    eager, static = steps(model_type)
    ran = record_buckets(static)
    lengths = [5, 12, 3, 30, 9, 17, 1, 22]  # every row prefilled, each at its own length
    for row, n in enumerate(lengths):
        prompt = ids(n, row)
        torch.testing.assert_close(static.prefill(row, prompt, 0), eager.prefill(row, prompt, 0))
    positions = list(lengths)
    # [0, 2] runs bucket 4 (rows 1 and 3 fill), [1, 3, 4] bucket 8 (rows 0, 2, 5-7 fill); the
    # later steps read rows that were fillers before: a filler must not have touched their keys.
    row_sets = [[0], [0, 2], [1, 3, 4], [0, 2, 4], [7, 5], [6], [1, 3]]
    for i, rows in enumerate(row_sets):
        tokens, at = ids(len(rows), 100 + i), [positions[r] for r in rows]
        got = static.decode(rows, tokens, at)
        assert got.shape == (len(rows), VOCAB) and got.dtype == torch.float32
        torch.testing.assert_close(got, eager.decode(rows, tokens, at), rtol=1e-4, atol=1e-5)
        for r in rows:
            positions[r] += 1
    assert ran == [1, 4, 8, 8, 8, 8, 4]
    # The same keys and values in every slot but the filler's (capacity - 1), none past it.
    for mine, theirs in ((static.cache.k, eager.cache.k), (static.cache.v, eager.cache.v)):
        assert isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor)
        assert mine.shape[3] == 128
        torch.testing.assert_close(mine[:, :, :, : CAPACITY - 1], theirs[:, :, :, : CAPACITY - 1])
        assert not mine[:, :, :, CAPACITY:].any()


def test_the_smallest_bucket_holding_the_highest_row_runs_and_buckets_stop_at_rows():
    assert batch_buckets(8) == [1, 2, 4, 8]
    assert batch_buckets(6) == [1, 2, 4, 6]
    assert batch_buckets(1) == [1]
    assert batch_buckets(100) == [1, 2, 4, 8, 16, 32, 64, 100]
    _, static = steps(rows=6)
    assert static.buckets == [1, 2, 4, 6]
    ran = record_buckets(static)
    cases = [([0], 1), ([1], 2), ([1, 0], 2), ([2], 4), ([0, 3], 4), ([4], 6), ([5, 0, 2], 6)]
    for rows, _ in cases:
        static.decode(rows, [1] * len(rows), [3] * len(rows))
    assert ran == [bucket for _, bucket in cases]


def test_scheduler_on_the_static_step_gives_the_eager_steps_greedy_tokens():
    model = tiny_decoder()
    static = BatchedGraphStep(copy.deepcopy(model), ROWS, CAPACITY, False)  # a bool: capture or not
    ran, row_sets = record_buckets(static), []
    plain_decode = static.decode

    def decode(rows, token_ids, positions):
        row_sets.append(list(rows))
        return plain_decode(rows, token_ids, positions)

    static.decode = decode
    runs = []
    for step in (BatchedTorchStep(model, ROWS, CAPACITY), static):
        scheduler = BatchScheduler(step, eos_token_ids=[])
        try:
            runs.append(conversation(scheduler))
            assert max(scheduler.counts.batch_sizes) >= 4  # they shared decode steps
        finally:
            scheduler.close()
    assert runs[1] == runs[0]
    assert ran == [min(b for b in (1, 2, 4, 8) if b > max(rows)) for rows in row_sets]
    assert {2, 4, 8} <= set(ran)  # steps shrink to smaller buckets as sequences leave
    assert [len(tokens) for tokens, _ in runs[1]] == [4, 40, 30, 12, 17, 30]
    assert runs[1][4][1] == "context_full"  # e's last token sat at the filler's position


def test_refuses_capture_off_cuda_compile_and_bad_steps():
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        BatchedGraphStep(tiny_decoder(), ROWS, CAPACITY)
    with pytest.raises(ValueError, match="does not torch.compile"):
        BatchedGraphStep(tiny_decoder(), ROWS, CAPACITY, GraphOptions(capture=False, compile=True))
    _, static = steps()
    with pytest.raises(ValueError, match="distinct rows"):
        static.decode([1, 1], [3, 4], [0, 1])
    with pytest.raises(ValueError, match="out of range"):
        static.decode([ROWS], [3], [0])
    with pytest.raises(ValueError, match="past the capacity of 96"):
        static.decode([0], [3], [CAPACITY])


def test_load_batched_step_reads_the_weights_into_an_eager_step_off_cuda(tmp_path):
    model = tiny_decoder()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    config = dict(
        model_type="llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
    )  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    step = load_batched_step(tmp_path, 4, CAPACITY, "cpu", torch.float32, graphs=False)
    assert type(step) is BatchedTorchStep and step.name == "pytorch-cpu batched x4"
    prompt = ids(6, 0)
    with torch.inference_mode():
        cache = KVCache.allocate(model.config, CAPACITY)
        expected = model(torch.tensor([prompt]), torch.arange(6), cache)[0, -1]
    torch.testing.assert_close(step.prefill(2, prompt, 0), expected)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device, not cpu"):
        load_batched_step(tmp_path, 4, CAPACITY, "cpu", torch.float32, graphs=True)


def test_an_outbox_announces_every_token_and_each_end_once_in_order():
    """One sender thread can serve every stream: each item a sequence gets is announced once."""
    outbox: queue.Queue = queue.Queue()
    scheduler = BatchScheduler(BatchedTorchStep(tiny_decoder(), ROWS, CAPACITY), [], outbox)
    try:
        requests = [
            scheduler.submit(f"s{i}", ids(5 + i, i), GenerationOptions(max_new_tokens=3 + i), tag=i)
            for i in range(4)
        ]
        got: dict[int, list] = {i: [] for i in range(4)}
        while sum(item is None for items in got.values() for item in items) < 4:
            sequence = outbox.get(timeout=10)
            got[sequence.tag].append(sequence.out.get_nowait())  # announced after it was put
    finally:
        scheduler.close()
    for i, request in enumerate(requests):
        assert [t for t, _ in got[i][:-1]] and got[i][-1] is None and len(got[i]) == 3 + i + 1
        assert request.out.empty()  # nothing was put without its announcement
    assert outbox.empty()
