# ruff: noqa: ANN001, ANN202
"""Triton kernels of the fused batch-1 decode step (:mod:`engines.fused_decode`).

A decode step of a small model is bound by kernel launches, not by bytes: SmolLM2-135M reads
its 270 MB of fp16 weights in ~0.06 ms, yet ~400 kernels a step (Inductor's fusions) take
~1 ms. These kernels do a Llama layer in five launches:

- :func:`gemv` ``norm``: RMSNorm of the residual stream, then the fused q/k/v product (or,
  with ``gated``, the gate/up product followed by ``silu(gate) * up``);
- :func:`attention`: RoPE of the query and the new key, the new key and value written to the
  cache at the step's position, and flash-decoding over the cached slots before it, split
  across programs (each writes its max, sum and weighted values);
- :func:`gemv` ``combine`` + ``residual``: the splits combined, the o-projection, and the
  result added to the residual stream in place;
- :func:`gemv` ``residual``: the down-projection added to the residual stream in place.

The step's position is read on the device (``pos_ptr``), so one CUDA graph serves every
position of its KV window, and programs whose slots lie past the position do no work.

Rounding follows the eager model: every product's result is rounded to the model's dtype
before it is used (as a cuBLAS product's fp16 output would be); sums run in fp32.
Importing this module needs Triton; :mod:`engines.fused_decode` imports it only when Triton
is importable (on CUDA, or on the CPU under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

PROLOGUE_NONE, PROLOGUE_NORM, PROLOGUE_COMBINE = 0, 1, 2
EPILOGUE_STORE, EPILOGUE_RESIDUAL, EPILOGUE_GATED = 0, 1, 2


@triton.jit
def _gemv_kernel(
    x_ptr,
    norm_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    n_rows,
    n_cols,
    eps,
    splits,
    heads,
    PROLOGUE: tl.constexpr,
    EPILOGUE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    ks = tl.arange(0, BLOCK_K)
    dtype = w_ptr.dtype.element_ty
    inv_rms = 0.0
    if PROLOGUE == 1:  # RMSNorm: the whole row's mean square first (a few KB, from L2)
        squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, n_cols, BLOCK_K):
            cols = k0 + ks
            v = tl.load(x_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            squares += v * v
        inv_rms = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / n_cols + eps)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, n_cols, BLOCK_K):
        cols = k0 + ks
        col_mask = cols < n_cols
        if PROLOGUE == 2:  # attention splits -> one output per column (head h, dim d)
            head = cols // HEAD_DIM
            top = tl.full([BLOCK_K], float("-inf"), tl.float32)
            for s in range(0, splits):
                m = tl.load(part_m_ptr + s * heads + head, mask=col_mask, other=float("-inf"))
                top = tl.maximum(top, m)
            num = tl.zeros([BLOCK_K], dtype=tl.float32)
            den = tl.zeros([BLOCK_K], dtype=tl.float32)
            for s in range(0, splits):
                m = tl.load(part_m_ptr + s * heads + head, mask=col_mask, other=float("-inf"))
                weight = tl.where(m > float("-inf"), tl.exp(m - top), 0.0)
                part = tl.load(part_acc_ptr + s * n_cols + cols, mask=col_mask, other=0.0)
                total = tl.load(part_l_ptr + s * heads + head, mask=col_mask, other=0.0)
                num += tl.where(weight > 0.0, weight * part, 0.0)
                den += tl.where(weight > 0.0, weight * total, 0.0)
            xf = tl.where(col_mask, num / tl.where(den > 0.0, den, 1.0), 0.0).to(dtype).to(tl.float32)
        else:
            xf = tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
            if PROLOGUE == 1:
                scale = tl.load(norm_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
                xf = (xf * inv_rms * scale).to(dtype).to(tl.float32)
        mask = row_mask[:, None] & col_mask[None, :]
        w = tl.load(w_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
        acc += w.to(tl.float32) * xf[None, :]
        if EPILOGUE == 2:  # the up rows sit n_rows below the gate rows
            w_up = tl.load(w_ptr + (rows[:, None] + n_rows) * n_cols + cols[None, :], mask=mask, other=0.0)
            acc_up += w_up.to(tl.float32) * xf[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(bias_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    y = y.to(dtype).to(tl.float32)
    if EPILOGUE == 1:
        old = tl.load(out_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
        y = old + y
    if EPILOGUE == 2:
        up = tl.sum(acc_up, axis=1)
        if HAS_BIAS:
            up += tl.load(bias_ptr + rows + n_rows, mask=row_mask, other=0.0).to(tl.float32)
        up = up.to(dtype).to(tl.float32)
        gate = (y / (1.0 + tl.exp(-y))).to(dtype).to(tl.float32)
        y = gate * up
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _attention_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    k_ptr,
    v_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    cache_slots,
    chunk,
    scale,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    IEEE: tl.constexpr,
):
    kv = tl.program_id(0)
    split = tl.program_id(1)
    half: tl.constexpr = HEAD_DIM // 2
    dtype = k_ptr.dtype.element_ty
    pos = tl.load(pos_ptr).to(tl.int32)
    g = tl.arange(0, GROUP_PAD)
    g_mask = g < GROUP
    heads = kv * GROUP + g  # query head kv*GROUP+i uses KV head kv
    d = tl.arange(0, half)
    c1 = tl.load(cos_ptr + pos * HEAD_DIM + d).to(tl.float32)
    c2 = tl.load(cos_ptr + pos * HEAD_DIM + half + d).to(tl.float32)
    s1 = tl.load(sin_ptr + pos * HEAD_DIM + d).to(tl.float32)
    s2 = tl.load(sin_ptr + pos * HEAD_DIM + half + d).to(tl.float32)
    q_at = qkv_ptr + heads[:, None] * HEAD_DIM + d[None, :]
    q1 = tl.load(q_at, mask=g_mask[:, None], other=0.0).to(tl.float32)
    q2 = tl.load(q_at + half, mask=g_mask[:, None], other=0.0).to(tl.float32)
    # RoPE (x * cos + rotate_half(x) * sin on the halves), then the scale, as the eager model
    r1 = ((q1 * c1[None, :] - q2 * s1[None, :]).to(dtype).to(tl.float32) * scale).to(dtype)
    r2 = ((q2 * c2[None, :] + q1 * s2[None, :]).to(dtype).to(tl.float32) * scale).to(dtype)
    k_base = k_ptr + kv * cache_slots * HEAD_DIM
    v_base = v_ptr + kv * cache_slots * HEAD_DIM
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc1 = tl.zeros([GROUP_PAD, half], dtype=tl.float32)
    acc2 = tl.zeros([GROUP_PAD, half], dtype=tl.float32)
    start = split * chunk
    end = tl.minimum(start + chunk, pos)  # cached slots before this step's position
    for s0 in range(start, end, BLOCK_S):
        slots = s0 + tl.arange(0, BLOCK_S)
        s_mask = slots < end
        at = slots[:, None] * HEAD_DIM + d[None, :]
        k1 = tl.load(k_base + at, mask=s_mask[:, None], other=0.0)
        k2 = tl.load(k_base + at + half, mask=s_mask[:, None], other=0.0)
        if IEEE:
            scores = tl.dot(r1, tl.trans(k1), input_precision="ieee")
            scores += tl.dot(r2, tl.trans(k2), input_precision="ieee")
        else:
            scores = tl.dot(r1, tl.trans(k1)) + tl.dot(r2, tl.trans(k2))
        scores = tl.where(s_mask[None, :], scores.to(dtype).to(tl.float32), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v1 = tl.load(v_base + at, mask=s_mask[:, None], other=0.0)
        v2 = tl.load(v_base + at + half, mask=s_mask[:, None], other=0.0)
        if IEEE:
            acc1 = acc1 * alpha[:, None] + tl.dot(p.to(dtype), v1, input_precision="ieee")
            acc2 = acc2 * alpha[:, None] + tl.dot(p.to(dtype), v2, input_precision="ieee")
        else:
            acc1 = acc1 * alpha[:, None] + tl.dot(p.to(dtype), v1)
            acc2 = acc2 * alpha[:, None] + tl.dot(p.to(dtype), v2)
        m_i = m_new
    if split == 0:  # this step's own key and value: from the projection, then into the cache
        k_at = qkv_ptr + (HEADS + kv) * HEAD_DIM + d
        v_at = qkv_ptr + (HEADS + KV_HEADS + kv) * HEAD_DIM + d
        k1_new = tl.load(k_at).to(tl.float32)
        k2_new = tl.load(k_at + half).to(tl.float32)
        kn1 = (k1_new * c1 - k2_new * s1).to(dtype)
        kn2 = (k2_new * c2 + k1_new * s2).to(dtype)
        vn1 = tl.load(v_at)
        vn2 = tl.load(v_at + half)
        tl.store(k_base + pos * HEAD_DIM + d, kn1)
        tl.store(k_base + pos * HEAD_DIM + half + d, kn2)
        tl.store(v_base + pos * HEAD_DIM + d, vn1)
        tl.store(v_base + pos * HEAD_DIM + half + d, vn2)
        own = tl.sum(r1.to(tl.float32) * kn1.to(tl.float32)[None, :], axis=1)
        own += tl.sum(r2.to(tl.float32) * kn2.to(tl.float32)[None, :], axis=1)
        own = own.to(dtype).to(tl.float32)
        m_new = tl.maximum(m_i, own)
        alpha = tl.exp(m_i - m_new)
        p_own = tl.exp(own - m_new)
        l_i = l_i * alpha + p_own
        p_own = p_own.to(dtype).to(tl.float32)
        acc1 = acc1 * alpha[:, None] + p_own[:, None] * vn1.to(tl.float32)[None, :]
        acc2 = acc2 * alpha[:, None] + p_own[:, None] * vn2.to(tl.float32)[None, :]
        m_i = m_new
    tl.store(part_m_ptr + split * HEADS + heads, m_i, mask=g_mask)
    tl.store(part_l_ptr + split * HEADS + heads, l_i, mask=g_mask)
    acc_at = part_acc_ptr + split * HEADS * HEAD_DIM + heads[:, None] * HEAD_DIM + d[None, :]
    tl.store(acc_at, acc1, mask=g_mask[:, None])
    tl.store(acc_at + half, acc2, mask=g_mask[:, None])


# Tiles (rows, columns, warps) the autotuner tries per product shape on CUDA (``tune``): the H100
# timer (bench/decode_kernels.py) found the best of 16 between (1, 256, 2) and (8, 512, 4) for
# SmolLM2's products. Not yet run on a GPU (no device time was left): off by default.
TUNED_TILES = [(1, 256, 2), (1, 512, 4), (2, 256, 2), (2, 512, 4), (4, 256, 4), (4, 512, 8), (8, 512, 4)]
TUNED_TILES += [(8, 512, 8), (16, 256, 8)]
_gemv_tuned = triton.autotune(
    configs=[triton.Config({"BLOCK_N": r, "BLOCK_K": c}, num_warps=w) for r, c, w in TUNED_TILES],
    key=["n_rows", "n_cols", "PROLOGUE", "EPILOGUE"],
    restore_value=["out_ptr"],  # tuning runs add into the residual stream: put it back
)(_gemv_kernel)


def block_rows(n_rows: int, programs: int) -> int:
    """Rows per program: the most (up to 16) that still give ``programs`` programs or more."""
    for rows in (16, 8, 4, 2):
        if -(-n_rows // rows) >= programs:
            return rows
    return 1


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    norm: tuple[torch.Tensor, float] | None = None,
    splits: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int] | None = None,
    residual: bool = False,
    gated: bool = False,
    programs: int = 264,
    tile: tuple[int, int, int] | None = None,
    tune: bool = False,
) -> None:
    """``out = weight @ x`` for one token, with an optional prologue and epilogue.

    Args:
        x: The input vector ``[K]`` (ignored with ``splits``).
        weight: ``[N, K]`` (``[2N, K]``, gate rows then up rows, with ``gated``).
        out: ``[N]``: written, or added to with ``residual``.
        bias: ``[N]`` (``[2N]`` with ``gated``) added to the product.
        norm: ``(scale, eps)``: RMSNorm ``x`` first (in fp32, rounded to the weight's dtype).
        splits: ``(max, sum, weighted values, splits, heads)`` of :func:`attention`: the input
            is their combination (``K = heads * head_dim``).
        residual: Add the product to ``out`` (the residual stream) instead of storing it.
        gated: ``out = silu(gate) * up``.
        programs: How many programs to aim for (two per multiprocessor hides load latency).
        tile: ``(rows, columns, warps)`` per program instead of the rule above (for tuning).
        tune: Time :data:`TUNED_TILES` at the first call of each shape and keep the fastest
            (CUDA only: Triton's autotuner; ``tile`` and ``programs`` are then ignored).
    """
    n_rows = weight.shape[0] // (2 if gated else 1)
    n_cols = weight.shape[1]
    rows = block_rows(n_rows, programs)
    cols, warps = max(16, min(2048 // rows, 512, triton.next_power_of_2(n_cols))), 4
    if tile is not None:
        rows, cols, warps = tile
    prologue = PROLOGUE_COMBINE if splits else PROLOGUE_NORM if norm else PROLOGUE_NONE
    epilogue = EPILOGUE_GATED if gated else EPILOGUE_RESIDUAL if residual else EPILOGUE_STORE
    part_m, part_l, part_acc, n_splits, heads = splits if splits else (x, x, x, 0, 1)
    scale, eps = norm if norm else (x, 0.0)
    args = (
        x, scale, weight, bias if bias is not None else weight, out, part_m, part_l, part_acc,
        n_rows, n_cols, eps, n_splits, heads,
    )  # fmt: skip
    flags = dict(PROLOGUE=prologue, EPILOGUE=epilogue, HAS_BIAS=bias is not None, HEAD_DIM=n_cols // heads)
    if tune and tile is None:
        _gemv_tuned[lambda meta: (triton.cdiv(n_rows, meta["BLOCK_N"]),)](*args, **flags)
        return
    _gemv_kernel[(triton.cdiv(n_rows, rows),)](*args, **flags, BLOCK_N=rows, BLOCK_K=cols, num_warps=warps)


def attention(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    partials: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    heads: int,
    kv_heads: int,
    scale: float,
    window: int,
    splits: int,
    block_slots: int = 64,
) -> None:
    """Attend one token over its layer's cache; leaves ``splits`` partial results in ``partials``.

    ``qkv``: the fused projection ``[(heads + 2 kv_heads) * head_dim]`` (not yet rotated);
    ``cos``/``sin``: ``[slots, head_dim]`` tables; ``position``: ``[1]`` int64 on the device;
    ``k_cache``/``v_cache``: ``[1, kv_heads, slots, head_dim]``. Slots ``< window`` are covered.
    """
    head_dim = k_cache.shape[-1]
    chunk = -(-window // (splits * block_slots)) * block_slots
    group = heads // kv_heads
    part_m, part_l, part_acc = partials
    _attention_kernel[(kv_heads, splits)](
        qkv, cos, sin, position, k_cache, v_cache, part_m, part_l, part_acc,
        k_cache.shape[2], chunk, scale,
        HEADS=heads, KV_HEADS=kv_heads, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, BLOCK_S=block_slots, IEEE=k_cache.dtype == torch.float32,
        num_warps=4,
    )  # fmt: skip
