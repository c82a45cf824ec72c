"""A batch-1 decode step in five kernels per layer (Triton), for :class:`~engines.cuda_graph.CudaGraphStep`.

The eager model runs a Llama layer as ~26 device ops (fused) or ~14 (torch.compile); this
step runs it as five (:mod:`engines.decode_kernels`): RMSNorm + q/k/v product; RoPE + cache
write + split attention; combine + o-projection + residual add; RMSNorm + gate/up product +
SiLU gate; down-projection + residual add. The embedding lookup, the final RMSNorm + LM head
and the argmax (in :class:`~engines.cuda_graph.CudaGraphStep`) complete the step.

Where Triton cannot run (no CUDA, unless ``TRITON_INTERPRET=1``), the same decomposition runs
as torch operations (:class:`TorchOps`): that is how CPU tests check the weight layout, the
RoPE table and the residual stream against the eager model.

Only the plain Llama block is covered (Llama, SmolLM2, Qwen2, Mistral without a window):
:func:`unsupported` names what a config has beyond it, and the caller keeps the model's own
decode step for such models.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Protocol

import torch
import torch.nn.functional as F

from models.config import FULL, DecoderConfig
from models.decoder import Block, Decoder, KVCache
from models.layers import RMSNorm

MAX_SPLITS = 8  # attention splits per KV head; the o-projection combines them on its input
SPLIT_SLOTS = 64  # a split covers at least this many slots


def unsupported(config: DecoderConfig) -> str | None:
    """Why the fused step cannot run ``config``'s model (``None``: it can)."""
    checks = {
        "q/k norms": config.qk_norm,
        "(1 + w) norms": config.norm_plus_one,
        "an embedding scale": config.embedding_scale != 1.0,
        "sandwich norms": config.sandwich_norms,
        f"the {config.hidden_act} activation": config.hidden_act != "silu",
        "logit soft-capping": config.attn_logit_softcap is not None or config.final_logit_softcap is not None,
        "partial RoPE": config.partial_rotary_factor != 1.0,
        "longrope": config.rope_switch_tokens is not None,
        "sliding-window layers": any(config.layer_type(i) != FULL for i in range(config.num_layers)),
        "an odd head size": config.head_dim % 32 != 0,
    }
    found = [name for name, present in checks.items() if present]
    return f"the fused decode step covers the plain Llama block, not {', '.join(found)}" if found else None


def triton_usable(device: torch.device) -> bool:
    """Whether the Triton kernels can run on ``device`` (CUDA, or the CPU under the interpreter)."""
    if importlib.util.find_spec("triton") is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class LayerWeights:
    """One layer's tensors as the kernels take them (views of the fused model's parameters)."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None
    k_cache: torch.Tensor
    v_cache: torch.Tensor


def _layer(block: Block, k_cache: torch.Tensor, v_cache: torch.Tensor) -> LayerWeights:
    attn, mlp = block.self_attn, block.mlp
    if attn.qkv_proj is None or mlp.gate_up_proj is None:
        raise ValueError("FusedDecode needs a fused model: call Decoder.fuse() first")
    return LayerWeights(
        block.input_layernorm.weight, attn.qkv_proj.weight, attn.qkv_proj.bias,
        attn.o_proj.weight, attn.o_proj.bias, block.post_attention_layernorm.weight,
        mlp.gate_up_proj.weight, mlp.gate_up_proj.bias, mlp.down_proj.weight, mlp.down_proj.bias,
        k_cache, v_cache,
    )  # fmt: skip


class Ops(Protocol):
    """The step's three operations; :class:`TorchOps` and :class:`TritonOps` implement them."""

    def gemv(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        out: torch.Tensor,
        *,
        bias: torch.Tensor | None = None,
        norm: tuple[torch.Tensor, float] | None = None,
        splits: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int] | None = None,
        residual: bool = False,
        gated: bool = False,
    ) -> None:
        """See :func:`engines.decode_kernels.gemv`."""
        ...

    def attention(
        self,
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
    ) -> None:
        """See :func:`engines.decode_kernels.attention`."""
        ...


