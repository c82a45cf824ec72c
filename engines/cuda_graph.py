"""CUDA-graph decoding on the ``models/`` decoder (gpt-fast style): each step is one replay.

Eager decoding of a small model is bound by kernel launches and Python, not by the GPU: a
SmolLM2-135M step is ~1400 small kernels. So the step runs at fixed shapes and every shape is
captured once in a CUDA graph:

- the model is fused (:meth:`Decoder.fuse`: ~26 device ops per layer instead of ~47 on SmolLM2);
- a static KV cache of ``capacity`` slots rounded up to a multiple of 64 (aligned rows let
  cuBLAS use its fast kernels), plus 64 more; the first extra (scratch) slot takes padding's K/V;
- a decode step (one token) has one graph per KV window (by default 256, 512, 1024 slots and
  one covering the whole capacity): the replayed graph is the smallest window that holds the
  token's position, so attention reads only the slots in use (masked by position) rather
  than the whole cache. All windows share the cache and the input buffers;
- a prefill call of T tokens runs in the smallest bucket >= T (16, 32, ... 512), attending the
  whole cache. Buckets are left-padded and pads sit at the scratch slot, so the bucket's last
  row is the real last token and no real query ever attends a pad. Longer prompts run in chunks;
- inputs come from pinned host buffers by one asynchronous copy; each replay leaves the last
  token's fp32 logits and their argmax in static buffers, so greedy decoding reads back 8 bytes
  a token (an asynchronous copy and an event, :class:`_Readback`);
- greedy decoding runs ahead: before the host waits for token N, a "chain" graph is queued
  that decodes whatever id the device chose (copied on the device, position + 1 on the device),
  so the GPU always has the next step queued while the host reads a token and the driver
  streams it. If the driver then asks for anything else, the early step is simply not used:
  it wrote only the K/V slot after the cached prefix, which is rewritten before it is read.

All graphs share one memory pool (they never run concurrently). Off CUDA (``capture=False``)
the same static steps run eagerly: that is how CPU tests check everything but the capture.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from engines.base import Backend, BackendIdentity, GenerationOptions
from engines.fused_decode import FusedDecode
from engines.torch_sampling import DeviceSampler, supports
from models.decoder import Decoder as DecoderModel
from models.decoder import KVCache

logger = logging.getLogger(__name__)

SLOT_ALIGN = 64
PRECISION = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class GraphOptions:
    """How :class:`CudaGraphStep` builds its steps.

    ``prefill_buckets``: token counts (>= 2) with their own prefill graph.
    ``decode_windows``: KV lengths in slots (rounded up to 64) with their own decode graph;
    one covering the whole capacity is always added.
    ``capture``: capture CUDA graphs (needs CUDA); False runs the static steps eagerly.
    ``compile``: ``torch.compile`` (Inductor) the steps before capture; fuses the elementwise
    kernels, costs a compile at start-up (two graphs, dynamic in the window and in the bucket;
    Inductor caches them on disk).
    ``decode_kernels``: decode with :class:`~engines.fused_decode.FusedDecode` (five Triton
    kernels a layer) instead of the model's forward; ``compile`` then compiles prefill only.
    ``tune_kernels``: with ``decode_kernels``, time :data:`~engines.decode_kernels.TUNED_TILES`
    per product shape before capture and keep the fastest (Triton's autotuner).
    """

    prefill_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    decode_windows: tuple[int, ...] = (256, 512, 1024)
    capture: bool = True
    compile: bool = False
    decode_kernels: bool = False
    tune_kernels: bool = False


class _Upload:
    """A device tensor filled from pinned host memory by one asynchronous copy.

    Write into ``claim()``'s array, then ``send()``. ``claim`` waits until the previous copy
    has read the host buffer (an event), so the host never overwrites data still in flight.
    """

    def __init__(self, shape: tuple[int, ...], device: torch.device) -> None:
        on_cuda = device.type == "cuda"
        self.tensor = torch.zeros(shape, dtype=torch.long, device=device)
        self.pinned = torch.zeros(shape, dtype=torch.long, pin_memory=on_cuda)
        self.host = self.pinned.numpy()
        self.sent = torch.cuda.Event() if on_cuda else None

    def claim(self) -> np.ndarray:
        if self.sent is not None:
            self.sent.synchronize()
        return self.host

    def send(self) -> None:
        self.tensor.copy_(self.pinned, non_blocking=True)
        if self.sent is not None:
            self.sent.record()


class _Readback:
    """Two pinned 8-byte host slots that receive the chosen token id without stalling the GPU.

    ``queue`` copies the device's current choice into the next slot and records an event;
    ``read(slot)`` waits for that event only. Two slots: one step being read, one queued.
    """

    def __init__(self, device: torch.device) -> None:
        on_cuda = device.type == "cuda"
        pinned = torch.zeros(2, dtype=torch.long, pin_memory=on_cuda)
        self.slots = (pinned[0:1], pinned[1:2])
        self.host = pinned.numpy()
        self.ready = (torch.cuda.Event(), torch.cuda.Event()) if on_cuda else None
        self.next = 0

    def queue(self, token: torch.Tensor) -> int:
        slot, self.next = self.next, self.next ^ 1
        self.slots[slot].copy_(token, non_blocking=True)
        if self.ready is not None:
            self.ready[slot].record()
        return slot

    def read(self, slot: int) -> int:
        if self.ready is not None:
            self.ready[slot].synchronize()
        return int(self.host[slot])


@dataclass(frozen=True)
class _Ahead:
    """A decode step already queued: of ``token`` at ``position``; its choice goes to ``slot``."""

    token: int
    position: int
    slot: int


Compute = Callable[..., torch.Tensor]


def capture_graph(
    run: Callable[[], None], pool: Any, inputs: Sequence[torch.Tensor], graphs: list[torch.cuda.CUDAGraph]
) -> Callable[[], None]:
    """``run`` captured as a CUDA graph in ``pool`` (appended to ``graphs``); returns its replay.

    Two warm-up runs on a side stream first (compilation, cuBLAS handles and workspaces must
    exist before capture), with ``inputs`` zeroed: the warm-ups write K/V at their positions.
    """
    for tensor in inputs:
        tensor.zero_()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        run()
    graphs.append(graph)
    return graph.replay


class CudaGraphStep:
    """A :class:`~engines.base.TokenStepModel` that replays one CUDA graph per step shape.

    Takes ownership of ``model``: it is fused (:meth:`Decoder.fuse`).
    """

    def __init__(self, model: DecoderModel, capacity_tokens: int, options: GraphOptions) -> None:
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        if options.capture and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {self.device}; set cuda_graph off")
        model.fuse()
        self.model = model
        self.capacity_tokens = capacity_tokens
        self.scratch_slot = capacity_tokens
        config = model.config
        # Decode positions are < capacity; the scratch slot gets a row of its own, so every
        # decode window is shorter than the cache (torch.compile: the whole cache is a special
        # case of slicing, and would cost a compile of its own).
        largest = -(-capacity_tokens // SLOT_ALIGN) * SLOT_ALIGN
        slots = largest + SLOT_ALIGN
        self.cache = KVCache.allocate(
            config, slots, dtype=self.dtype, device=self.device, separate_layers=True
        )
        self.buckets = sorted({b for b in options.prefill_buckets if b >= 2})
        if not self.buckets:
            raise ValueError(f"prefill_buckets {options.prefill_buckets} has no bucket of >= 2 tokens")
        aligned = {-(-w // SLOT_ALIGN) * SLOT_ALIGN for w in options.decode_windows if w > 0}
        self.windows = sorted({w for w in aligned if w < largest} | {largest})
        # Prefill bucket t reads ids from prefill[0, :t] and positions from prefill[1, :t].
        self.prefill = _Upload((2, self.buckets[-1]), self.device)
        self.step_input = _Upload((2,), self.device)  # a decode step's [id, position]
        self.readback = _Readback(self.device)
        self.logits = torch.zeros(1, config.vocab_size, dtype=torch.float32, device=self.device)
        self.token = torch.zeros(1, dtype=torch.long, device=self.device)
        # longrope: a prompt's length picks the RoPE factors of all its chunks (set per feed).
        self.rope_tokens = torch.zeros(1, dtype=torch.long, device=self.device)
        self.longrope = config.rope_switch_tokens is not None
        # A decode graph's window is this tensor's length (torch.compile: one graph, dynamic in it).
        self.window_slots = {w: torch.arange(w, device=self.device) for w in self.windows}
        self.sampler: DeviceSampler | None = None
        self.ahead: _Ahead | None = None
        self.graphs: list[torch.cuda.CUDAGraph] = []
        # Raises ValueError for a family the kernels do not cover (the message names it).
        self.fused = (
            FusedDecode(model, self.cache, logits=self.logits, tune=options.tune_kernels)
            if options.decode_kernels
            else None
        )
        kind = "cuda-graph" if options.capture else "static"
        variant = f"{kind}+compile" if options.compile else kind
        if self.fused is not None:
            variant += f"+{self.fused.backend}-decode" + ("-tuned" if options.tune_kernels else "")
        self.identity = BackendIdentity(Backend.PYTORCH, self.device.type, PRECISION[self.dtype], variant)
        self.name = self.identity.describe()
        prefill: Compute = self._prefill_compute
        decode: Compute = self._decode_compute
        self.compiled = options.compile
        if options.compile:
            prefill = torch.compile(self._prefill_compute, fullgraph=True)
            if self.fused is None:
                decode = torch.compile(self._decode_compute, fullgraph=True)
        Run = Callable[[], None]
        self.runs: dict[int, Run] = {t: partial(self._run, t, prefill) for t in self.buckets}
        self.decodes: dict[int, Run] = {w: partial(self._decode, w, decode) for w in self.windows}
        self.chains: dict[int, Run] = {w: partial(self._chain, w, decode) for w in self.windows}
        if options.capture:
            start_ns = time.monotonic_ns()
            self._capture_all()
            logger.info(
                "%s: %d graphs in %.1f s", self.name, len(self.graphs), (time.monotonic_ns() - start_ns) / 1e9
            )

    def _prefill_compute(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        rope_tokens = self.rope_tokens if self.longrope else None
        logits = self.model(
            ids, positions, self.cache, last_only=True, matmul_attention=True, rope_tokens=rope_tokens
        )
        return logits[:, -1]

    def _decode_compute(
        self, ids: torch.Tensor, positions: torch.Tensor, window: torch.Tensor
    ) -> torch.Tensor:
        kv_len = window.shape[0]
        if self.fused is not None:
            return self.fused(ids, positions, kv_len)  # writes self.logits
        logits = self.model(ids, positions, self.cache, kv_len=kv_len, last_only=True, matmul_attention=True)
        return logits[:, -1]

    def _choose(self, logits: torch.Tensor) -> None:
        if logits.data_ptr() != self.logits.data_ptr():
            self.logits.copy_(logits)
        self.token.copy_(logits[0].argmax(dim=-1, keepdim=True))

    def _run(self, t: int, compute: Compute) -> None:
        ids, positions = self.prefill.tensor[0, :t].view(1, t), self.prefill.tensor[1, :t]
        if self.compiled:  # compile once for every bucket, not once per bucket
            torch._dynamo.maybe_mark_dynamic(ids, 1)
            torch._dynamo.maybe_mark_dynamic(positions, 0)
        self._choose(compute(ids, positions))

    def _decode(self, window: int, compute: Compute) -> None:
        ids, positions = self.step_input.tensor[0:1].view(1, 1), self.step_input.tensor[1:2]
        slots = self.window_slots[window]
        if self.compiled and self.fused is None:
            torch._dynamo.maybe_mark_dynamic(slots, 0)
        self._choose(compute(ids, positions, slots))

    def _chain(self, window: int, compute: Compute) -> None:
        """Decode the token the last step chose, one position after the last step's."""
        self.step_input.tensor[0:1].copy_(self.token)
        self.step_input.tensor[1:2].add_(1)
        self._decode(window, compute)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        # Decode windows first, then prefill from the largest bucket: the pool is sized by the
        # largest graph and the smaller ones reuse its memory.
        pool = torch.cuda.graph_pool_handle()
        inputs = (self.prefill.tensor, self.step_input.tensor)
        for w in self.windows:
            self.decodes[w] = capture_graph(self.decodes[w], pool, inputs, self.graphs)
            self.chains[w] = capture_graph(self.chains[w], pool, inputs, self.graphs)
        for t in reversed(self.buckets):
            self.runs[t] = capture_graph(self.runs[t], pool, inputs, self.graphs)
        torch.cuda.synchronize()
        for layer in (*self.cache.k, *self.cache.v):  # the warm-up runs wrote the first slots
            layer.zero_()

    def window_for(self, position: int) -> int:
        """The decode window (KV slots) a token at ``position`` runs in: the smallest > it."""
        return self.windows[bisect.bisect_right(self.windows, position)]

    def _feed(self, token_ids: Sequence[int], start_pos: int) -> None:
        """Run ``token_ids`` at ``start_pos...``, chunk by chunk; leaves logits and token set."""
        self.ahead = None
        ids = list(token_ids)
        width = self.buckets[-1]
        if self.longrope:
            self.rope_tokens.fill_(start_pos + len(ids))  # queued on the stream, no sync
        for begin in range(0, len(ids), width):
            chunk = ids[begin : begin + width]
            first, n = start_pos + begin, len(chunk)
            if n == 1:
                self.step_input.claim()[:] = (chunk[0], first)
                self.step_input.send()
                self.decodes[self.window_for(first)]()
                continue
            t = next(b for b in self.buckets if b >= n)
            pad = t - n
            host = self.prefill.claim()
            host[0, :pad] = 0
            host[0, pad:t] = chunk
            host[1, :pad] = self.scratch_slot
            host[1, pad:t] = np.arange(first, first + n)
            self.prefill.send()
            self.runs[t]()

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        """Run ``token_ids`` at ``start_pos`` and return the last token's logits (fp32)."""
        self._feed(token_ids, start_pos)
        # A copy even on the CPU: the static buffer is overwritten by the next call.
        return self.logits[0].to("cpu", copy=True).numpy()

    def close(self) -> None:
        """Nothing to release beyond memory (graphs and buffers go with the step)."""

    def begin_choosing(self, options: GenerationOptions) -> bool:
        """Choose on the device unless ``options`` need the host (repetition penalty)."""
        self.sampler = DeviceSampler(options, self.device) if supports(options) else None
        return self.sampler is not None

    @torch.inference_mode()
    def forward_token(self, token_ids: Sequence[int], start_pos: int) -> int:
        """Run ``token_ids`` at ``start_pos``; return the id chosen by ``begin_choosing``'s rule."""
        if self.sampler is None:
            raise RuntimeError("forward_token before begin_choosing accepted the options")
        if self.sampler.options.temperature > 0.0:
            self._feed(token_ids, start_pos)
            return int(self.sampler(self.logits[0]).item())
        single = len(token_ids) == 1
        ahead, self.ahead = self.ahead, None
        if single and ahead is not None and (ahead.token, ahead.position) == (token_ids[0], start_pos):
            slot = ahead.slot  # the step is already queued or done
        else:
            self._feed(token_ids, start_pos)
            slot = self.readback.queue(self.token)
        position = start_pos + len(token_ids)  # where the chosen token will go
        queued = None
        if single and position < self.capacity_tokens:
            # Decoding: the next step will most likely be this step's choice, one slot on.
            # Queue it now, before waiting for the choice, so the GPU never idles on the host.
            self.chains[self.window_for(position)]()
            queued = self.readback.queue(self.token)
        token = self.readback.read(slot)  # the only wait: for this step's 8-byte choice
        if queued is not None:
            self.ahead = _Ahead(token, position, queued)
        return token
