"""Llama/Qwen2-family decoder with an explicit, preallocated KV cache.

Only math lives here. The forward signature ``(input_ids, positions, kv_cache) -> logits``
serves prefill (many tokens) and decode (one token) alike, so the same module exports to ONNX
and captures in CUDA graphs: the cache has a fixed capacity and is written at the given
positions; attention masks are derived from positions, never from data-dependent shapes.

Two opt-in variants compute the same function with fewer, predictable kernels, for CUDA
graphs: :meth:`Decoder.fuse` (one matmul for q/k/v and one for gate/up, RoPE on queries and
keys in one pass, RMSNorm through torch's fused kernel) and ``matmul_attention`` (plain
batched matmuls instead of SDPA, whose kernel choice depends on mask, dtype and head layout).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.config import DecoderConfig, UnsupportedModel


@dataclass
class KVCache:
    """Keys and values of every layer: ``k[i]`` / ``v[i]`` are ``[batch, kv_heads, capacity, head_dim]``.

    By default all layers share one tensor ``[layers, batch, kv_heads, capacity, head_dim]``.
    With ``separate_layers`` each layer has its own tensor: torch.compile then updates the cache
    in place (a write into a view of one shared tensor makes it copy the whole cache).
    """

    k: torch.Tensor | tuple[torch.Tensor, ...]
    v: torch.Tensor | tuple[torch.Tensor, ...]

    @classmethod
    def allocate(
        cls,
        config: DecoderConfig,
        capacity_tokens: int,
        *,
        batch: int = 1,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        separate_layers: bool = False,
    ) -> KVCache:
        """Allocate a zeroed cache holding ``capacity_tokens`` positions."""
        layer = (batch, config.num_kv_heads, capacity_tokens, config.head_dim)
        if separate_layers:
            return cls(
                *(
                    tuple(torch.zeros(layer, dtype=dtype, device=device) for _ in range(config.num_layers))
                    for _ in range(2)
                )
            )
        shape = (config.num_layers, *layer)
        return cls(
            torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
        )

    @property
    def capacity_tokens(self) -> int:
        """How many positions the cache holds."""
        return self.k[0].shape[2]


def rope_inv_freq(config: DecoderConfig) -> torch.Tensor:
    """Inverse RoPE frequencies, with the config's scaling (linear or llama3) applied."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq.float()
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        return (inv_freq / factor).float()
    if kind == "llama3":
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        original = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv_freq
        smooth = (original / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= original / low) & (wavelen >= original / high)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return torch.where(mid, blended, scaled).float()
    raise UnsupportedModel(f"RoPE scaling {kind!r} is not supported (default, linear, llama3 are)")


