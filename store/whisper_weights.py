"""Whisper weights for the PyTorch ASR backend: read a CTranslate2 ``model.bin`` as a state dict.

faster-whisper's models are CTranslate2 files; transformers' ``WhisperForConditionalGeneration``
needs Hugging Face names and shapes. The file format is CTranslate2's own serializer
(``ctranslate2/specs/model_spec.py``: version, spec name, revision, then each variable as
name, shape, dtype id, byte count and raw bytes, then aliases), so it reads without
CTranslate2. The conversion is exact: tensors keep their dtype (float16 in the bundled
tiny.en), CTranslate2's fused projections are split, and its zero key bias is dropped
(Whisper's key projections have none). :func:`converted_folder` writes the result once, as an
ordinary Hugging Face folder (``config.json`` + ``model.safetensors``) beside the model.
"""

from __future__ import annotations

import json
import os
import re
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

TORCH_DIR = "torch"  # the converted folder's name inside the CTranslate2 model folder
_DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")  # CTranslate2's DataType order
_LAYER = re.compile(r"(encoder|decoder)/layer_(\d+)/")


class WhisperConvertError(ValueError):
    """A CTranslate2 file that is not a Whisper model this converter knows (or is damaged)."""


def read_ct2(path: Path) -> dict[str, np.ndarray]:
    """Every variable of a CTranslate2 ``model.bin`` as numpy arrays; aliases resolved.

    Raises:
        WhisperConvertError: Not a CTranslate2 Whisper file, or truncated.
    """
    data = path.read_bytes()
    offset, version = 0, -1

    def take(fmt: str) -> int:
        nonlocal offset
        (value,) = struct.unpack_from(fmt, data, offset)
        offset += struct.calcsize(fmt)
        return int(value)

    def text() -> str:
        nonlocal offset
        n = take("H")
        value = data[offset : offset + n - 1].decode()
        offset += n
        return value

    try:
        version, spec = take("I"), text()
        if spec != "WhisperSpec":
            raise WhisperConvertError(f"{path} holds a {spec!r}, not a Whisper model")
        take("I")  # the spec's revision
        out: dict[str, np.ndarray] = {}
        for _ in range(take("I")):
            name = text()
            shape = [take("I") for _ in range(take("B"))]
            dtype, nbytes = _DTYPES[take("B")], take("I")
            if dtype == "bfloat16":
                raise WhisperConvertError(f"{path}: bfloat16 variables are not supported")
            out[name] = np.frombuffer(data, dtype, nbytes // np.dtype(dtype).itemsize, offset).reshape(shape)
            offset += nbytes
        for _ in range(take("I")):
            alias, target = text(), text()
            out[alias] = out[target]
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as e:
        if isinstance(e, WhisperConvertError):
            raise
        raise WhisperConvertError(
            f"{path} is not a readable CTranslate2 file (version {version}?): {e}"
        ) from e
    return out


def _norm(v: dict[str, np.ndarray], src: str, dst: str, sd: dict[str, np.ndarray]) -> None:
    sd[f"{dst}.weight"], sd[f"{dst}.bias"] = v[f"{src}/gamma"], v[f"{src}/beta"]


def _linear(v: dict[str, np.ndarray], src: str, dst: str, sd: dict[str, np.ndarray]) -> None:
    sd[f"{dst}.weight"], sd[f"{dst}.bias"] = v[f"{src}/weight"], v[f"{src}/bias"]


def _split(v: dict[str, np.ndarray], src: str, dsts: list[str], sd: dict[str, np.ndarray]) -> None:
    """A fused projection (rows q|k|v or k|v) into its parts; the key's bias must be zero."""
    weights = np.split(v[f"{src}/weight"], len(dsts))
    biases = np.split(v[f"{src}/bias"], len(dsts))
    for dst, w, b in zip(dsts, weights, biases, strict=True):
        sd[f"{dst}.weight"] = w
        if dst.endswith("k_proj"):
            if np.abs(b.astype(np.float32)).max() > 0:
                raise WhisperConvertError(f"{src}: non-zero key bias (Whisper's key projection has none)")
        else:
            sd[f"{dst}.bias"] = b


def _layer(v: dict[str, np.ndarray], side: str, i: int, sd: dict[str, np.ndarray]) -> None:
    src, dst = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
    attn = f"{dst}.self_attn"
    _norm(v, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm", sd)
    _split(v, f"{src}/self_attention/linear_0", [f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"], sd)
    _linear(v, f"{src}/self_attention/linear_1", f"{attn}.out_proj", sd)
    if side == "decoder":
        cross = f"{dst}.encoder_attn"
        _norm(v, f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm", sd)
        _linear(v, f"{src}/attention/linear_0", f"{cross}.q_proj", sd)
        _split(v, f"{src}/attention/linear_1", [f"{cross}.k_proj", f"{cross}.v_proj"], sd)
        _linear(v, f"{src}/attention/linear_2", f"{cross}.out_proj", sd)
    _norm(v, f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm", sd)
    _linear(v, f"{src}/ffn/linear_0", f"{dst}.fc1", sd)
    _linear(v, f"{src}/ffn/linear_1", f"{dst}.fc2", sd)


def ct2_to_hf(
    variables: dict[str, np.ndarray], ct2_config: dict[str, Any]
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Hugging Face ``WhisperForConditionalGeneration`` state dict and config from CTranslate2's.

    Raises:
        WhisperConvertError: A variable is missing or of an unexpected shape.
    """
    v = variables
    try:
        found = [(m.group(1), int(m.group(2))) for k in v if (m := _LAYER.match(k))]
        layers = {side: 1 + max(i for s, i in found if s == side) for side in ("encoder", "decoder")}
        sd: dict[str, np.ndarray] = {}
        for n in ("conv1", "conv2"):
            _linear(v, f"encoder/{n}", f"model.encoder.{n}", sd)
        sd["model.encoder.embed_positions.weight"] = v["encoder/position_encodings/encodings"]
        _norm(v, "encoder/layer_norm", "model.encoder.layer_norm", sd)
        sd["model.decoder.embed_tokens.weight"] = v["decoder/embeddings/weight"]
        sd["model.decoder.embed_positions.weight"] = v["decoder/position_encodings/encodings"]
        _norm(v, "decoder/layer_norm", "model.decoder.layer_norm", sd)
        for side, count in layers.items():
            for i in range(count):
                _layer(v, side, i, sd)
        vocab, d_model = sd["model.decoder.embed_tokens.weight"].shape
        ffn = {side: int(sd[f"model.{side}.layers.0.fc1.weight"].shape[0]) for side in layers}
        heads = {side: int(v[f"{side}/num_heads"]) for side in layers}
    except (KeyError, ValueError) as e:
        if isinstance(e, WhisperConvertError):
            raise
        raise WhisperConvertError(f"not a CTranslate2 Whisper model this converter knows: {e!r}") from e
    multilingual = vocab >= 51865  # Whisper's own test; tiny.en lists language ids all the same
    eot = 50257 if multilingual else 50256
    config = {
        "model_type": "whisper",
        "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": int(vocab),
        "num_mel_bins": int(sd["model.encoder.conv1.weight"].shape[1]),
        "d_model": int(d_model),
        "encoder_layers": layers["encoder"],
        "decoder_layers": layers["decoder"],
        "encoder_attention_heads": heads["encoder"],
        "decoder_attention_heads": heads["decoder"],
        "encoder_ffn_dim": ffn["encoder"],
        "decoder_ffn_dim": ffn["decoder"],
        "max_source_positions": int(sd["model.encoder.embed_positions.weight"].shape[0]),
        "max_target_positions": int(sd["model.decoder.embed_positions.weight"].shape[0]),
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "decoder_start_token_id": eot + 1,
        "suppress_tokens": [int(i) for i in ct2_config.get("suppress_ids", [])],
        "begin_suppress_tokens": [int(i) for i in ct2_config.get("suppress_ids_begin", [])],
        "torch_dtype": str(sd["model.decoder.embed_tokens.weight"].dtype),
    }
    return sd, config


def converted_folder(ct2_folder: Path) -> Path:
    """``<ct2_folder>/torch``: a Hugging Face folder of the same weights, converted once.

    Written to a temporary folder beside it and renamed into place, so a crash or a second
    process never leaves half a folder that looks complete (the loser of a race keeps the
    winner's copy). Later calls only check that it is there.

    Raises:
        WhisperConvertError: ``model.bin`` is not a Whisper model this converter knows.
        OSError: The folder is not writable.
    """
    target = ct2_folder / TORCH_DIR
    if (target / "model.safetensors").is_file() and (target / "config.json").is_file():
        return target
    from safetensors.numpy import save_file

    ct2_config_path = ct2_folder / "config.json"
    ct2_config = json.loads(ct2_config_path.read_text()) if ct2_config_path.is_file() else {}
    sd, config = ct2_to_hf(read_ct2(ct2_folder / "model.bin"), ct2_config)
    work = Path(tempfile.mkdtemp(prefix=f".{TORCH_DIR}-", dir=ct2_folder))
    try:
        save_file({k: np.ascontiguousarray(a) for k, a in sd.items()}, str(work / "model.safetensors"))
        (work / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if (ct2_folder / "tokenizer.json").is_file():
            (work / "tokenizer.json").write_bytes((ct2_folder / "tokenizer.json").read_bytes())
        try:
            os.rename(work, target)
        except OSError:
            if not (target / "model.safetensors").is_file():  # not a lost race: a real failure
                raise
    finally:
        if work.exists():
            for p in work.iterdir():
                p.unlink()
            work.rmdir()
    return target
