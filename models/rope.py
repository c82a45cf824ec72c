"""Rotary position embeddings: frequencies per layer type, scaling variants, partial rotation.

A model may use more than one RoPE (Gemma 3: a local base for its sliding-window layers, the
global one, possibly scaled, for full-attention layers), so each layer type gets its own
:class:`Rotary`. Scalings: ``linear``, ``llama3`` and ``longrope`` (Phi-3/Phi-4-mini: short
factors while the sequence fits ``original_max_position_embeddings``, long factors past it, and
cos/sin scaled by the attention factor). ``partial_rotary_factor`` rotates only the first
fraction of each head (Phi-4-mini: 0.75).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from models.config import FULL, ROPE_TYPES, SLIDING, DecoderConfig, UnsupportedModel


@dataclass(frozen=True)
class RopeSpec:
    """One RoPE: base, scaling settings (``None``: plain) and how many dims of a head it rotates."""

    theta: float
    scaling: dict[str, Any] | None
    rotary_dim: int
    max_position_embeddings: int

    @property
    def kind(self) -> str:
        """``default``, ``linear``, ``llama3`` or ``longrope``."""
        if self.scaling is None:
            return "default"
        return str(self.scaling.get("rope_type", self.scaling.get("type", "default")))

    @property
    def switch_tokens(self) -> int | None:
        """longrope: sequences longer than this use the long factors; ``None`` for other kinds."""
        if self.kind != "longrope" or self.scaling is None:
            return None
        return int(self.scaling.get("original_max_position_embeddings", self.max_position_embeddings))

    @property
    def attention_factor(self) -> float:
        """The factor longrope applies to cos and sin (1 for other kinds), as transformers does."""
        if self.kind != "longrope" or self.scaling is None:
            return 1.0
        if self.scaling.get("attention_factor") is not None:
            return float(self.scaling["attention_factor"])
        original = self.switch_tokens or self.max_position_embeddings
        factor = self.scaling.get("factor") or self.max_position_embeddings / original
        return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def rope_spec(config: DecoderConfig, layer_type: str = FULL) -> RopeSpec:
    """The RoPE of ``layer_type`` layers: sliding layers may have their own base (Gemma 3)."""
    rotary_dim = int(config.head_dim * config.partial_rotary_factor)
    if layer_type == SLIDING and config.local_rope_theta is not None:
        return RopeSpec(config.local_rope_theta, None, rotary_dim, config.max_position_embeddings)
    return RopeSpec(config.rope_theta, config.rope_scaling, rotary_dim, config.max_position_embeddings)


def inv_freq(spec: RopeSpec, *, long: bool = False) -> torch.Tensor:
    """Inverse frequencies (fp32, ``rotary_dim / 2``); ``long``: longrope's long factors."""
    dim, kind, scaling = spec.rotary_dim, spec.kind, spec.scaling or {}
    if kind == "longrope":  # computed in fp32 exactly as transformers does
        factors = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
        return 1.0 / (factors * spec.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    base = 1.0 / (spec.theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    factor = float(scaling.get("factor", 1.0))
    if kind == "default":
        return base.float()
    if kind == "linear":
        return (base / factor).float()
    if kind == "llama3":
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        original = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / base
        smooth = (original / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > original / low, base / factor, base)
        mid = (wavelen <= original / low) & (wavelen >= original / high)
        blended = (1 - smooth) * base / factor + smooth * base
        return torch.where(mid, blended, scaled).float()
    raise UnsupportedModel(f"RoPE scaling {kind!r} is not supported ({', '.join(ROPE_TYPES)} are)")


def rope_inv_freq(config: DecoderConfig, layer_type: str = FULL) -> torch.Tensor:
    """Inverse frequencies of ``layer_type`` layers (short factors for longrope)."""
    return inv_freq(rope_spec(config, layer_type))


class Rotary(nn.Module):
    """cos and sin of one RoPE at given positions; frequencies stay fp32 whatever the model dtype."""

    inv_freq: torch.Tensor
    long_inv_freq: torch.Tensor | None

    def __init__(self, spec: RopeSpec) -> None:
        super().__init__()
        self.spec = spec
        self.switch_tokens = spec.switch_tokens
        self.attention_factor = spec.attention_factor
        self.register_buffer("inv_freq", inv_freq(spec), persistent=False)
        long = inv_freq(spec, long=True) if self.switch_tokens is not None else None
        self.register_buffer("long_inv_freq", long, persistent=False)

    def reset(self, device: torch.device | str) -> None:
        """Recompute the fp32 frequencies on ``device`` (after a cast or a meta-device build)."""
        self.inv_freq = inv_freq(self.spec).to(device)
        if self.switch_tokens is not None:
            self.long_inv_freq = inv_freq(self.spec, long=True).to(device)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype, length: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cos and sin ``[..., T, 1, rotary_dim]`` for ``positions`` ``[..., T]`` (ascending).

        longrope picks its factors by the sequence length, as transformers and Phi-3's own code
        do: long ones when it exceeds ``original_max_position_embeddings``. The length is the
        call's last position + 1 unless ``length`` (``[1]``) says otherwise (a prompt run in
        chunks). Keys cached by earlier calls keep their rotation: the driver runs the whole
        sequence again when it crosses the switch. The choice is a tensor ``where`` (no host
        sync), so CUDA graphs and ONNX graphs carry it.
        """
        freq = self.inv_freq
        if self.long_inv_freq is not None and self.switch_tokens is not None:
            tokens = positions[..., -1:] + 1 if length is None else length
            long = (tokens > self.switch_tokens)[..., None]  # [..., 1, 1]
            freq = torch.where(long, self.long_inv_freq, self.inv_freq)
        # Angles in fp32 whatever the model dtype: positions reach thousands of radians.
        freqs = positions.to(self.inv_freq.dtype)[..., None] * freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype)[..., None, :], sin.to(dtype)[..., None, :]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[-x2, x1]`` for the halves ``x1, x2`` of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of each head of ``x`` ``[B, T, heads, D]``."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    head, rest = x[..., :rot], x[..., rot:]
    return torch.cat((head * cos + rotate_half(head) * sin, rest), dim=-1)