def grouped_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d)) v`` where each KV head serves a contiguous group of query heads.

    Args:
        q: Queries ``[B, H, T, D]``.
        keys: Keys ``[B, KVH, S, D]`` (``H`` a multiple of ``KVH``); not copied per group.
        values: Values ``[B, KVH, S, D]``.
        mask: Boolean ``[1, 1, T, S]``, True where a query may attend.

    Returns:
        ``[B, H, T, D]``. The softmax runs in fp32.
    """
    b, h, t, d = q.shape
    kv_heads = keys.shape[1]
    group = h // kv_heads
    # Query head j*group+i uses KV head j: fold the group into the rows of one matmul per KV head.
    rows = (q * d**-0.5).reshape(b, kv_heads, group * t, d)
    scores = (rows @ keys.transpose(-1, -2)).view(b, kv_heads, group, t, -1)
    scores = torch.where(mask, scores, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
    if t == 1:
        # Decode: a matmul of 1-3 rows by the whole cache runs on a few blocks, each walking
        # every position; a product-and-sum spreads the positions over the GPU instead.
        out = (probs.view(b, kv_heads, group, -1, 1) * values[:, :, None]).sum(dim=-2)
        return out.view(b, h, t, d)
    return (probs.view(b, kv_heads, group * t, -1) @ values).view(b, h, t, d)


def _fused_linear(parts: list[nn.Linear]) -> nn.Linear:
    """One Linear whose output is the concatenation of ``parts``' outputs."""
    weight = torch.cat([p.weight for p in parts])
    biases = [p.bias for p in parts]
    with torch.device("meta"):  # no throw-away initialisation; both tensors are replaced below
        fused = nn.Linear(weight.shape[1], weight.shape[0], bias=biases[0] is not None)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if fused.bias is not None:
        fused.bias = nn.Parameter(torch.cat([b for b in biases if b is not None]), requires_grad=False)
    return fused


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, computed in fp32.

    ``fused`` (set by :meth:`Decoder.fuse`) runs it as one kernel (``F.rms_norm``) instead of
    eight. That kernel applies the weight in fp32 and casts once; Hugging Face's
    ``LlamaRMSNorm`` (the unfused path) casts, then multiplies in the model's dtype, so in
    half precision the two may differ in the last bit.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.fused = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension."""
        if self.fused:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention that reads and writes its layer of the KV cache."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.num_heads * config.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_kv_heads * config.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_kv_heads * config.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_heads * config.head_dim, config.hidden_size, bias=False)
        self.qkv_proj: nn.Linear | None = None  # set by fuse(); replaces q/k/v_proj

    def fuse(self) -> None:
        """Replace q/k/v_proj by one matmul over their concatenated weights (same outputs)."""
        self.qkv_proj = _fused_linear([self.q_proj, self.k_proj, self.v_proj])
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
        """Queries and keys of ``x`` with RoPE applied, and values; each ``[B, heads, T, D]``."""
        b, t, _ = x.shape
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_proj is None:
            q, k, v = self.project(x)
            q = q.view(b, t, h, d).transpose(1, 2)
            k = k.view(b, t, kvh, d).transpose(1, 2)
            v = v.view(b, t, kvh, d).transpose(1, 2)
            return _rope(q, cos, sin), _rope(k, cos, sin), v
        # Fused: one RoPE pass over the query and key heads side by side (5 kernels, not 10).
        qkv = self.qkv_proj(x).view(b, t, h + 2 * kvh, d)
        qk = _rope(qkv[:, :, : h + kvh], cos.transpose(1, 2), sin.transpose(1, 2))
        q, k = qk.split([h, kvh], dim=2)
        return q.transpose(1, 2), k.transpose(1, 2), qkv[:, :, h + kvh :].transpose(1, 2)

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
        """Attend ``x`` ``[B, T, H]`` over the first ``kv_len`` cache positions."""
        b, t, _ = x.shape
        q, k, v = self.rotated(x, cos, sin)
        k_cache.index_copy_(2, slot, k.to(k_cache.dtype))
        v_cache.index_copy_(2, slot, v.to(v_cache.dtype))
        keys = k_cache[:, :, :kv_len].to(q.dtype)
        values = v_cache[:, :, :kv_len].to(q.dtype)
        if matmul_attention:
            out = grouped_attention(q, keys, values, mask)
        else:
            # enable_gqa lets each KV head serve its query group without copying the cache.
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """SwiGLU feed-forward block."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up_proj: nn.Linear | None = None  # set by fuse(); replaces gate/up_proj

    def fuse(self) -> None:
        """Replace gate/up_proj by one matmul over their concatenated weights (same outputs)."""
        self.gate_up_proj = _fused_linear([self.gate_proj, self.up_proj])
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply ``down(silu(gate(x)) * up(x))``."""
        if self.gate_up_proj is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

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
        """Attention then MLP, each with a residual connection."""
        h = self.input_layernorm(x)
        x = x + self.self_attn(h, cos, sin, slot, mask, k_cache, v_cache, kv_len, matmul_attention)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """The whole causal LM: embeddings, blocks, final norm and LM head.

    Parameter names follow Hugging Face's (``model.layers.N.self_attn.q_proj.weight``...)
    so safetensors checkpoints load without renaming.
    """

    inv_freq: torch.Tensor

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)

    def fuse(self) -> None:
        """Compute the same function with fewer kernels (for CUDA graphs: ~26 per layer, not ~47).

        Concatenates q/k/v and gate/up weights (three matmuls fewer per layer), rotates queries
        and keys in one pass, and normalises with ``F.rms_norm`` (one kernel). The fused modules
        no longer match Hugging Face parameter names; half-precision results may differ from
        the unfused ones in the last bit (see :class:`RMSNorm`).
        """
        for layer in self.layers:
            assert isinstance(layer, Block)
            layer.self_attn.fuse()
            layer.mlp.fuse()
            layer.input_layernorm.fused = layer.post_attention_layernorm.fused = True
        self.norm.fused = True

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: KVCache,
        *,
        kv_len: int | None = None,
        last_only: bool = False,
        matmul_attention: bool = False,
    ) -> torch.Tensor:
        """Run ``input_ids`` ``[B, T]`` at ``positions`` ``[T]``, updating ``kv_cache`` in place.

        Args:
            input_ids: Token ids, int64 ``[B, T]``.
            positions: Absolute position of each of the T tokens, int64 ``[T]``; their K/V
                are written to these cache slots. Every query attends to slots ``<= its position``.
            kv_cache: The cache to read and write.
            kv_len: Attend over only the first ``kv_len`` slots (must exceed the largest
                position); ``None`` uses the full capacity (fixed shapes for graphs/export).
            last_only: Return logits of the last token only (``[B, 1, V]``), saving the LM head
                work of prefill.
            matmul_attention: Attend with :func:`grouped_attention` instead of SDPA.

        Returns:
            Float logits ``[B, T, V]`` (or ``[B, 1, V]``).
        """
        length = kv_cache.capacity_tokens if kv_len is None else kv_len
        freqs = positions.to(self.inv_freq.dtype)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        x = self.embed_tokens(input_ids)
        cos = emb.cos().to(x.dtype)[None, None]
        sin = emb.sin().to(x.dtype)[None, None]
        slots = torch.arange(length, device=positions.device)
        mask = (slots[None, :] <= positions[:, None])[None, None]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, positions, mask, kv_cache.k[i], kv_cache.v[i], length, matmul_attention)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.norm(x)).float()
