"""Chunked prefill fused into the decode step: running sequences and newcomers' prompts in one forward.

A mixed step packs ``n + size`` tokens:

- the first ``n`` are one token for each of rows ``0..n-1`` (the decode step as
  :class:`~engines.serving.batched_step.BatchedTorchStep` runs it: a row not decoding runs as
  a filler at the last slot, which a sequence rewrites before it can read it);
- then up to ``slots`` chunks back to back, each a run of one newcomer's prompt on its row at
  consecutive positions, ``width`` tokens at most, ``size`` in all (pads after the last chunk
  write row 0's filler slot).

Every product (q/k/v, o, gate/up, down) runs once over all of them, so a newcomer's prompt
costs the running sequences one step a little longer, not a forward of its own between
steps (Sarathi-Serve's and vLLM's chunked prefill), and the products carry no pads between
chunks: a 129-token prompt takes 129 of the step's tokens, not a 256-token slot. Keys and
values are written first, then attention runs in two parts: the decode tokens over rows
``0..n-1``, and the chunks laid out as ``slots x width`` (gathered from the packed tokens, each
chunk over its own row: its earlier chunks and cached prefix included; the outputs gathered
back). Logits come out only for the decode tokens and each chunk's last token (``picks``).

The shapes depend only on ``(n, size, slots, width)``, so the same function runs eagerly at
exact sizes and inside CUDA graphs at bucketed ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from models.decoder import Block, KVCache
from models.decoder import Decoder as DecoderModel
from models.layers import attention_mask, grouped_attention

CHUNK_TOKENS = (64, 256, 1024)  # prompt tokens a step's products carry, pads after the chunks included
CHUNK_SLOTS = (1, 2, 4, 8, 16)  # prompts a step may advance
# A chunk may hold this much more than an even share of the tokens, so a burst of prompts a little
# longer than ``size / slots`` completes ``slots - 1`` of them a step, not ``slots / 2`` (the
# attention part then runs over 1.25 x ``size`` query rows, pads included).
WIDTH_SLACK = 1.25
INPUT_ROWS = 8  # rows of :func:`pack`'s output


@dataclass(frozen=True)
class ChunkShape:
    """What a step's prompt part may hold: ``slots`` chunks of at most ``width`` tokens, ``size`` in all."""

    size: int
    slots: int
    width: int


