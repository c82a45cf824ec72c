"""The real SmolLM2 as a CPU fp32 decoder and a dialogue over it (the conftest fixtures use these)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from assistant.config import DEFAULT_SYSTEM_PROMPT
from assistant.stages.dialogue import Dialogue
from engines.base import GenerationOptions
from engines.driver import DecoderDriver
from engines.torch_backend import TorchBackendOptions, load_torch_decoder


def make_decoder(model_dir: Path, tokenizer, capacity_tokens: int = 2048) -> DecoderDriver:
    """A CPU fp32 decoder over the real model (as ``assistant.stages.llm.load_llm`` builds it)."""
    options = TorchBackendOptions(device="cpu", dtype="fp32", capacity_tokens=capacity_tokens, threads=2)
    return load_torch_decoder(model_dir, tokenizer, options)


def make_dialogue(decoder: DecoderDriver, tokenizer, **options) -> Dialogue:
    opts = GenerationOptions(**{"max_new_tokens": 48, **options})
    return Dialogue(decoder, tokenizer, DEFAULT_SYSTEM_PROMPT, opts)


def run_reply(dialogue: Dialogue, text: str):
    """Ask and drain the reply; returns (reply, token ids)."""
    reply = dialogue.ask(text)
    ids = [c.token_id for c in reply if c.token_id >= 0]
    return reply, ids


def greedy(decoder, ids: list[int], steps: int = 64) -> tuple[list[int], list]:
    """``steps`` greedy tokens with EOS masked (every backend runs the full length); tokens and logits.

    ``logits[i]`` is what token ``i`` was picked from (the last entry follows the last token).
    """
    eos = sorted(decoder.eos_token_ids)
    decoder.reset()
    logits = decoder.prefill(ids)
    tokens, seen = [], [logits]
    for _ in range(steps):
        logits = logits.copy()
        logits[eos] = -np.inf
        tokens.append(int(logits.argmax()))
        logits = decoder.decode(tokens[-1])
        seen.append(logits)
    return tokens, seen
