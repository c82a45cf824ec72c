"""The eager batched step: the ``models`` decoder over the rows of one KV cache.

:class:`~engines.serving.batching.BatchScheduler` runs it (or its CUDA-graph variant,
:class:`~engines.serving.batching_graph.BatchedGraphStep`): a row per sequence slot, prompts
prefilled on their row, one decode step for every running row at its own position.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engines.serving.mixed_step import Chunk, ChunkShape, Packing, chunk_shapes, mixed_forward, pack
from models.decoder import Decoder as DecoderModel
from models.decoder import KVCache


class BatchedTorchStep:
    """The ``models`` decoder over the rows of one KV cache ``[layers, rows, heads, capacity, dim]``.

    ``prefill_chunk``: prompt tokens a step may carry beside the decode tokens (:meth:`mixed`);
    0, or a longrope model, prefills prompts between steps instead (``chunk_shapes`` empty).
    """

    def __init__(self, model: DecoderModel, rows: int, capacity_tokens: int, prefill_chunk: int = 0) -> None:
        param = next(model.parameters())
        self.model = model
        self.rows = rows
        self.capacity_tokens = capacity_tokens
        self.device = param.device
        self.cache = KVCache.allocate(
            model.config, capacity_tokens, batch=rows, dtype=param.dtype, device=param.device
        )
        self.name = f"pytorch-{self.device.type} batched x{rows}"
        # A mixed step packs many sequences, so longrope (factors chosen by one sequence's
        # length) cannot run in one; such a model prefills between steps.
        longrope = model.config.rope_switch_tokens is not None
        self.chunk_shapes = [] if longrope else chunk_shapes(prefill_chunk)

    def _rows(self, first: int, count: int) -> KVCache:
        k, v = self.cache.k, self.cache.v
        assert isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
        return KVCache(k[:, first : first + count], v[:, first : first + count])

    @torch.inference_mode()
    def swap_rows(self, a: int, b: int, slots: int) -> None:
        """Exchange the first ``slots`` cached positions of rows ``a`` and ``b``."""
        for cache in (self.cache.k, self.cache.v):
            assert isinstance(cache, torch.Tensor)
            held = cache[:, a, :, :slots].clone()
            cache[:, a, :, :slots] = cache[:, b, :, :slots]
            cache[:, b, :, :slots] = held

    @torch.inference_mode()
    def prefill(self, row: int, token_ids: Sequence[int], start_pos: int) -> torch.Tensor:
        """Write ``token_ids`` at ``start_pos...`` of ``row``; the last token's fp32 logits ``[V]``.

        The same call as a batch-1 step (:class:`~engines.torch_backend.TorchStep`) on the row's
        cache, so a prompt's logits do not depend on what else is running.
        """
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        end = start_pos + len(token_ids)
        positions = torch.arange(start_pos, end, device=self.device)
        return self.model(ids, positions, self._rows(row, 1), kv_len=end, last_only=True)[0, -1]

    @torch.inference_mode()
    def prefill_many(
        self, rows: Sequence[int], token_lists: Sequence[Sequence[int]], starts: Sequence[int]
    ) -> torch.Tensor:
        """Several rows' prompts in one forward; each one's last-token fp32 logits ``[len(rows), V]``.

        Prompts are left-padded to the longest, so each row's last token is the last column;
        pads, and rows up to ``max(rows)`` that are not prefilling, sit at the filler slot (see
        :meth:`decode`). Prompts never reach it (the scheduler keeps them under the capacity).
        """
        count, width = max(rows) + 1, max(len(t) for t in token_lists)
        filler = self.capacity_tokens - 1
        ids = torch.zeros((count, width), dtype=torch.long)
        pos = torch.full((count, width), filler, dtype=torch.long)
        for row, tokens, start in zip(rows, token_lists, starts, strict=True):
            ids[row, width - len(tokens) :] = torch.tensor(list(tokens))
            pos[row, width - len(tokens) :] = torch.arange(start, start + len(tokens))
        logits = self.model(ids.to(self.device), pos.to(self.device), self._rows(0, count), last_only=True)
        return logits[list(rows), -1]

    @torch.inference_mode()
    def decode(self, rows: Sequence[int], token_ids: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """One token for each of ``rows`` at its position; fp32 logits ``[len(rows), V]`` (device).

        The step runs over rows ``0..max(rows)``; rows not decoding write a throw-away key at
        the last slot, which a sequence overwrites before it can read it (a slot is only read
        by queries at or after its own position, and the token there writes it first).
        """
        count = max(rows) + 1
        filler = self.capacity_tokens - 1
        ids = torch.zeros((count, 1), dtype=torch.long)
        pos = torch.full((count, 1), filler, dtype=torch.long)
        ids[list(rows), 0] = torch.tensor(list(token_ids))
        pos[list(rows), 0] = torch.tensor(list(positions))
        kv_len = self.capacity_tokens if count > len(rows) else max(positions) + 1
        logits = self.model(ids.to(self.device), pos.to(self.device), self._rows(0, count), kv_len=kv_len)
        return logits[list(rows), -1]

    @torch.inference_mode()
    def mixed(
        self, rows: Sequence[int], token_ids: Sequence[int], positions: Sequence[int], chunks: Sequence[Chunk]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step for ``rows`` and prompt ``chunks`` in one forward (:mod:`.mixed_step`).

        Returns fp32 logits: ``[len(rows), V]`` for the decoding rows and ``[len(chunks), V]``
        for each chunk's last token (the prompt's next-token logits when it is its last chunk).
        """
        lengths = [len(c.tokens) for c in chunks]
        shape = ChunkShape(sum(lengths), len(chunks), max(lengths, default=0))
        packing = Packing(max(rows) + 1 if rows else 0, shape)
        packed = pack(packing, rows, token_ids, positions, chunks, self.capacity_tokens - 1).to(self.device)
        logits = mixed_forward(self.model, self.cache, packed, packing)
        return logits[list(rows)], logits[packing.n :]
