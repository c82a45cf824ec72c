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

With ``prefill_chunk`` (chunked prefill, :mod:`engines.serving.mixed_step`), newcomers'
prompts ride in the decode step: one more graph per decode bucket (and none) and chunk shape
(:func:`~engines.serving.mixed_step.chunk_shapes`), e.g. 8 x 15 for 64 rows and 1024 tokens.
Without it, prefill stays eager: the forward of ``BatchedTorchStep`` on the rows, between
decode steps.

All graphs share one memory pool (they never run concurrently). With ``capture=False`` the
same static steps run eagerly, off CUDA too: that is how CPU tests check everything but the
capture.
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
from engines.serving.mixed_step import INPUT_ROWS, Chunk, Packing, mixed_forward, pack
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
        self,
        model: DecoderModel,
        rows: int,
        capacity_tokens: int,
        options: GraphOptions | bool = True,
        prefill_chunk: int = 0,
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
        super().__init__(model, rows, slots, prefill_chunk)
        self.capacity_tokens = capacity_tokens  # positions < capacity; slots past it stay unread
        self.filler_position = capacity_tokens - 1
        self.buckets = batch_buckets(rows)
        # Row 0: ids, row 1: positions (bucket n reads [:n] of both); row 2: the rows to return.
        self.inputs = _Upload((3, rows), self.device)
        self.logits = torch.zeros(rows, model.config.vocab_size, dtype=torch.float32, device=self.device)
        self.decodes: dict[int, Callable[[], None]] = {n: partial(self._run, n) for n in self.buckets}
        # Mixed steps: every decode bucket (and none) with every chunk shape, one graph each.
        # Cheapest first: a step runs the first that holds its chunks.
        self.packings = [Packing(n, shape) for n in [0, *self.buckets] for shape in self.chunk_shapes]
        widest = max((p.columns for p in self.packings), default=1)
        # mixed_step.pack's rows, then one more: the logit rows to return.
        self.mixed_inputs = _Upload((INPUT_ROWS + 1, widest), self.device)
        picks = max((p.picks for p in self.packings), default=1)
        self.mixed_logits = torch.zeros(
            picks, model.config.vocab_size, dtype=torch.float32, device=self.device
        )
        self.mixeds: dict[Packing, Callable[[], None]] = {
            p: partial(self._run_mixed, p) for p in self.packings
        }
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

    def _run_mixed(self, packing: Packing) -> None:
        """The static mixed step of ``packing`` (:func:`~engines.serving.mixed_step.mixed_forward`)."""
        logits = mixed_forward(self.model, self.cache, self.mixed_inputs.tensor[:INPUT_ROWS], packing)
        self.mixed_logits[: packing.picks].copy_(logits)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        # Largest step first: the pool is sized by the largest graph, the smaller ones reuse it.
        pool = torch.cuda.graph_pool_handle()
        host = self.inputs.claim()
        host[0], host[1], host[2] = 0, self.filler_position, 0  # warm-ups write only the filler slot
        self.inputs.send()
        if self.packings:  # warm-ups and captures write only filler slots
            mixed = self.mixed_inputs.claim()
            mixed[:] = 0
            mixed[1] = mixed[6] = self.filler_position
            self.mixed_inputs.send()
        steps: list[tuple[Callable[[], None], Callable[[Callable[[], None]], None]]] = [
            (partial(self._run_mixed, p), partial(self.mixeds.__setitem__, p))
            for p in sorted(self.packings, key=lambda p: -(p.tokens + p.shape.slots * p.shape.width))
        ]
        steps += [
            (partial(self._run, n), partial(self.decodes.__setitem__, n)) for n in reversed(self.buckets)
        ]
        for run, keep in steps:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # cuBLAS handles and workspaces before capture
                    run()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                run()
            self.graphs.append(graph)
            keep(graph.replay)
        torch.cuda.synchronize()
        k, v = self.cache.k, self.cache.v
        assert isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
        k.zero_()
        v.zero_()

    def bucket_for(self, highest_row: int) -> int:
        """The bucket (rows run) of a step whose highest decoding row is ``highest_row``."""
        return self.buckets[bisect.bisect_right(self.buckets, highest_row)]

    def _check(self, rows: Sequence[int], token_ids: Sequence[int], positions: Sequence[int]) -> None:
        if not rows or not (len(rows) == len(token_ids) == len(positions)) or len(set(rows)) != len(rows):
            raise ValueError(f"decode needs distinct rows, one token and position each: {rows}")
        if min(rows) < 0 or max(rows) >= self.rows or min(positions) < 0:
            raise ValueError(f"rows {rows} or positions {positions} out of range (rows: {self.rows})")
        if max(positions) >= self.capacity_tokens:
            raise ValueError(f"position {max(positions)} is past the capacity of {self.capacity_tokens}")

    @torch.inference_mode()
    def decode(self, rows: Sequence[int], token_ids: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """One token for each of ``rows`` at its position; fp32 logits ``[len(rows), V]`` (device).

        Replays the smallest bucket holding ``max(rows)``; its other rows run as fillers.

        Raises:
            ValueError: A row is repeated or out of range, or a position is past the capacity.
        """
        self._check(rows, token_ids, positions)
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

    @torch.inference_mode()
    def mixed(
        self, rows: Sequence[int], token_ids: Sequence[int], positions: Sequence[int], chunks: Sequence[Chunk]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`BatchedTorchStep.mixed` as one replay: the smallest bucket and chunk shape holding it.

        Raises:
            ValueError: A row is repeated or out of range, a position is past the capacity, or the
                chunks fit no shape (or there are none).
        """
        if rows:
            self._check(rows, token_ids, positions)
        n = self.bucket_for(max(rows)) if rows else 0
        packing = next((p for p in self.packings if p.n == n and p.holds(chunks)), None)
        if not chunks or packing is None:  # a step without chunks is a decode step: decode()
            raise ValueError(
                f"chunks of {[len(c.tokens) for c in chunks]} tokens fit no shape of {self.chunk_shapes}"
            )
        host = self.mixed_inputs.claim()
        host[:INPUT_ROWS, : packing.columns] = pack(
            packing, rows, token_ids, positions, chunks, self.filler_position
        ).numpy()
        host[INPUT_ROWS, : len(rows)] = rows
        host[INPUT_ROWS, len(rows) : len(rows) + len(chunks)] = range(packing.n, packing.n + len(chunks))
        self.mixed_inputs.send()
        self.mixeds[packing]()
        picked = self.mixed_logits.index_select(
            0, self.mixed_inputs.tensor[INPUT_ROWS, : len(rows) + len(chunks)]
        )
        return picked[: len(rows)], picked[len(rows) :]


def load_batched_step(
    model_dir: Path,
    rows: int,
    capacity_tokens: int,
    device: torch.device | str,
    dtype: torch.dtype,
    graphs: bool,
    prefill_chunk: int = 0,
) -> BatchedTorchStep:
    """Load the model in ``model_dir`` as a batched step: CUDA graphs if ``graphs``, else eager.

    ``prefill_chunk``: prompt tokens a step carries beside the decode tokens (0: prompts are
    prefilled between steps).

    Raises:
        ValueError: ``graphs`` on a device other than CUDA.
        ModelNotFound: The folder, its config or its weights are missing.
        CorruptModel: The weights are unreadable, damaged or do not match the config.
    """
    if graphs and torch.device(device).type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device, not {device}; set cuda_graph off")
    model = load_decoder(model_dir, dtype=dtype, device=device)
    if graphs:
        return BatchedGraphStep(model, rows, capacity_tokens, GraphOptions(capture=True), prefill_chunk)
    return BatchedTorchStep(model, rows, capacity_tokens, prefill_chunk)
