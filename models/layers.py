"""The decoder's building blocks: RMSNorm, grouped-query attention over a KV cache, the gated MLP.

Each family's difference from the Llama block is a field of :class:`~models.config.DecoderConfig`
read here: ``(1 + w)`` norms (Gemma), per-head q/k norms (Qwen3, Gemma 3), the attention scale
and logit soft-cap (Gemma), biases, fused q/k/v and gate/up weights as stored (Phi-3), the
activation (gelu-tanh for Gemma).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.config import DecoderConfig
from models.rope import apply_rope


def attention_mask(slots: torch.Tensor, positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """Boolean ``[..., T, S]``: True where the query at ``positions[..., t]`` may see ``slots[s]``.

    Causal (``slot <= position``); with a sliding ``window`` only the last ``window`` positions,
    the query's own included (transformers: ``kv_idx > q_idx - sliding_window``).
    """
    visible = slots <= positions[..., None]
    if window is not None:
        visible = visible & (slots > positions[..., None] - window)
    return visible


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap * tanh(x / cap)`` (Gemma 2's attention and final logit soft-capping); ``x`` if no cap."""
    return x if cap is None else torch.tanh(x / cap) * cap


def grouped_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scale: float | None = None,
    logit_cap: float | None = None,
) -> torch.Tensor:
    """``softmax(q k^T * scale) v`` where each KV head serves a contiguous group of query heads.

    Args:
        q: Queries ``[B, H, T, D]``.
        keys: Keys ``[B, KVH, S, D]`` (``H`` a multiple of ``KVH``); not copied per group.
        values: Values ``[B, KVH, S, D]``.
        mask: Boolean ``[B or 1, 1, T, S]``, True where a query may attend.
        scale: Score scale; ``None``: ``D ** -0.5``.
        logit_cap: Soft-cap of the scores (:func:`softcap`), applied before the mask.

    Returns:
        ``[B, H, T, D]``. The softmax runs in fp32.
    """
    b, h, t, d = q.shape
    kv_heads = keys.shape[1]
    group = h // kv_heads
    # Query head j*group+i uses KV head j: fold the group into the rows of one matmul per KV head.
    rows = (q * (d**-0.5 if scale is None else scale)).reshape(b, kv_heads, group * t, d)
    scores = softcap((rows @ keys.transpose(-1, -2)).view(b, kv_heads, group, t, -1), logit_cap)
    scores = torch.where(mask[:, :, None], scores, float("-inf"))  # the same mask for every group
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
    if t == 1 and b == 1:
        # Decode: a matmul of 1-3 rows by the whole cache runs on a few blocks, each walking
        # every position; a product-and-sum spreads the positions over the GPU instead. Not
        # for a batch: its intermediate grows with the rows (~150 MB a layer at 64 rows).
        out = (probs.view(b, kv_heads, group, -1, 1) * values[:, :, None]).sum(dim=-2)
        return out.view(b, h, t, d)
    return (probs.view(b, kv_heads, group * t, -1) @ values).view(b, h, t, d)


