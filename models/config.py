"""Decoder hyper-parameters, read from a Hugging Face ``config.json``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.store import repair_hint

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


class UnsupportedModel(ValueError):
    """The model folder holds an architecture this decoder does not implement."""


class InvalidConfig(ValueError):
    """``config.json`` (or ``generation_config.json``) is unreadable or lacks a setting."""


def _positive_int(hf: dict[str, Any], key: str, default: int | None = None) -> int:
    value = default if hf.get(key) is None else hf[key]
    if value is None:
        raise InvalidConfig(f"{key!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidConfig(f"{key!r} is {value!r}, not a positive integer")
    return value


def _number(hf: dict[str, Any], key: str, default: float) -> float:
    value = default if hf.get(key) is None else hf[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidConfig(f"{key!r} is {value!r}, not a number")
    return float(value)


def _token_ids(value: Any, key: str) -> tuple[int, ...]:
    ids = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise InvalidConfig(f"{key!r} is {value!r}, not a token id or a list of them")
    return tuple(ids)


def _read_json(path: Path, hint: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidConfig(f"{path} is not valid JSON ({e}); {hint}") from e
    if not isinstance(data, dict):
        raise InvalidConfig(f"{path} holds a {type(data).__name__} where a JSON object belongs; {hint}")
    return data


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
        """Build from the dict of a Hugging Face ``config.json``.

        Raises:
            UnsupportedModel: Not a Llama or Qwen2 family model.
            InvalidConfig: A required setting is missing or of the wrong type.
        """
        model_type = hf.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModel(
                f"model_type {model_type!r} is not supported; use a Llama or Qwen2 family model"
            )
        heads, hidden = _positive_int(hf, "num_attention_heads"), _positive_int(hf, "hidden_size")
        # transformers >= 5 nests RoPE settings in rope_parameters; older configs keep them flat.
        rope_settings = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        if not isinstance(rope_settings, dict):
            raise InvalidConfig(f"'rope_parameters' is {rope_settings!r}, not an object")
        rope = dict(rope_settings)
        theta = _number({**hf, **rope}, "rope_theta", 10000.0)
        rope.pop("rope_theta", None)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        return cls(
            vocab_size=_positive_int(hf, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_positive_int(hf, "intermediate_size"),
            num_layers=_positive_int(hf, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=_positive_int(hf, "num_key_value_heads", heads),
            head_dim=_positive_int(hf, "head_dim") if hf.get("head_dim") else hidden // heads,
            rms_norm_eps=_number(hf, "rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=None if rope_type == "default" else rope,
            max_position_embeddings=_positive_int(hf, "max_position_embeddings", 2048),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama has them only when attention_bias is set.
            attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
            model_type=model_type,
            eos_token_ids=_token_ids(hf.get("eos_token_id"), "eos_token_id"),
        )

    @classmethod
    def from_dir(cls, model_dir: Path) -> DecoderConfig:
        """Read ``model_dir/config.json``, adding end-of-turn ids from ``generation_config.json``.

        Raises:
            UnsupportedModel: Not a Llama or Qwen2 family model.
            InvalidConfig: A file is not JSON, or a setting is missing or of the wrong type;
                the message names the file, the setting and the fix.
        """
        hint = repair_hint(model_dir)
        path = model_dir / "config.json"
        settings = _read_json(path, hint)
        try:
            config = cls.from_hf(settings)
        except InvalidConfig as e:
            raise InvalidConfig(f"{path}: {e}; {hint}") from e
        generation = model_dir / "generation_config.json"
        if generation.exists():
            eos = _read_json(generation, hint).get("eos_token_id")
            try:
                extra = _token_ids(eos, "eos_token_id")
            except InvalidConfig as e:
                raise InvalidConfig(f"{generation}: {e}; {hint}") from e
            merged = tuple(dict.fromkeys([*config.eos_token_ids, *extra]))
            config = dataclasses.replace(config, eos_token_ids=merged)
        return config
