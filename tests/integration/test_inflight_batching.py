"""In-flight batching (engines/serving/batching.py): per-row positions, and many sessions on one model.

Replies of concurrent sessions must be the tokens each gets alone (the batch-1 driver, greedy),
on the real SmolLM2; sequences join and leave between steps; sessions keep their prefix.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from bench.corpus import BATCH_QUESTIONS as QUESTIONS
from engines.base import GenerationOptions, StopReason
from engines.serving.batched_step import BatchedTorchStep
from engines.serving.batching import BatchScheduler
from engines.serving.sequences import RequestError
from models.config import DecoderConfig
from models.decoder import Decoder, KVCache
from models.weights import load_decoder

GREEDY = GenerationOptions(max_new_tokens=24)


def tiny_decoder() -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, max_position_embeddings=128,
    )  # fmt: skip
    return Decoder(config).eval()


@torch.inference_mode()
def test_rows_at_their_own_positions_match_each_row_alone() -> None:
    """A decode step of 3 rows at positions 5, 9 and 2 gives each row's batch-1 logits and cache."""
    model = tiny_decoder()
    prompts = [list(range(3, 9)), list(range(10, 20)), [40, 41, 42]]
    alone, batched = [], KVCache.allocate(model.config, 32, batch=3)
    for row, ids in enumerate(prompts):
        cache = KVCache.allocate(model.config, 32)
        model(torch.tensor([ids]), torch.arange(len(ids)), cache)
        k, v = batched.k, batched.v
        assert isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
        model(torch.tensor([ids]), torch.arange(len(ids)), KVCache(k[:, row : row + 1], v[:, row : row + 1]))
        logits = model(torch.tensor([[7]]), torch.tensor([len(ids)]), cache)
        alone.append((logits[0, -1], cache.k[:, 0, :, len(ids)]))
    positions = torch.tensor([[len(p)] for p in prompts])
    logits = model(torch.tensor([[7], [7], [7]]), positions, batched)
    for row, (expected, key) in enumerate(alone):
        torch.testing.assert_close(logits[row, -1], expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batched.k[:, row, :, len(prompts[row])], key, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def scheduler(model_dir: Path, tokenizer):
    model = load_decoder(model_dir, dtype=torch.float32, device="cpu")
    eos = [*DecoderConfig.from_dir(model_dir).eos_token_ids, tokenizer.eos_token_id]
    scheduler = BatchScheduler(BatchedTorchStep(model, rows=8, capacity_tokens=512), eos)
    yield scheduler
    scheduler.close()


def prompt(tokenizer, question: str, history: list[dict[str, str]] | None = None) -> list[int]:
    messages = [*(history or []), {"role": "user", "content": question}]
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    )


@pytest.fixture
def alone(batch1_reply):
    """``alone(ids, options)``: what the batch-1 driver replies (conftest: each prompt generated once)."""

    def reply(ids: list[int], options: GenerationOptions = GREEDY) -> list[int]:
        return batch1_reply(ids, options)

    return reply


def reply_ids(request, eos) -> list[int]:
    return [t for t, _ in request.tokens() if t not in eos]


@pytest.mark.slow
@pytest.mark.parametrize("sessions", [2, 8])
def test_concurrent_sessions_get_their_batch1_replies(scheduler, alone, tokenizer, sessions) -> None:
    prompts = [prompt(tokenizer, q) for q in QUESTIONS[:sessions]]
    expected = [alone(p) for p in prompts]
    steps = scheduler.counts.steps
    requests = [scheduler.submit(f"same-{sessions}-{i}", p, GREEDY) for i, p in enumerate(prompts)]
    got = [reply_ids(r, scheduler.eos_token_ids) for r in requests]
    assert got == expected
    since = list(scheduler.counts.batch_sizes)[steps - scheduler.counts.steps :]  # this test's decode steps
    assert max(since) == sessions  # they really shared decode steps
    assert max(scheduler.counts.prefill_sizes) > 1  # and newcomers shared a prefill
    assert scheduler.busy_rows() == 0


