"""Chunked prefill fused into the decode step: running sequences and newcomers' prompts in one forward.

A mixed step packs ``n + slots * width`` tokens:

- the first ``n`` are one token for each of rows ``0..n-1`` (the decode step as
  :class:`~engines.serving.batched_step.BatchedTorchStep` runs it: a row not decoding runs as
  a filler at the last slot, which a sequence rewrites before it can read it);
- then ``slots`` chunks of ``width`` tokens, each a run of one newcomer's prompt on its row at
  consecutive positions (pads at the filler slot of that row; a chunk slot left empty runs
  on row 0 at the filler slot).

Every product (q/k/v, o, gate/up, down) runs once over all of them, so a newcomer's prompt
costs the running sequences one step a little longer, not a forward of its own between
steps (Sarathi-Serve's and vLLM's chunked prefill). Keys and values are written first, then
attention runs in two parts: the decode tokens over rows ``0..n-1``, each chunk over its own
row (its earlier chunks and cached prefix included). Logits come out only for the decode
tokens and each chunk's last prompt token (``picks``).

The shapes depend only on ``(n, slots, width)``, so the same function runs eagerly at exact
sizes and inside CUDA graphs at bucketed ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from models.decoder import Block, KVCache
from models.decoder import Decoder as DecoderModel
from models.layers import attention_mask, grouped_attention

CHUNK_TOKENS = (64, 256, 1024)  # prompt tokens a step's chunk part holds, pads included
CHUNK_SLOTS = (1, 2, 4, 8, 16)  # prompts it advances (the tokens split evenly among them)


def chunk_shapes(budget: int) -> list[tuple[int, int]]:
    """The ``(slots, width)`` a step's prompt part may take: ``slots * width`` of :data:`CHUNK_TOKENS`.

    Sizes up to ``budget`` (``budget`` itself if it is under all of them); widths of 4 tokens or
    more. ``budget`` 0: none (prompts are prefilled between steps).
    """
    if budget <= 0:
        return []
    sizes = [t for t in CHUNK_TOKENS if t <= budget] or [budget]
    return [(s, t // s) for t in sizes for s in CHUNK_SLOTS if t // s >= 4]


def plan_chunks(
    remaining: Sequence[int], shapes: Sequence[tuple[int, int]]
) -> tuple[tuple[int, int], list[int]]:
    """The shape and each chunk's length for prompts with ``remaining`` tokens left, first come first.

    The shape that completes the most prompts (each one completed is a first token, so a burst
    of newcomers gets its first tokens soonest), then the one that advances the most prompt
    tokens, then the smallest. The first prompt is always in the step, so a long one advances
    every step however many short ones complete beside it.
    """
    best: tuple[tuple[int, int, int], tuple[int, int], list[int]] | None = None
    for slots, width in shapes:
        lengths = [min(r, width) for r in remaining[:slots]]
        done = sum(r <= width for r in remaining[:slots])
        score = (done, sum(lengths), -slots * width)
        if best is None or score > best[0]:
            best = (score, (slots, width), lengths)
    if best is None:
        raise ValueError("no chunk shapes: chunked prefill is off")
    return best[1], best[2]


@dataclass(frozen=True)
class Chunk:
    """A run of one prompt: ``tokens`` at positions ``start...`` of ``row``."""

    row: int
    tokens: Sequence[int]
    start: int


@dataclass(frozen=True)
class Packing:
    """Where a mixed step's tokens go: ``n`` decode rows, ``slots`` chunks of ``width`` tokens."""

    n: int
    slots: int
    width: int

    @property
    def tokens(self) -> int:
        """Tokens in the step, pads included."""
        return self.n + self.slots * self.width

    @property
    def picks(self) -> int:
        """Logit rows the step returns: every decode row, then each chunk's last token."""
        return self.n + self.slots


