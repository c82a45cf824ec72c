"""The export-time view of the ``models/`` decoder: the same weights and math, cache in and out.

:class:`OnnxDecoder` wraps a loaded :class:`~models.decoder.Decoder` and reuses its modules
(embeddings, norms, projections, MLPs, LM head, RoPE frequencies). Only the cache handling
differs from ``Decoder.forward``: instead of writing a preallocated cache in place, every
layer takes its past keys/values as inputs and returns ``concat(past, new)`` as outputs, a
pure function that ONNX and TensorRT express without aliasing (see ``docs/engines.md``).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from models.decoder import Attention, Block, Decoder
from models.layers import attention_mask, softcap


class OnnxDecoder(nn.Module):
    """``(input_ids, position_ids, *past) -> (last_logits, *present)`` over a decoder's weights.

    Key slot ``j`` of the concatenated cache holds absolute position ``j``, so the causal mask
    is ``slot <= position_ids[t]`` (and ``slot > position_ids[t] - window`` in sliding-window
    layers): a pure function of an explicit input and of the past length, with no
    data-dependent shape. Each RoPE (one per layer type where they differ) is computed once.
    """

    def __init__(self, model: Decoder) -> None:
        super().__init__()
        self.model = model
        config = model.config
        self.groups = config.num_heads // config.num_kv_heads

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Run ``input_ids`` ``[B, T]`` after ``past`` (key, value per layer, ``[B, KVH, P, D]``).

        Returns:
            fp32 logits of the last token ``[B, V]``, then the present key and value of every
            layer, ``[B, KVH, P + T, D]`` in the cache dtype.
        """
        m = self.model
        x = m.embed(input_ids)
        ropes = {k: r(position_ids, x.dtype) for k, r in m.rope.items()}  # [B, T, 1, rotary]
        total = past[0].shape[2] + input_ids.shape[1]
        slots = torch.arange(total, device=input_ids.device)
        biases = {k: self._bias(attention_mask(slots, position_ids, w)) for k, w in m.windows.items()}
        presents: list[torch.Tensor] = []
        for i, module in enumerate(m.layers):
            layer = cast(Block, module)
            cos, sin = ropes[m.rope_key(layer)]
            h = layer.input_layernorm(x)
            bias = biases[layer.layer_type]
            out, k, v = self._attend(layer.self_attn, h, cos, sin, bias, past[2 * i], past[2 * i + 1])
            x = layer.add_feed_forward(layer.add_attention(x, out))
            presents += [k, v]
        h = m.norm(x[:, -1])  # [B, H]
        # W @ h^T rather than h @ W^T: constant folding would store a transposed copy of W,
        # doubling the tied embedding matrix in the file (and on the GPU).
        logits = torch.matmul(m.lm_head.weight, h.transpose(0, 1)).transpose(0, 1).float()
        return (softcap(logits, m.config.final_logit_softcap), *presents)

    def _bias(self, visible: torch.Tensor) -> torch.Tensor:
        """Additive fp32 mask ``[B, 1, G * T, P + T]`` from the boolean ``[B, T, P + T]``."""
        bias = torch.zeros(visible.shape, dtype=torch.float32, device=visible.device)
        bias = bias.masked_fill(~visible, torch.finfo(torch.float32).min)
        # Query heads sharing a KV head are folded into the time axis (see _attend): row
        # g * T + t of the mask is token t's row, for every one of the G query heads.
        return bias.repeat(1, self.groups, 1)[:, None]

    def _attend(
        self,
        attn: Attention,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        bias: torch.Tensor,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        kvh, d = attn.num_kv_heads, attn.head_dim
        q, k, v = attn.rotated(x, cos, sin)
        k = torch.cat((past_k, k), dim=2)
        v = torch.cat((past_v, v), dim=2)
        # Grouped-query attention without repeating K/V: the G query heads of a KV head are
        # stacked along the time axis, so it is plain 4-D attention, [B, KVH, G * T, D] against
        # [B, KVH, P + T, D], with the scale applied to Q before the first matmul (as TensorRT's
        # attention fusion requires).
        scale = d**-0.5 if attn.scale is None else attn.scale
        q = (q * scale).reshape(b, kvh, self.groups * t, d)
        scores = softcap(torch.matmul(q, k.transpose(2, 3)), attn.logit_cap)
        # Mask and softmax in fp32 (a finite minimum, never -inf): sane in fp16 graphs.
        probs = F.softmax(scores.float() + bias, dim=-1).to(q.dtype)
        out = torch.matmul(probs, v).view(b, attn.num_heads, t, d)
        return attn.o_proj(out.transpose(1, 2).reshape(b, t, -1)), k, v
