"""Decoder hyper-parameters, read from a Hugging Face ``config.json``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


class UnsupportedModel(ValueError):
    """The model folder holds an architecture this decoder does not implement."""


@dataclass(frozen=True)
class DecoderConfig:
    """Shape and numerics of a Llama/Qwen2-family decoder."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    model_type: str = "llama"
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> DecoderConfig:
        """Build from the dict of a Hugging Face ``config.json``."""
        model_type = hf.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModel(
                f"model_type {model_type!r} is not supported; use a Llama or Qwen2 family model"
            )
        heads = hf["num_attention_heads"]
        # transformers >= 5 nests RoPE settings in rope_parameters; older configs keep them flat.
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads", heads),
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=None if rope_type == "default" else rope,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama has them only when attention_bias is set.
            attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
            model_type=model_type,
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_dir(cls, model_dir: Path) -> DecoderConfig:
        """Read ``model_dir/config.json``, adding end-of-turn ids from ``generation_config.json``."""
        config = cls.from_hf(json.loads((model_dir / "config.json").read_text()))
        generation = model_dir / "generation_config.json"
        if generation.exists():
            eos = json.loads(generation.read_text()).get("eos_token_id")
            extra = eos if isinstance(eos, list) else [] if eos is None else [eos]
            merged = tuple(dict.fromkeys([*config.eos_token_ids, *extra]))
            config = dataclasses.replace(config, eos_token_ids=merged)
        return config
