"""Token choice on the device: the rule of :class:`engines.sampling.Sampler` in torch.

Greedy picks the same id as the host (first maximum, as ``np.argmax``). Sampling applies the
same temperature, top-k and top-p, but draws from a torch generator seeded with
``options.seed``, so a seed gives other tokens than on the host. The repetition penalty needs
the whole context, so it stays on the host (:func:`supports` says so).
"""

from __future__ import annotations

import torch

from engines.base import GenerationOptions


def supports(options: GenerationOptions) -> bool:
    """Whether :class:`DeviceSampler` applies ``options`` exactly (no repetition penalty)."""
    return options.repetition_penalty == 1.0


class DeviceSampler:
    """Chooses a token from device logits; one instance per generation (it owns the RNG)."""

    def __init__(self, options: GenerationOptions, device: torch.device) -> None:
        self.options = options
        self.generator = torch.Generator(device=device)
        if options.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(options.seed)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """The chosen id as a ``[1]`` int64 tensor on the device, from fp32 ``logits`` ``[V]``."""
        opts = self.options
        if opts.temperature <= 0.0:
            return logits.argmax(dim=-1, keepdim=True)
        scaled = logits / opts.temperature
        if 0 < opts.top_k < scaled.numel():
            kth = torch.topk(scaled, opts.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if opts.top_p < 1.0:
            # Keep the smallest set whose mass reaches top_p: a token stays while the mass
            # before it is below top_p, so the most likely one always stays.
            ordered, order = torch.sort(probs, descending=True)
            before = torch.cumsum(ordered, dim=0) - ordered
            ordered = ordered.masked_fill(before >= opts.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, ordered)
        return torch.multinomial(probs, 1, generator=self.generator)