class TritonOps:
    """The Triton kernels (:mod:`engines.decode_kernels`, imported on first use)."""

    def __init__(self, programs: int, tune: bool) -> None:
        from engines import decode_kernels

        self.kernels: ModuleType = decode_kernels
        self.gemv = partial(decode_kernels.gemv, programs=programs, tune=tune)
        self.attention = decode_kernels.attention


class TorchOps:
    """The same operations in torch, with the kernels' rounding (any device, any dtype).

    Attention is computed whole and stored as split 0 (the other splits empty), so the
    combine step is exercised too.
    """

    def gemv(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        out: torch.Tensor,
        *,
        bias: torch.Tensor | None = None,
        norm: tuple[torch.Tensor, float] | None = None,
        splits: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int] | None = None,
        residual: bool = False,
        gated: bool = False,
    ) -> None:
        """See :func:`engines.decode_kernels.gemv`."""
        if splits is not None:
            part_m, part_l, part_acc, n, heads = splits
            top = part_m[:n].amax(dim=0)
            weight_s = torch.where(part_m[:n] > float("-inf"), torch.exp(part_m[:n] - top), 0.0)
            den = (weight_s * part_l[:n]).sum(dim=0)
            num = (weight_s[..., None] * part_acc[:n].view(n, heads, -1)).sum(dim=0)
            x = (num / den[:, None]).reshape(-1).to(weight.dtype)
        elif norm is not None:
            x = F.rms_norm(x, (x.shape[-1],), norm[0], norm[1])
        y = F.linear(x, weight, bias)
        if gated:
            gate, up = y.chunk(2)
            y = F.silu(gate) * up
        if residual:
            out.add_(y.to(out.dtype))
        else:
            out.copy_(y)

    def attention(
        self,
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
    ) -> None:
        """See :func:`engines.decode_kernels.attention`."""
        from models.rope import apply_rope

        d = k_cache.shape[-1]
        q, k, v = qkv.view(1, 1, heads + 2 * kv_heads, d).split([heads, kv_heads, kv_heads], dim=2)
        c, s = cos.index_select(0, position)[:, None], sin.index_select(0, position)[:, None]
        q, k = apply_rope(q, c, s), apply_rope(k, c, s)  # [1, 1, heads, d]
        k_cache.index_copy_(2, position, k.transpose(1, 2).to(k_cache.dtype))
        v_cache.index_copy_(2, position, v.transpose(1, 2).to(v_cache.dtype))
        keys, values = k_cache[0, :, :window], v_cache[0, :, :window]  # [kvh, S, d]
        group = heads // kv_heads
        rows = (q[0, 0] * scale).view(kv_heads, group, d)
        scores = (rows @ keys.transpose(-1, -2)).float()  # [kvh, group, S]
        visible = torch.arange(window, device=position.device) <= position
        scores = torch.where(visible, scores, float("-inf"))
        top = scores.amax(dim=-1)
        p = torch.exp(scores - top[..., None])
        part_m, part_l, part_acc = partials
        part_m[:splits].fill_(float("-inf"))
        part_l[:splits].zero_()
        part_acc[:splits].zero_()
        part_m[0].copy_(top.reshape(-1))
        part_l[0].copy_(p.sum(dim=-1).reshape(-1))
        part_acc[0].copy_((p.to(values.dtype) @ values).float().reshape(-1))