def fused_linear(parts: list[nn.Linear]) -> nn.Linear:
    """One Linear whose output is the concatenation of ``parts``' outputs."""
    weight = torch.cat([p.weight for p in parts])
    biases = [p.bias for p in parts]
    with torch.device("meta"):  # no throw-away initialisation; both tensors are replaced below
        fused = nn.Linear(weight.shape[1], weight.shape[0], bias=biases[0] is not None)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if fused.bias is not None:
        fused.bias = nn.Parameter(torch.cat([b for b in biases if b is not None]), requires_grad=False)
    return fused


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, computed in fp32; ``plus_one`` scales by ``1 + w`` (Gemma).

    ``fused`` (set by :meth:`Decoder.fuse`) runs it as one kernel (``F.rms_norm``) instead of
    eight. That kernel applies the weight in fp32 and casts once; Hugging Face's
    ``LlamaRMSNorm`` (the unfused path) casts, then multiplies in the model's dtype, so in
    half precision the two may differ in the last bit. Gemma's norm multiplies in fp32, then casts.
    """

    def __init__(self, dim: int, eps: float, plus_one: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if plus_one else torch.ones(dim))
        self.eps = eps
        self.plus_one = plus_one
        self.fused = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension."""
        if self.fused:
            if self.plus_one:  # 1 + w in fp32: in bf16 it would round w away
                weight = self.weight.float() + 1.0
                return F.rms_norm(x.float(), (x.shape[-1],), weight, self.eps).to(x.dtype)
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.plus_one:
            return (xf * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention that reads and writes its layer of the KV cache.

    ``window``: attend only the last ``window`` positions (a sliding-window layer); the mask
    passed in already says so, the field documents the layer.
    """

    def __init__(self, config: DecoderConfig, window: int | None = None) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.window = window
        self.scale = config.attention_scale
        self.logit_cap = config.attn_logit_softcap
        bias = config.attention_bias
        q_dim, kv_dim = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.qkv_proj: nn.Linear | None = None  # Phi-3's stored layout, or set by fuse()
        if config.fused_projections:
            self.qkv_proj = nn.Linear(config.hidden_size, q_dim + 2 * kv_dim, bias=bias)
        else:
            self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=bias)
            self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=bias)
            self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_out_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, config.norm_plus_one)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, config.norm_plus_one)

    def fuse(self) -> None:
        """Replace q/k/v_proj by one matmul over their concatenated weights (same outputs)."""
        if self.qkv_proj is None:
            self.qkv_proj = fused_linear([self.q_proj, self.k_proj, self.v_proj])
            del self.q_proj, self.k_proj, self.v_proj

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of ``x``, each ``[B, T, heads * head_dim]``."""
        if self.qkv_proj is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(x).split([q_dim, kv_dim, kv_dim], dim=-1)
        return q, k, v

    def rotated(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries and keys of ``x`` (q/k-normed, then RoPE), and values; each ``[B, heads, T, D]``.

        ``cos``/``sin`` are ``[B or 1, T, 1, rotary_dim]``.
        """
        b, t, _ = x.shape
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_proj is not None and self.q_norm is None:
            # Fused: one RoPE pass over the query and key heads side by side (5 kernels, not 10).
            qkv = self.qkv_proj(x).view(b, t, h + 2 * kvh, d)
            q, k = apply_rope(qkv[:, :, : h + kvh], cos, sin).split([h, kvh], dim=2)
            v = qkv[:, :, h + kvh :]
        else:
            q, k, v = (p.view(b, t, -1, d) for p in self.project(x))
            if self.q_norm is not None and self.k_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slot: torch.Tensor,
        mask: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        kv_len: int,
        matmul_attention: bool = False,
    ) -> torch.Tensor:
        """Attend ``x`` ``[B, T, H]`` over the first ``kv_len`` cache positions.

        ``slot``: the cache positions of the T tokens, ``[T]`` for every row or ``[B, T]`` per row.
        """
        b, t, _ = x.shape
        q, k, v = self.rotated(x, cos, sin)
        if slot.dim() == 1:
            k_cache.index_copy_(2, slot, k.to(k_cache.dtype))
            v_cache.index_copy_(2, slot, v.to(v_cache.dtype))
        else:  # each row writes its own slots
            index = slot[:, None, :, None].expand(b, k.shape[1], t, k.shape[-1])
            k_cache.scatter_(2, index, k.to(k_cache.dtype))
            v_cache.scatter_(2, index, v.to(v_cache.dtype))
        keys = k_cache[:, :, :kv_len].to(q.dtype)
        values = v_cache[:, :, :kv_len].to(q.dtype)
        if matmul_attention or self.logit_cap is not None:  # SDPA has no soft-cap
            out = grouped_attention(q, keys, values, mask, self.scale, self.logit_cap)
        else:
            # enable_gqa lets each KV head serve its query group without copying the cache.
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, enable_gqa=True, scale=self.scale
            )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """Gated feed-forward block: ``down(act(gate(x)) * up(x))``, act silu (SwiGLU) or gelu-tanh."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_up_proj: nn.Linear | None = None  # Phi-3's stored layout, or set by fuse()
        if config.fused_projections:
            self.gate_up_proj = nn.Linear(hidden, 2 * inner, bias=bias)
        else:
            self.gate_proj = nn.Linear(hidden, inner, bias=bias)
            self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)
        self.gelu = config.hidden_act == "gelu_pytorch_tanh"

    def fuse(self) -> None:
        """Replace gate/up_proj by one matmul over their concatenated weights (same outputs)."""
        if self.gate_up_proj is None:
            self.gate_up_proj = fused_linear([self.gate_proj, self.up_proj])
            del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply ``down(act(gate(x)) * up(x))``."""
        if self.gate_up_proj is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.down_proj(act * up)