@pytest.mark.slow
def test_a_newcomer_joins_a_running_batch_and_both_stay_exact(scheduler, alone, tokenizer) -> None:
    first, second = prompt(tokenizer, QUESTIONS[0]), prompt(tokenizer, QUESTIONS[5])
    long = GenerationOptions(max_new_tokens=40)
    expected = [alone(first, long), alone(second)]
    a = scheduler.submit("join-a", first, long)
    stream = a.tokens()
    head = [next(stream)[0] for _ in range(5)]  # a is decoding alone
    b = scheduler.submit("join-b", second, GREEDY)
    rest = [t for t, _ in stream]
    assert [t for t in head + rest if t not in scheduler.eos_token_ids] == expected[0]
    assert reply_ids(b, scheduler.eos_token_ids) == expected[1]


@pytest.mark.slow
def test_a_session_keeps_its_prefix_between_turns(scheduler, tokenizer) -> None:
    first = prompt(tokenizer, "What is the capital of France?")
    request = scheduler.submit("prefix", first, GREEDY)
    answer = tokenizer.decode(reply_ids(request, scheduler.eos_token_ids), skip_special_tokens=True)
    history = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": answer},
    ]
    follow = scheduler.submit("prefix", prompt(tokenizer, "And of Italy?", history), GREEDY)
    reply_ids(follow, scheduler.eos_token_ids)
    assert follow.reused_tokens >= len(first) - 1
    other = scheduler.submit("someone-else", prompt(tokenizer, "And of Italy?", history), GREEDY)
    reply_ids(other, scheduler.eos_token_ids)
    assert other.reused_tokens == 0


@pytest.mark.slow
def test_a_cancelled_request_frees_its_row_at_the_next_step(scheduler, tokenizer) -> None:
    request = scheduler.submit(
        "leaver", prompt(tokenizer, QUESTIONS[3]), GenerationOptions(max_new_tokens=200)
    )
    stream = request.tokens()
    next(stream)
    request.cancel()
    count = 1 + sum(1 for _ in stream)
    assert request.stop_reason is StopReason.CANCELLED
    assert count < 10
    deadline = time.monotonic() + 5
    while scheduler.busy_rows() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert scheduler.busy_rows() == 0


@pytest.mark.slow
def test_more_sessions_than_rows_wait_for_a_row_and_stay_exact(model_dir, alone, tokenizer) -> None:
    model = load_decoder(model_dir, dtype=torch.float32, device="cpu")
    small = BatchScheduler(BatchedTorchStep(model, rows=2, capacity_tokens=256), [tokenizer.eos_token_id, 2])
    try:
        prompts = [prompt(tokenizer, q) for q in QUESTIONS[:5]]
        short = GenerationOptions(max_new_tokens=8)
        requests = [small.submit(f"wait-{i}", p, short) for i, p in enumerate(prompts)]
        got = [reply_ids(r, small.eos_token_ids) for r in requests]
        assert got == [alone(p, short)[:8] for p in prompts]
        assert max(small.counts.batch_sizes) == 2
    finally:
        small.close()


def test_empty_and_over_context_requests_are_refused_with_the_reason(scheduler) -> None:
    with pytest.raises(RequestError, match="empty prompt"):
        scheduler.submit("bad", [], GREEDY)
    with pytest.raises(RequestError, match="does not fit the server's context of 512"):
        scheduler.submit("bad", list(range(600)), GREEDY)


@pytest.mark.slow
def test_a_returning_session_moves_to_the_lowest_row_with_its_prefix(scheduler, alone, tokenizer) -> None:
    """Decode steps span rows 0..highest running: a lone session must not decode from row 7."""
    first = [scheduler.submit(f"move-{i}", prompt(tokenizer, q), GREEDY) for i, q in enumerate(QUESTIONS[:3])]
    replies = [reply_ids(r, scheduler.eos_token_ids) for r in first]
    high = max(range(3), key=lambda i: first[i].row)
    assert first[high].row > 0
    history = [
        {"role": "user", "content": QUESTIONS[high]},
        {"role": "assistant", "content": tokenizer.decode(replies[high], skip_special_tokens=True)},
    ]
    follow_ids = prompt(tokenizer, "Tell me more.", history)
    follow = scheduler.submit(f"move-{high}", follow_ids, GREEDY)
    assert reply_ids(follow, scheduler.eos_token_ids) == alone(follow_ids)
    assert follow.row == 0
    assert follow.reused_tokens >= len(first[high].prompt_ids)  # its keys moved with it
