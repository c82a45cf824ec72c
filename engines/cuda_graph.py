"""CUDA-graph decoding on the ``models/`` decoder (gpt-fast style): each step is one replay.

Eager decoding of a small model is bound by kernel launches and Python, not by the GPU: a
SmolLM2-135M step is ~1400 small kernels. So the step runs at fixed shapes and every shape is
captured once in a CUDA graph:

- a static KV cache of ``capacity + 1`` slots, rounded up to a multiple of 64 (aligned rows
  let cuBLAS use its fast kernels); the first extra (scratch) slot takes padding's K/V;
- token ids and positions live in one static device buffer, filled by one host copy per call;
- attention spans the whole cache, masked by position (``matmul_attention``: no SDPA dispatch);
- a call of T tokens runs in the smallest bucket >= T: 1 for decode, 16, 32, ... for prefill.
  Buckets are left-padded and pads sit at the scratch slot, so the bucket's last row is the
  real last token and no real query ever attends a pad. Longer prompts run in chunks;
- each replay leaves the last token's fp32 logits and their argmax in static buffers, so greedy
  decoding reads back 8 bytes a token;
- greedy decoding runs one step ahead: as soon as a token id is read, a "chain" graph starts
  the next step on that id (copied on the device), so the driver's per-token host work overlaps
  the GPU. If the driver then asks for anything else, the early step is simply not used: it
  wrote only the K/V slot after the cached prefix, which is rewritten before it is ever read.

All graphs share one memory pool (they never run concurrently). Off CUDA (``capture=False``)
the same static step runs eagerly: that is how CPU tests check everything but the capture.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from engines.base import GenerationOptions
from engines.torch_sampling import DeviceSampler, supports
from models.decoder import Decoder as DecoderModel
from models.decoder import KVCache

logger = logging.getLogger(__name__)

SLOT_ALIGN = 64
PRECISION = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class GraphOptions:
    """How :class:`CudaGraphStep` builds its steps.

    ``prefill_buckets``: token counts with their own prefill graph (1 is always added).
    ``capture``: capture CUDA graphs (needs CUDA); False runs the static step eagerly.
    ``compile``: ``torch.compile`` (Inductor) the step before capture; fuses the elementwise
    kernels, costs a compile at start-up (cached on disk by Inductor).
    """

    prefill_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    capture: bool = True
    compile: bool = False


class CudaGraphStep:
    """A :class:`~engines.base.TokenStepModel` that replays one CUDA graph per token bucket.

    Takes ownership of ``model``: its projections are fused (:meth:`Decoder.fuse_projections`).
    """

    def __init__(self, model: DecoderModel, capacity_tokens: int, options: GraphOptions) -> None:
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        if options.capture and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {self.device}; set cuda_graph off")
        model.fuse_projections()
        self.model = model
        self.capacity_tokens = capacity_tokens
        self.scratch_slot = capacity_tokens
        config = model.config
        slots = -(-(capacity_tokens + 1) // SLOT_ALIGN) * SLOT_ALIGN
        self.cache = KVCache.allocate(
            config, slots, dtype=self.dtype, device=self.device, separate_layers=True
        )
        self.buckets = sorted({1, *options.prefill_buckets})
        width = self.buckets[-1]
        on_cuda = self.device.type == "cuda"
        # Bucket t reads ids from inputs[:t] and positions from inputs[t:2t].
        self.inputs = torch.zeros(2 * width, dtype=torch.long, device=self.device)
        self.staging = torch.zeros(2 * width, dtype=torch.long, pin_memory=on_cuda)
        self.host = self.staging.numpy()
        # The copy from pinned memory is asynchronous: refill only after it has run.
        self.staged = torch.cuda.Event() if on_cuda else None
        self.logits = torch.zeros(1, config.vocab_size, dtype=torch.float32, device=self.device)
        self.token = torch.zeros(1, dtype=torch.long, device=self.device)
        self.sampler: DeviceSampler | None = None
        self.ahead: tuple[int, int] | None = None  # (id, position) of a decode step already started
        self.graphs: list[torch.cuda.CUDAGraph] = []
        kind = "cuda-graph" if options.capture else "static"
        self.name = f"pytorch-{self.device.type} {PRECISION[self.dtype]} {kind}"
        compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = self._compute
        if options.compile:
            compute = torch.compile(self._compute, fullgraph=True)
            self.name += "+compile"
        self.runs: dict[int, Callable[[], None]] = {t: partial(self._run, t, compute) for t in self.buckets}
        self.chain: Callable[[], None] = partial(self._chain, compute)
        if options.capture:
            start_ns = time.monotonic_ns()
            self._capture_all()
            logger.info(
                "%s: %d graphs in %.1f s", self.name, len(self.graphs), (time.monotonic_ns() - start_ns) / 1e9
            )

    def _compute(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        logits = self.model(ids, positions, self.cache, last_only=True, matmul_attention=True)
        return logits[:, -1]

    def _run(self, t: int, compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        logits = compute(self.inputs[:t].view(1, t), self.inputs[t : 2 * t])
        self.logits.copy_(logits)
        self.token.copy_(logits[0].argmax(dim=-1, keepdim=True))

    def _chain(self, compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        """Decode the token the last step chose, at the position already in ``inputs[1]``."""
        self.inputs[0:1].copy_(self.token)
        self._run(1, compute)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        # Decode first, then prefill from the largest bucket: with torch.compile that is one
        # static compile for T=1 and one dynamic in T for every bucket; the pool is sized by
        # the largest graph and the smaller ones reuse its memory.
        pool = torch.cuda.graph_pool_handle()
        self.chain = self._capture(self.chain, pool)
        for t in [1, *reversed(self.buckets[1:])]:
            self.runs[t] = self._capture(self.runs[t], pool)
        torch.cuda.synchronize()
        for layer in (*self.cache.k, *self.cache.v):  # the warm-up runs wrote slot 0
            layer.zero_()

    def _capture(self, run: Callable[[], None], pool: Any) -> Callable[[], None]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # compile, cuBLAS handles and workspaces before capture
                run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            run()
        self.graphs.append(graph)
        return graph.replay

    def _bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def _feed(self, token_ids: Sequence[int], start_pos: int) -> None:
        """Run ``token_ids`` at ``start_pos...``, chunk by chunk; leaves logits and token set."""
        self.ahead = None
        ids = list(token_ids)
        width = self.buckets[-1]
        for begin in range(0, len(ids), width):
            chunk = ids[begin : begin + width]
            n = len(chunk)
            t = self._bucket(n)
            pad = t - n
            if self.staged is not None:
                self.staged.synchronize()
            first = start_pos + begin
            self.host[:pad] = 0
            self.host[pad:t] = chunk
            self.host[t : t + pad] = self.scratch_slot
            self.host[t + pad : 2 * t] = np.arange(first, first + n)
            self.inputs[: 2 * t].copy_(self.staging[: 2 * t], non_blocking=True)
            if self.staged is not None:
                self.staged.record()
            self.runs[t]()

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        """Run ``token_ids`` at ``start_pos`` and return the last token's logits (fp32)."""
        self._feed(token_ids, start_pos)
        # A copy even on the CPU: the static buffer is overwritten by the next call.
        return self.logits[0].to("cpu", copy=True).numpy()

    def _start_ahead(self, token: int, position: int) -> None:
        """Start decoding ``token`` (already in ``self.token``) at ``position`` now."""
        if position >= self.capacity_tokens:
            return  # the driver stops there: the context is full
        if self.staged is not None:
            self.staged.synchronize()
        self.host[1] = position  # bucket 1 reads its position from inputs[1]
        self.inputs[1:2].copy_(self.staging[1:2], non_blocking=True)
        if self.staged is not None:
            self.staged.record()
        self.chain()
        self.ahead = (token, position)

    def begin_choosing(self, options: GenerationOptions) -> bool:
        """Choose on the device unless ``options`` need the host (repetition penalty)."""
        self.sampler = DeviceSampler(options, self.device) if supports(options) else None
        return self.sampler is not None

    @torch.inference_mode()
    def forward_token(self, token_ids: Sequence[int], start_pos: int) -> int:
        """Run ``token_ids`` at ``start_pos``; return the id chosen by ``begin_choosing``'s rule."""
        if self.sampler is None:
            raise RuntimeError("forward_token before begin_choosing accepted the options")
        single = len(token_ids) == 1
        if not (single and self.ahead == (token_ids[0], start_pos)):
            self._feed(token_ids, start_pos)  # else the step already runs (started ahead)
        self.ahead = None
        if self.sampler.options.temperature > 0.0:
            return int(self.sampler(self.logits[0]).item())
        token = int(self.token.item())  # the graph's argmax: one 8-byte read, the only sync
        if single:  # decoding: the next step will most likely be this token, one slot on
            self._start_ahead(token, start_pos + 1)
        return token
