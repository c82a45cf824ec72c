"""Decoder hyper-parameters, read from a Hugging Face ``config.json``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# model_type values of config.json this decoder implements (Gemma 3's multimodal "gemma3" loads
# its text model). Each family is a few explicit fields of DecoderConfig (see _family).
SUPPORTED_MODEL_TYPES = (
    "llama", "qwen2", "qwen3", "mistral", "ministral", "phi3", "gemma2", "gemma3_text", "gemma3",
)  # fmt: skip
FULL, SLIDING = "full_attention", "sliding_attention"  # layer types, named as in transformers
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
ROPE_TYPES = ("default", "linear", "llama3", "longrope")


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


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidConfig(f"{path} is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise InvalidConfig(f"{path} holds a {type(data).__name__} where a JSON object belongs")
    return data


def _optional_number(hf: dict[str, Any], key: str) -> float | None:
    return None if hf.get(key) is None else _number(hf, key, 0.0)


def _rope_settings(hf: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
    """RoPE settings of full-attention layers, and the base of sliding layers when it differs.

    transformers >= 5 nests RoPE settings in ``rope_parameters`` (per layer type for Gemma 3);
    older configs keep them flat (``rope_scaling``, Gemma 3's ``rope_local_base_freq``).
    """
    settings = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(settings, dict):
        raise InvalidConfig(f"'rope_parameters' is {settings!r}, not an object")
    local_theta = None
    if FULL in settings or SLIDING in settings:
        local = settings.get(SLIDING) or {}
        if local.get("rope_type", local.get("type", "default")) != "default":
            raise UnsupportedModel(f"scaled RoPE on sliding-window layers ({local}) is not supported")
        local_theta = _optional_number(local, "rope_theta")
        settings = settings.get(FULL) or {}
    elif hf.get("model_type") == "gemma3_text":
        local_theta = _number(hf, "rope_local_base_freq", 10000.0)
    return dict(settings), local_theta


def _layer_types(model_type: str, hf: dict[str, Any], layers: int, window: int | None) -> tuple[str, ...]:
    """Each layer's attention type: from ``layer_types``, else each family's rule in transformers."""
    types = hf.get("layer_types")
    if types is None:
        if model_type == "gemma3_text":
            pattern = _positive_int(hf, "sliding_window_pattern", 6)
            types = [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]
        elif model_type == "gemma2":
            types = [SLIDING if (i + 1) % 2 else FULL for i in range(layers)]
        elif model_type in ("qwen2", "qwen3"):
            first = hf.get("max_window_layers") or 0
            types = [SLIDING if window is not None and i >= first else FULL for i in range(layers)]
        else:
            types = [SLIDING if window is not None else FULL] * layers
    if not isinstance(types, list) or len(types) != layers:
        raise InvalidConfig(f"'layer_types' is {types!r}, not a list of {layers} layer types")
    unknown = sorted({str(t) for t in types} - {FULL, SLIDING})
    if unknown:
        raise UnsupportedModel(f"layer types {unknown} are not supported ({FULL}, {SLIDING} are)")
    return tuple(types)


def _family(model_type: str, hf: dict[str, Any], layers: int, head_dim: int) -> dict[str, Any]:
    """Each family's differences from the Llama block, as DecoderConfig fields."""
    window = None if hf.get("sliding_window") is None else _positive_int(hf, "sliding_window")
    if model_type == "llama" or (model_type in ("qwen2", "qwen3") and not hf.get("use_sliding_window")):
        window = None  # transformers ignores the field there
    gemma = model_type in ("gemma2", "gemma3_text")
    act = hf.get("hidden_activation") or hf.get("hidden_act") or ("gelu_pytorch_tanh" if gemma else "silu")
    if act not in ACTIVATIONS:
        raise UnsupportedModel(f"activation {act!r} is not supported ({', '.join(ACTIVATIONS)} are)")
    fields: dict[str, Any] = {
        "sliding_window": window,
        "layer_types": _layer_types(model_type, hf, layers, window),
        "hidden_act": act,
        "qk_norm": model_type in ("qwen3", "gemma3_text"),
    }
    if model_type == "qwen2":  # q/k/v biases always, o_proj never
        fields |= {"attention_bias": True, "attention_out_bias": False}
    if model_type == "phi3":
        fields |= {"fused_projections": True, "attention_bias": False, "attention_out_bias": False}
    if gemma:
        if hf.get("use_bidirectional_attention"):
            raise UnsupportedModel("bidirectional Gemma (an embedding model) is not a chat decoder")
        fields |= {
            "norm_plus_one": True,
            "embedding_scale": _positive_int(hf, "hidden_size") ** 0.5,
            "sandwich_norms": True,
            "attention_scale": _number(hf, "query_pre_attn_scalar", head_dim) ** -0.5,
            "attn_logit_softcap": _optional_number(hf, "attn_logit_softcapping"),
            "final_logit_softcap": _optional_number(hf, "final_logit_softcapping"),
        }
    return fields


@dataclass(frozen=True)
class DecoderConfig:
    """Shape and numerics of a decoder: the Llama block plus each family's explicit differences.

    ``layer_types`` holds :data:`FULL` or :data:`SLIDING` per layer (empty: all full); sliding
    layers attend the last ``sliding_window`` positions (the query's own included).
    """

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
    attention_out_bias: bool = False  # o_proj bias: Llama/Qwen3/Gemma attention_bias, never Qwen2
    mlp_bias: bool = False  # Llama mlp_bias
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over each query and key head before RoPE
    norm_plus_one: bool = False  # Gemma: RMSNorm scales by (1 + weight)
    embedding_scale: float = 1.0  # Gemma: sqrt(hidden_size), rounded to the weights' dtype
    sandwich_norms: bool = False  # Gemma 2/3: norms after attention, before and after the MLP
    hidden_act: str = "silu"  # MLP gate activation: silu or gelu_pytorch_tanh (Gemma)
    attention_scale: float | None = None  # None: head_dim ** -0.5; Gemma: query_pre_attn_scalar ** -0.5
    attn_logit_softcap: float | None = None  # Gemma 2: cap * tanh(scores / cap)
    final_logit_softcap: float | None = None  # Gemma 2: cap * tanh(logits / cap)
    fused_projections: bool = False  # Phi-3: qkv_proj and gate_up_proj stored fused
    partial_rotary_factor: float = 1.0  # Phi-4-mini: RoPE rotates 0.75 of each head
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    local_rope_theta: float | None = None  # Gemma 3: RoPE base of sliding layers (unscaled)

    @property
    def rope_switch_tokens(self) -> int | None:
        """longrope: past this many tokens every position uses the long factors; else ``None``.

        transformers recomputes the whole cache with the long factors when a sequence first
        grows past it (and Phi-3's own code picks factors by the sequence length), so the
        engines' driver does the same (:class:`~engines.driver.DecoderDriver`).
        """
        scaling = self.rope_scaling or {}
        if scaling.get("rope_type", scaling.get("type")) != "longrope":
            return None
        return int(scaling["original_max_position_embeddings"])

    def layer_type(self, index: int) -> str:
        """:data:`FULL` or :data:`SLIDING` for layer ``index``."""
        kind = self.layer_types[index] if self.layer_types else FULL
        return kind if self.sliding_window is not None else FULL

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> DecoderConfig:
        """Build from the dict of a Hugging Face ``config.json``.

        Raises:
            UnsupportedModel: Not one of :data:`SUPPORTED_MODEL_TYPES`, or a setting this
                decoder does not implement (RoPE scaling, activation, layer type).
            InvalidConfig: A required setting is missing or of the wrong type.
        """
        model_type = hf.get("model_type", "")
        if model_type == "gemma3" and isinstance(hf.get("text_config"), dict):
            # The multimodal Gemma 3 config: its text model is a gemma3_text decoder.
            eos = hf.get("eos_token_id", hf["text_config"].get("eos_token_id"))
            hf = {**hf["text_config"], "model_type": "gemma3_text", "eos_token_id": eos}
            model_type = "gemma3_text"
        if model_type not in SUPPORTED_MODEL_TYPES or model_type == "gemma3":
            raise UnsupportedModel(
                f"model_type {model_type!r} is not supported; use a model of type "
                f"{', '.join(SUPPORTED_MODEL_TYPES)} (Llama, Qwen2/Qwen3, Mistral/Ministral, "
                "Phi-3/Phi-4-mini, Gemma 2/Gemma 3 families)"
            )
        heads, hidden = _positive_int(hf, "num_attention_heads"), _positive_int(hf, "hidden_size")
        layers = _positive_int(hf, "num_hidden_layers")
        head_dim = _positive_int(hf, "head_dim") if hf.get("head_dim") else hidden // heads
        rope, local_theta = _rope_settings(hf)
        theta = _number({**hf, **rope}, "rope_theta", 10000.0)
        rope.pop("rope_theta", None)
        partial = _number({**hf, **rope}, "partial_rotary_factor", 1.0)
        rope.pop("partial_rotary_factor", None)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            known = ", ".join(ROPE_TYPES)
            raise UnsupportedModel(f"RoPE scaling {rope_type!r} is not supported ({known} are)")
        if rope_type == "longrope" and "original_max_position_embeddings" not in rope:
            rope["original_max_position_embeddings"] = _positive_int(hf, "original_max_position_embeddings")
        rotary_dim = int(head_dim * partial)
        if not 0 < partial <= 1 or rotary_dim % 2:
            raise InvalidConfig(f"'partial_rotary_factor' {partial} gives an odd or empty rotary dim")
        base = cls(
            vocab_size=_positive_int(hf, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_positive_int(hf, "intermediate_size"),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=_positive_int(hf, "num_key_value_heads", heads),
            head_dim=head_dim,
            rms_norm_eps=_number(hf, "rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=None if rope_type == "default" else rope,
            max_position_embeddings=_positive_int(hf, "max_position_embeddings", 2048),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", model_type.startswith("gemma"))),
            attention_bias=bool(hf.get("attention_bias", False)),
            attention_out_bias=bool(hf.get("attention_bias", False)),
            mlp_bias=bool(hf.get("mlp_bias", False)),
            model_type=model_type,
            eos_token_ids=_token_ids(hf.get("eos_token_id"), "eos_token_id"),
            partial_rotary_factor=partial,
            local_rope_theta=local_theta,
        )
        return dataclasses.replace(base, **_family(model_type, hf, layers, head_dim))

    @classmethod
    def from_dir(cls, model_dir: Path) -> DecoderConfig:
        """Read ``model_dir/config.json``, adding end-of-turn ids from ``generation_config.json``.

        Raises:
            UnsupportedModel: Not a supported model type or setting.
            InvalidConfig: A file is not JSON, or a setting is missing or of the wrong type;
                the message names the file and the setting (the store adds the fix:
                :func:`store.records.repair_hints`).
        """
        path = model_dir / "config.json"
        settings = _read_json(path)
        try:
            config = cls.from_hf(settings)
        except InvalidConfig as e:
            raise InvalidConfig(f"{path}: {e}") from e
        generation = model_dir / "generation_config.json"
        if generation.exists():
            eos = _read_json(generation).get("eos_token_id")
            try:
                extra = _token_ids(eos, "eos_token_id")
            except InvalidConfig as e:
                raise InvalidConfig(f"{generation}: {e}") from e
            merged = tuple(dict.fromkeys([*config.eos_token_ids, *extra]))
            config = dataclasses.replace(config, eos_token_ids=merged)
        return config
