"""Small random decoders and a scripted conversation for the batching tests (CPU)."""

from __future__ import annotations

import time

import numpy as np
import torch

from engines.base import GenerationOptions
from engines.serving.batching import BatchScheduler
from models.config import DecoderConfig
from models.decoder import Decoder

VOCAB = 97
CAPACITY = 96  # 128 slots once aligned: slots 96..127 must never be written
ROWS = 8


def tiny_decoder(model_type: str = "llama") -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, max_position_embeddings=128, model_type=model_type,
        attention_bias=model_type == "qwen2",
    )  # fmt: skip
    model = Decoder(config).eval()
    # Default init leaves the embeddings in charge: greedy runs fall into two-token loops that
    # a damaged key does not change. Three times the weights let attention pick the tokens.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2 and not name.startswith("embed"):
                param.mul_(3.0)
    return model


def ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, n).tolist()


def conversation(scheduler: BatchScheduler) -> list[tuple[list[int], str]]:
    """Five sessions joining and leaving; one comes back to the row it left idle, prefix kept."""

    def run(request):
        return [t for t, _ in request.tokens()], request.stop_reason.value

    first = scheduler.submit("a", ids(50, 1), GenerationOptions(max_new_tokens=4))
    others = [
        scheduler.submit("b", ids(12, 2), GenerationOptions(max_new_tokens=40)),
        scheduler.submit("c", ids(20, 3), GenerationOptions(max_new_tokens=30)),
        scheduler.submit("d", ids(3, 4), GenerationOptions(max_new_tokens=12)),
        scheduler.submit("e", ids(80, 5), GenerationOptions(max_new_tokens=40)),  # fills the cache
    ]
    results = [run(first)]
    # Row 0 now idles, holding a's prefix, while b-e decode with it as a filler row.
    steps_then, deadline = scheduler.counts.steps, time.monotonic() + 10
    while scheduler.counts.steps < steps_then + 3 and time.monotonic() < deadline:
        time.sleep(0.001)
    follow_up = ids(50, 1) + results[0][0] + ids(5, 6)
    again = scheduler.submit("a", follow_up, GenerationOptions(max_new_tokens=30))
    results += [run(r) for r in [*others, again]]
    assert again.reused_tokens == len(follow_up) - 6  # row 0's prefix: it was not recomputed
    return results