def chunk_shapes(budget: int) -> list[ChunkShape]:
    """The shapes a step's prompt part may take, ``size`` from :data:`CHUNK_TOKENS`, cheapest first.

    Sizes up to ``budget`` (``budget`` itself if it is under all of them); each with every
    :data:`CHUNK_SLOTS` whose width (``WIDTH_SLACK`` x an even share, at most ``size``) is 4
    tokens or more. ``budget`` 0: none (prompts are prefilled between steps).
    """
    if budget <= 0:
        return []
    sizes = [t for t in CHUNK_TOKENS if t <= budget] or [budget]
    shapes = [ChunkShape(t, s, min(t, -(-int(t * WIDTH_SLACK) // s))) for t in sizes for s in CHUNK_SLOTS]
    return [s for s in shapes if s.width >= 4]


def fill(remaining: Sequence[int], shape: ChunkShape) -> list[int]:
    """Each chunk's length when prompts with ``remaining`` tokens fill ``shape``, first come first."""
    lengths: list[int] = []
    left = shape.size
    for r in remaining[: shape.slots]:
        length = min(r, shape.width, left)
        if length <= 0:
            break
        lengths.append(length)
        left -= length
    return lengths


def plan_chunks(remaining: Sequence[int], shapes: Sequence[ChunkShape]) -> tuple[ChunkShape, list[int]]:
    """The shape and each chunk's length for prompts with ``remaining`` tokens left, first come first.

    The shape that completes the most prompts (each one completed is a first token, so a burst
    of newcomers gets its first tokens soonest), then the one that advances the most prompt
    tokens, then the cheapest. The first prompt is always in the step, so a long one advances
    every step however many short ones complete beside it; the last chunk may be the start of
    a prompt that the next step completes.

    Raises:
        ValueError: No shapes (chunked prefill is off).
    """
    best: tuple[tuple[int, int, int, int], ChunkShape, list[int]] | None = None
    for shape in shapes:
        lengths = fill(remaining, shape)
        done = sum(length == r for length, r in zip(lengths, remaining, strict=False))
        score = (done, sum(lengths), -shape.size, -shape.slots * shape.width)
        if best is None or score > best[0]:
            best = (score, shape, lengths)
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
    """Where a mixed step's tokens go: ``n`` decode rows, then chunks as ``shape`` holds them."""

    n: int
    shape: ChunkShape

    @property
    def tokens(self) -> int:
        """Tokens in the step's products, pads included."""
        return self.n + self.shape.size

    @property
    def picks(self) -> int:
        """Logit rows the step returns: every decode row, then each chunk's last token."""
        return self.n + self.shape.slots

    @property
    def columns(self) -> int:
        """Columns of :func:`pack`'s output."""
        return max(self.tokens, self.shape.slots * self.shape.width, self.picks)

    def holds(self, chunks: Sequence[Chunk]) -> bool:
        """Whether ``chunks`` fit the shape."""
        shape = self.shape
        return (
            len(chunks) <= shape.slots
            and sum(len(c.tokens) for c in chunks) <= shape.size
            and all(0 < len(c.tokens) <= shape.width for c in chunks)
        )


def pack(
    packing: Packing,
    rows: Sequence[int],
    token_ids: Sequence[int],
    positions: Sequence[int],
    chunks: Sequence[Chunk],
    filler_position: int,
) -> torch.Tensor:
    """The host-side inputs of a step: int64 ``[INPUT_ROWS, packing.columns]``.

    Rows: 0-2 each product token's id, position and cache row; 3 the ``picks`` (decode rows
    ``0..n-1``, which the caller gathers from, then the index of each chunk's last token); then
    the attention layout of the chunks, ``slots x width``: 4 the packed chunk token at each of
    its places (pads: any), 5 each packed chunk token's place, 6 the position at each place
    (pads: the filler), 7 each slot's cache row.

    Raises:
        ValueError: The decode rows or chunks do not fit ``packing``.
    """
    if rows and max(rows) >= packing.n:
        raise ValueError(f"decode row {max(rows)} does not fit a step of {packing.n} decode rows")
    if not packing.holds(chunks):
        raise ValueError(f"chunks of {[len(c.tokens) for c in chunks]} tokens do not fit {packing}")
    n, width = packing.n, packing.shape.width
    out = torch.zeros((INPUT_ROWS, packing.columns), dtype=torch.long)
    ids, pos, row_of, picks, gather, place, at, slot_rows = out
    pos[:] = filler_position
    at[:] = filler_position
    row_of[:n] = torch.arange(n)
    for row, token, position in zip(rows, token_ids, positions, strict=True):
        ids[row], pos[row] = token, position
    picks[:n] = torch.arange(n)
    picks[n : packing.picks] = n  # empty slots: any token
    packed = 0
    for slot, chunk in enumerate(chunks):
        count, first, place_first = len(chunk.tokens), n + packed, slot * width
        chunk_positions = torch.arange(chunk.start, chunk.start + count)
        ids[first : first + count] = torch.tensor(list(chunk.tokens))
        pos[first : first + count] = chunk_positions
        row_of[first : first + count] = chunk.row
        picks[n + slot] = first + count - 1
        gather[place_first : place_first + count] = torch.arange(packed, packed + count)
        place[packed : packed + count] = torch.arange(place_first, place_first + count)
        at[place_first : place_first + count] = chunk_positions
        slot_rows[slot] = chunk.row
        packed += count
    return out


def mixed_forward(
    model: DecoderModel, cache: KVCache, packed: torch.Tensor, packing: Packing
) -> torch.Tensor:
    """Run a packed step (see :func:`pack`) and write its keys and values; fp32 logits ``[picks, V]``."""
    n, slots, width = packing.n, packing.shape.slots, packing.shape.width
    places = slots * width
    ids, positions, rows = packed[:3, : packing.tokens]
    picks = packed[3, : packing.picks]
    gather, place = packed[4, :places], packed[5, : packing.shape.size]
    chunk_positions, chunk_rows = packed[6, :places].view(slots, width), packed[7, :slots]
    config = model.config
    kv_heads, head_dim = config.num_kv_heads, config.head_dim
    capacity = cache.capacity_tokens
    x = model.embed(ids)[None]  # [1, tokens, hidden]
    ropes = {k: r(positions[None], x.dtype) for k, r in model.rope.items()}
    slot_ids = torch.arange(capacity, device=positions.device)
    decode_masks = {
        k: attention_mask(slot_ids, positions[:n, None], w)[:, None] for k, w in model.windows.items()
    }
    chunk_masks = {k: attention_mask(slot_ids, chunk_positions, w)[:, None] for k, w in model.windows.items()}
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
            laid_out = q[0, :, n:].index_select(1, gather)  # [heads, slots * width, D]
            queries = laid_out.unflatten(1, (slots, width)).transpose(0, 1)  # [slots, heads, width, D]
            keys = k_cache.index_select(0, chunk_rows).to(q.dtype)
            values = v_cache.index_select(0, chunk_rows).to(q.dtype)
            out = grouped_attention(
                queries, keys, values, chunk_masks[layer.layer_type], attn.scale, attn.logit_cap
            )
            parts.append(out.transpose(1, 2).reshape(places, -1).index_select(0, place))
        attended = attn.o_proj(torch.cat(parts)[None])
        x = layer.add_feed_forward(layer.add_attention(x, attended))
    return model.logits(model.norm(x[0].index_select(0, picks)))