class FusedDecode:
    """The decode step of a fused :class:`~models.decoder.Decoder` at batch 1 (see module doc).

    Reads the model's parameters and writes ``cache`` in place; call with the step's token id
    ``[1, 1]``, position ``[1]`` (int64, on the device) and KV window (slots, a Python int:
    one CUDA graph per window); returns the fp32 logits ``[1, vocab]``, in ``logits`` when given
    (a ``[1, vocab]`` fp32 buffer of the caller's), else in a buffer of its own.
    ``use_triton``: ``None`` uses the kernels where they can run (:func:`triton_usable`).
    ``programs``: how many programs a matrix-vector kernel aims for (two per multiprocessor of
    an H100/H200 by default; fewer make the CPU interpreter faster). ``tune`` (CUDA): time a
    few tiles per product at its first call instead (written, not yet run on a GPU).
    """

    def __init__(
        self,
        model: Decoder,
        cache: KVCache,
        *,
        use_triton: bool | None = None,
        logits: torch.Tensor | None = None,
        programs: int = 264,
        tune: bool = False,
    ) -> None:
        config = model.config
        reason = unsupported(config)
        if reason is not None:
            raise ValueError(reason)
        weight = model.embed_tokens.weight
        device, dtype = weight.device, weight.dtype
        if use_triton is None:
            use_triton = triton_usable(device)
        tune = tune and device.type == "cuda"  # the autotuner times on the device
        self.ops: Ops = TritonOps(programs, tune) if use_triton else TorchOps()
        self.backend = "triton" if use_triton else "torch"
        self.model = model
        self.config = config
        blocks = [b for b in model.layers if isinstance(b, Block)]
        self.layers = [_layer(b, cache.k[i], cache.v[i]) for i, b in enumerate(blocks)]
        slots = cache.capacity_tokens
        rotary = model.rope[FULL]
        cos, sin = rotary(torch.arange(slots, device=device)[None], dtype)  # [1, slots, 1, d]
        self.cos, self.sin = cos.reshape(slots, -1).contiguous(), sin.reshape(slots, -1).contiguous()
        h, kvh, d = config.num_heads, config.num_kv_heads, config.head_dim
        self.scale = config.attention_scale if config.attention_scale is not None else d**-0.5
        self.qkv = torch.zeros((h + 2 * kvh) * d, dtype=dtype, device=device)
        self.act = torch.zeros(config.intermediate_size, dtype=dtype, device=device)
        self.part_m = torch.zeros(MAX_SPLITS, h, dtype=torch.float32, device=device)
        self.part_l = torch.zeros(MAX_SPLITS, h, dtype=torch.float32, device=device)
        self.part_acc = torch.zeros(MAX_SPLITS, h * d, dtype=torch.float32, device=device)
        norm = model.norm
        assert isinstance(norm, RMSNorm)
        self.final_norm = norm.weight
        if logits is None:
            logits = torch.zeros(1, config.vocab_size, dtype=torch.float32, device=device)
        self.logits = logits

    @staticmethod
    def splits_for(window: int) -> int:
        """Attention splits per KV head for a window of ``window`` slots."""
        return max(1, min(MAX_SPLITS, window // SPLIT_SLOTS))

    def __call__(self, ids: torch.Tensor, position: torch.Tensor, window: int) -> torch.Tensor:
        """Decode token ``ids`` ``[1, 1]`` at ``position`` ``[1]``; the fp32 logits ``[1, vocab]``."""
        c, ops = self.config, self.ops
        eps = c.rms_norm_eps
        x = self.model.embed_tokens(ids).view(-1)  # the residual stream, updated in place
        splits = self.splits_for(window)
        partials = (self.part_m, self.part_l, self.part_acc)
        combine = (*partials, splits, c.num_heads)
        for w in self.layers:
            ops.gemv(x, w.qkv, self.qkv, bias=w.qkv_bias, norm=(w.input_norm, eps))
            ops.attention(
                self.qkv, self.cos, self.sin, position, w.k_cache, w.v_cache, partials,
                heads=c.num_heads, kv_heads=c.num_kv_heads, scale=self.scale, window=window, splits=splits,
            )  # fmt: skip
            ops.gemv(x, w.o, x, bias=w.o_bias, splits=combine, residual=True)
            ops.gemv(x, w.gate_up, self.act, bias=w.gate_up_bias, norm=(w.post_norm, eps), gated=True)
            ops.gemv(self.act, w.down, x, bias=w.down_bias, residual=True)
        head = self.model.lm_head
        ops.gemv(x, head.weight, self.logits.view(-1), bias=head.bias, norm=(self.final_norm, eps))
        return self.logits
