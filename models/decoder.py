"""The decoder (Llama block and its family variants) with an explicit, preallocated KV cache.

Only math lives here. The forward signature ``(input_ids, positions, kv_cache) -> logits``
serves prefill (many tokens) and decode (one token) alike, so the same module exports to ONNX
and captures in CUDA graphs: the cache has a fixed capacity and is written at the given
positions; attention masks are derived from positions, never from data-dependent shapes.

Two opt-in variants compute the same function with fewer, predictable kernels, for CUDA
graphs: :meth:`Decoder.fuse` (one matmul for q/k/v and one for gate/up, RoPE on queries and
keys in one pass, RMSNorm through torch's fused kernel) and ``matmul_attention`` (plain
batched matmuls instead of SDPA, whose kernel choice depends on mask, dtype and head layout).

Families differ from the Llama block only by fields of :class:`~models.config.DecoderConfig`:
the layers in :mod:`models.layers` read them, RoPE per layer type lives in :mod:`models.rope`,
and each layer's mask is causal or sliding-window by its type.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models.config import FULL, SLIDING, DecoderConfig
from models.layers import MLP, Attention, RMSNorm, attention_mask, grouped_attention, softcap
from models.rope import Rotary, rope_spec

__all__ = ["MLP", "Attention", "Block", "Decoder", "KVCache", "RMSNorm", "grouped_attention"]


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


class Block(nn.Module):
    """Pre-norm transformer block.

    With ``sandwich_norms`` (Gemma) the attention and MLP outputs are normed too, before each
    residual add (Gemma's ``post_attention_layernorm`` norms the attention output; Llama's is
    the norm before the MLP).
    """

    def __init__(self, config: DecoderConfig, layer_type: str = FULL) -> None:
        super().__init__()
        self.layer_type = layer_type
        window = config.sliding_window if layer_type == SLIDING else None
        hidden, eps, plus_one = config.hidden_size, config.rms_norm_eps, config.norm_plus_one
        self.input_layernorm = RMSNorm(hidden, eps, plus_one)
        self.self_attn = Attention(config, window)
        self.post_attention_layernorm = RMSNorm(hidden, eps, plus_one)
        self.mlp = MLP(config)
        self.pre_feedforward_layernorm: RMSNorm | None = None
        self.post_feedforward_layernorm: RMSNorm | None = None
        if config.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(hidden, eps, plus_one)
            self.post_feedforward_layernorm = RMSNorm(hidden, eps, plus_one)

    def add_attention(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The residual add of the attention output ``attended``."""
        if self.post_feedforward_layernorm is not None:
            return x + self.post_attention_layernorm(attended)
        return x + attended

    def add_feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP and its residual add."""
        if self.pre_feedforward_layernorm is not None and self.post_feedforward_layernorm is not None:
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x + self.mlp(self.post_attention_layernorm(x))

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
        attended = self.self_attn(h, cos, sin, slot, mask, k_cache, v_cache, kv_len, matmul_attention)
        return self.add_feed_forward(self.add_attention(x, attended))


class Decoder(nn.Module):
    """The whole causal LM: embeddings, blocks, final norm and LM head.

    Parameter names follow Hugging Face's (``model.layers.N.self_attn.q_proj.weight``...)
    so safetensors checkpoints load without renaming. ``rope`` holds one :class:`Rotary` per
    RoPE in use: ``full_attention``, plus ``sliding_attention`` when sliding layers have their
    own base (Gemma 3).
    """

    embed_scale: torch.Tensor | None

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        types = [config.layer_type(i) for i in range(config.num_layers)]
        self.windows = {t: config.sliding_window if t == SLIDING else None for t in types}  # masks to build
        self.layers = nn.ModuleList(Block(config, t) for t in types)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_plus_one)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        kinds = [FULL] + ([SLIDING] if SLIDING in types and config.local_rope_theta is not None else [])
        self.rope = nn.ModuleDict({k: Rotary(rope_spec(config, k)) for k in kinds})
        # Gemma multiplies embeddings by sqrt(hidden) rounded to the weights' dtype: a buffer,
        # so a cast rounds it the same way.
        scale = torch.tensor(config.embedding_scale) if config.embedding_scale != 1.0 else None
        self.register_buffer("embed_scale", scale, persistent=False)

    def rope_key(self, layer: Block) -> str:
        """The key in ``rope`` of ``layer``'s RoPE."""
        return layer.layer_type if layer.layer_type in self.rope else FULL

    def reset_buffers(self) -> None:
        """Rebuild the non-persistent buffers after a cast or a meta-device build.

        RoPE frequencies stay fp32 whatever the weights' dtype; the embedding scale takes it.
        """
        weight = self.embed_tokens.weight
        for rotary in self.rope.values():
            assert isinstance(rotary, Rotary)
            rotary.reset(weight.device)
        if self.embed_scale is not None:
            scale = torch.tensor(self.config.embedding_scale, device=weight.device)
            self.embed_scale = scale.to(weight.dtype)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings, scaled where the family does (Gemma)."""
        x = self.embed_tokens(input_ids)
        return x if self.embed_scale is None else x * self.embed_scale

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states -> float logits (soft-capped where the config says)."""
        return softcap(self.lm_head(h).float(), self.config.final_logit_softcap)

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
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.fused = True

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: KVCache,
        *,
        kv_len: int | None = None,
        last_only: bool = False,
        matmul_attention: bool = False,
        rope_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run ``input_ids`` ``[B, T]`` at ``positions``, updating ``kv_cache`` in place.

        Args:
            input_ids: Token ids, int64 ``[B, T]``.
            positions: Absolute position of each of the T tokens, int64: ``[T]`` shared by every
                row, or ``[B, T]``, each row (sequence) at its own positions (batched decoding);
                their K/V are written to these slots of the row's cache. Every query attends to
                slots ``<= its position`` (and, in sliding-window layers, ``> its position - window``).
            kv_cache: The cache to read and write.
            kv_len: Attend over only the first ``kv_len`` slots (must exceed the largest
                position); ``None`` uses the full capacity (fixed shapes for graphs/export).
            last_only: Return logits of the last token only (``[B, 1, V]``), saving the LM head
                work of prefill.
            matmul_attention: Attend with :func:`grouped_attention` instead of SDPA.
            rope_tokens: longrope: the sequence length ``[1]`` that picks the factors (a prompt
                run in chunks); ``None``: the last position + 1.

        Returns:
            Float logits ``[B, T, V]`` (or ``[B, 1, V]``).
        """
        length = kv_cache.capacity_tokens if kv_len is None else kv_len
        x = self.embed(input_ids)
        per_row = positions if positions.dim() == 2 else positions[None]  # [B or 1, T]
        ropes = {k: r(per_row, x.dtype, rope_tokens) for k, r in self.rope.items()}
        slots = torch.arange(length, device=positions.device)
        masks = {k: attention_mask(slots, per_row, w)[:, None] for k, w in self.windows.items()}
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, Block)
            cos, sin = ropes[self.rope_key(layer)]
            x = layer(
                x, cos, sin, positions, masks[layer.layer_type], kv_cache.k[i], kv_cache.v[i], length,
                matmul_attention,
            )  # fmt: skip
        if last_only:
            x = x[:, -1:]
        return self.logits(self.norm(x))