def pack(
    packing: Packing,
    rows: Sequence[int],
    token_ids: Sequence[int],
    positions: Sequence[int],
    chunks: Sequence[Chunk],
    filler_position: int,
) -> torch.Tensor:
    """The host-side inputs of a step: int64 ``[4, tokens]`` (ids, positions, rows, picks).

    Row 3 holds the ``picks`` in its first ``packing.picks`` columns: decode rows ``0..n-1``
    (the caller gathers the ones decoding), then the index of each chunk's last token.

    Raises:
        ValueError: The decode rows or chunks do not fit ``packing``.
    """
    if rows and max(rows) >= packing.n:
        raise ValueError(f"decode row {max(rows)} does not fit a step of {packing.n} decode rows")
    if len(chunks) > packing.slots or any(len(c.tokens) > packing.width or not c.tokens for c in chunks):
        raise ValueError(f"chunks of {[len(c.tokens) for c in chunks]} tokens do not fit {packing}")
    out = torch.zeros((4, packing.tokens), dtype=torch.long)
    ids, pos, row_of, picks = out
    pos[:] = filler_position
    row_of[: packing.n] = torch.arange(packing.n)
    for row, token, position in zip(rows, token_ids, positions, strict=True):
        ids[row], pos[row] = token, position
    picks[: packing.n] = torch.arange(packing.n)
    for slot in range(packing.slots):
        first = packing.n + slot * packing.width
        if slot < len(chunks):
            chunk = chunks[slot]
            count = len(chunk.tokens)
            ids[first : first + count] = torch.tensor(list(chunk.tokens))
            pos[first : first + count] = torch.arange(chunk.start, chunk.start + count)
            row_of[first : first + packing.width] = chunk.row
            picks[packing.n + slot] = first + count - 1
        else:
            picks[packing.n + slot] = first
    return out


def mixed_forward(
    model: DecoderModel, cache: KVCache, packed: torch.Tensor, packing: Packing
) -> torch.Tensor:
    """Run a packed step (see :func:`pack`) and write its keys and values; fp32 logits ``[picks, V]``."""
    n, slots, width = packing.n, packing.slots, packing.width
    ids, positions, rows = packed[:3, : packing.tokens]
    picks = packed[3, : packing.picks]
    config = model.config
    kv_heads, head_dim = config.num_kv_heads, config.head_dim
    capacity = cache.capacity_tokens
    x = model.embed(ids)[None]  # [1, tokens, hidden]
    ropes = {k: r(positions[None], x.dtype) for k, r in model.rope.items()}
    slot_ids = torch.arange(capacity, device=positions.device)
    decode_masks = {
        k: attention_mask(slot_ids, positions[:n, None], w)[:, None] for k, w in model.windows.items()
    }
    chunk_positions = positions[n:].view(slots, width)
    chunk_masks = {k: attention_mask(slot_ids, chunk_positions, w)[:, None] for k, w in model.windows.items()}
    chunk_rows = rows[n::width] if slots else rows[:0]  # each chunk's first token: its row
    # Where each token's key goes in a layer's cache viewed as [rows * kv_heads * slots, head_dim].
    heads = torch.arange(kv_heads, device=rows.device)
    flat = ((rows[:, None] * kv_heads + heads) * capacity + positions[:, None]).view(-1)
    for i, layer in enumerate(model.layers):
        assert isinstance(layer, Block)
        attn = layer.self_attn
        cos, sin = ropes[model.rope_key(layer)]
        q, k, v = attn.rotated(layer.input_layernorm(x), cos, sin)  # [1, heads, tokens, D]
        k_cache, v_cache = cache.k[i], cache.v[i]
        for new, layer_cache in ((k, k_cache), (v, v_cache)):
            written = new[0].transpose(0, 1).reshape(-1, head_dim).to(layer_cache.dtype)
            layer_cache.view(-1, head_dim).index_copy_(0, flat, written)
        parts = []
        if n:
            queries = q[0, :, :n].transpose(0, 1)[:, :, None]  # [n, heads, 1, D]
            keys, values = k_cache[:n].to(q.dtype), v_cache[:n].to(q.dtype)
            out = grouped_attention(
                queries, keys, values, decode_masks[layer.layer_type], attn.scale, attn.logit_cap
            )
            parts.append(out.reshape(n, -1))
        if slots:
            queries = q[0, :, n:].unflatten(1, (slots, width)).transpose(0, 1)  # [slots, heads, width, D]
            keys = k_cache.index_select(0, chunk_rows).to(q.dtype)
            values = v_cache.index_select(0, chunk_rows).to(q.dtype)
            out = grouped_attention(
                queries, keys, values, chunk_masks[layer.layer_type], attn.scale, attn.logit_cap
            )
            parts.append(out.transpose(1, 2).reshape(slots * width, -1))
        attended = attn.o_proj(torch.cat(parts)[None])
        x = layer.add_feed_forward(layer.add_attention(x, attended))
    return model.logits(model.norm(x[0].index_select(0, picks)))
