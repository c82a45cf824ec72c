"""Llama/Qwen2-family decoder with an explicit, preallocated KV cache.

Only math lives here. The forward signature ``(input_ids, positions, kv_cache) -> logits``
serves prefill (many tokens) and decode (one token) alike, so the same module exports to ONNX
and captures in CUDA graphs: the cache has a fixed capacity and is written at the given
positions; attention masks are derived from positions, never from data-dependent shapes.
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
    """Keys and values of every layer: ``[layers, batch, kv_heads, capacity, head_dim]``."""

    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def allocate(
        cls,
        config: DecoderConfig,
        capacity_tokens: int,
        *,
        batch: int = 1,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> KVCache:
        """Allocate a zeroed cache holding ``capacity_tokens`` positions."""
        shape = (config.num_layers, batch, config.num_kv_heads, capacity_tokens, config.head_dim)
        return cls(
            torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
        )

    @property
    def capacity_tokens(self) -> int:
        """How many positions the cache holds."""
        return self.k.shape[3]


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


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, computed in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension."""
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
    ) -> torch.Tensor:
        """Attend ``x`` ``[B, T, H]`` over the first ``kv_len`` cache positions."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k_cache.index_copy_(2, slot, k.to(k_cache.dtype))
        v_cache.index_copy_(2, slot, v.to(v_cache.dtype))
        keys = k_cache[:, :, :kv_len].to(q.dtype)
        values = v_cache[:, :, :kv_len].to(q.dtype)
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply ``down(silu(gate(x)) * up(x))``."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


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
    ) -> torch.Tensor:
        """Attention then MLP, each with a residual connection."""
        h = self.input_layernorm(x)
        x = x + self.self_attn(h, cos, sin, slot, mask, k_cache, v_cache, kv_len)
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

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: KVCache,
        *,
        kv_len: int | None = None,
        last_only: bool = False,
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
            x = layer(x, cos, sin, positions, mask, kv_cache.k[i], kv_cache.v[i], length)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.norm(x)).float()
