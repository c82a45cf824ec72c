"""Token selection from logits: greedy, temperature, top-k, top-p, repetition penalty."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engines.base import GenerationOptions


class Sampler:
    """Picks the next token id; one instance per generation (it owns the seeded RNG)."""

    def __init__(self, options: GenerationOptions) -> None:
        self.options = options
        self.rng = np.random.default_rng(options.seed)

    def __call__(self, logits: np.ndarray, context_ids: Sequence[int]) -> int:
        """Choose a token given fp32 ``logits`` ``[V]`` and the ids seen so far."""
        opts = self.options
        if opts.repetition_penalty != 1.0 and len(context_ids):
            logits = logits.copy()
            seen = np.unique(np.asarray(context_ids, dtype=np.int64))
            values = logits[seen]
            # As in CTRL / transformers: shrink positive logits, grow negative ones.
            logits[seen] = np.where(
                values > 0, values / opts.repetition_penalty, values * opts.repetition_penalty
            )
        if opts.temperature <= 0.0:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / opts.temperature
        if 0 < opts.top_k < scaled.size:
            kth = np.partition(scaled, -opts.top_k)[-opts.top_k]
            scaled = np.where(scaled < kth, -np.inf, scaled)
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        if opts.top_p < 1.0:
            order = np.argsort(-probs)
            cumulative = np.cumsum(probs[order])
            # Keep the smallest set whose mass reaches top_p (always at least one token).
            keep = order[: int(np.searchsorted(cumulative, opts.top_p)) + 1]
            mask = np.zeros_like(probs)
            mask[keep] = probs[keep]
            probs = mask / mask.sum()
        return int(self.rng.choice(probs.size, p=probs))
