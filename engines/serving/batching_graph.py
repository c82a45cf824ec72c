"""In-flight batching with CUDA graphs: each batched decode step is one replay.

:class:`BatchedGraphStep` is :class:`~engines.serving.batched_step.BatchedTorchStep` (the same calls, so
:class:`~engines.serving.batching.BatchScheduler` runs either) with the decode step built as
:mod:`engines.cuda_graph` builds its batch-1 step:

- the model is fused (:meth:`Decoder.fuse`) and attends with plain matmuls;
- the KV cache ``[layers, rows, kv_heads, slots, head_dim]`` has ``capacity`` slots rounded up
  to a multiple of 64, and every decode step attends all of them (masked by position), so
  shapes never change;
- one graph per batch bucket (1, 2, 4, ... 64, capped at ``rows``): bucket n decodes rows
  0..n-1, one token each; a step over ``rows`` replays the smallest bucket holding its highest
  row. Rows of the bucket that are not decoding run as fillers, as in ``BatchedTorchStep``: at
  position ``capacity - 1``, so they write only that slot, which a sequence rewrites before it
  can read it;
- ids, positions and the rows to read back go to the device in one copy from pinned memory;
  the bucket leaves fp32 logits in a static buffer, from which the decoding rows are gathered.

All graphs share one memory pool (they never run concurrently). Prefill stays eager: the
batch-1 forward of ``BatchedTorchStep`` on the row (one prompt at a time, between decode
steps). With ``capture=False`` the same static decode steps run eagerly, off CUDA too: that
is how CPU tests check everything but the capture.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import torch

from engines.cuda_graph import PRECISION, SLOT_ALIGN, GraphOptions, _Upload
from engines.serving.batched_step import BatchedTorchStep
from models.decoder import Decoder as DecoderModel
from models.weights import load_decoder

logger = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def batch_buckets(rows: int) -> list[int]:
    """The rows each decode graph runs: :data:`BATCH_BUCKETS` below ``rows``, then ``rows``."""
    return sorted({b for b in BATCH_BUCKETS if b < rows} | {rows})


class BatchedGraphStep(BatchedTorchStep):
    """Batched decoding over one KV cache, each decode step one CUDA-graph replay.

    Takes ownership of ``model``: it is fused (:meth:`Decoder.fuse`). ``options`` is a
    :class:`~engines.cuda_graph.GraphOptions` (only ``capture`` applies: there are no prefill
    buckets nor decode windows here) or just whether to capture.
    """

    def __init__(
        self, model: DecoderModel, rows: int, capacity_tokens: int, options: GraphOptions | bool = True
    ) -> None:
        capture = options if isinstance(options, bool) else options.capture
        param = next(model.parameters())
        if capture and param.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {param.device}; set cuda_graph off")
        if isinstance(options, GraphOptions) and options.compile:
            raise ValueError("the batched CUDA-graph step does not torch.compile; set compile off")
        if rows < 1 or capacity_tokens < 2:
            raise ValueError(f"need 1 row and 2 tokens of capacity or more, not {rows} and {capacity_tokens}")
        model.fuse()
        slots = -(-capacity_tokens // SLOT_ALIGN) * SLOT_ALIGN  # aligned rows: cuBLAS's fast kernels
        super().__init__(model, rows, slots)
        self.capacity_tokens = capacity_tokens  # positions < capacity; slots past it stay unread
        self.filler_position = capacity_tokens - 1
        self.buckets = batch_buckets(rows)
        # Row 0: ids, row 1: positions (bucket n reads [:n] of both); row 2: the rows to return.
        self.inputs = _Upload((3, rows), self.device)
        self.logits = torch.zeros(rows, model.config.vocab_size, dtype=torch.float32, device=self.device)
        self.decodes: dict[int, Callable[[], None]] = {n: partial(self._run, n) for n in self.buckets}
        self.graphs: list[torch.cuda.CUDAGraph] = []
        kind = "cuda-graph" if capture else "static"
        self.name = f"pytorch-{self.device.type} {PRECISION[param.dtype]} {kind} batched x{rows}"
        if capture:
            start_ns = time.monotonic_ns()
            self._capture_all()
            logger.info(
                "%s: %d graphs in %.1f s", self.name, len(self.graphs), (time.monotonic_ns() - start_ns) / 1e9
            )

    def _run(self, n: int) -> None:
        """The static step of bucket ``n``: one token for each of rows 0..n-1, the whole cache."""
        ids = self.inputs.tensor[0, :n].view(n, 1)
        positions = self.inputs.tensor[1, :n].view(n, 1)
        logits = self.model(ids, positions, self._rows(0, n), last_only=True, matmul_attention=True)
        self.logits[:n].copy_(logits[:, -1])

    @torch.inference_mode()
    def _capture_all(self) -> None:
        # Largest bucket first: the pool is sized by the largest graph, the smaller ones reuse it.
        pool = torch.cuda.graph_pool_handle()
        host = self.inputs.claim()
        host[0], host[1], host[2] = 0, self.filler_position, 0  # warm-ups write only the filler slot
        self.inputs.send()
        for n in reversed(self.buckets):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # cuBLAS handles and workspaces before capture
                    self._run(n)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._run(n)
            self.graphs.append(graph)
            self.decodes[n] = graph.replay
        torch.cuda.synchronize()
        k, v = self.cache.k, self.cache.v
        assert isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
        k.zero_()
        v.zero_()

    def bucket_for(self, highest_row: int) -> int:
        """The bucket (rows run) of a step whose highest decoding row is ``highest_row``."""
        return self.buckets[bisect.bisect_right(self.buckets, highest_row)]

    @torch.inference_mode()
    def decode(self, rows: Sequence[int], token_ids: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """One token for each of ``rows`` at its position; fp32 logits ``[len(rows), V]`` (device).

        Replays the smallest bucket holding ``max(rows)``; its other rows run as fillers.

        Raises:
            ValueError: A row is repeated or out of range, or a position is past the capacity.
        """
        if not rows or not (len(rows) == len(token_ids) == len(positions)) or len(set(rows)) != len(rows):
            raise ValueError(f"decode needs distinct rows, one token and position each: {rows}")
        if min(rows) < 0 or max(rows) >= self.rows or min(positions) < 0:
            raise ValueError(f"rows {rows} or positions {positions} out of range (rows: {self.rows})")
        if max(positions) >= self.capacity_tokens:
            raise ValueError(f"position {max(positions)} is past the capacity of {self.capacity_tokens}")
        n = self.bucket_for(max(rows))
        host = self.inputs.claim()
        host[0, :n] = 0
        host[1, :n] = self.filler_position
        host[0, rows] = token_ids
        host[1, rows] = positions
        host[2, : len(rows)] = rows
        self.inputs.send()
        self.decodes[n]()
        # A gather, so a copy: the static logits are overwritten by the next step.
        return self.logits.index_select(0, self.inputs.tensor[2, : len(rows)])


def load_batched_step(
    model_dir: Path,
    rows: int,
    capacity_tokens: int,
    device: torch.device | str,
    dtype: torch.dtype,
    graphs: bool,
) -> BatchedTorchStep:
    """Load the model in ``model_dir`` as a batched step: CUDA graphs if ``graphs``, else eager.

    Raises:
        ValueError: ``graphs`` on a device other than CUDA.
        ModelNotFound: The folder, its config or its weights are missing.
        CorruptModel: The weights are unreadable, damaged or do not match the config.
    """
    if graphs and torch.device(device).type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device, not {device}; set cuda_graph off")
    model = load_decoder(model_dir, dtype=dtype, device=device)
    if graphs:
        return BatchedGraphStep(model, rows, capacity_tokens, GraphOptions(capture=True))
    return BatchedTorchStep(model, rows, capacity_tokens)
