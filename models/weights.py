"""Load a :class:`~models.decoder.Decoder` from a Hugging Face safetensors folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from models.config import DecoderConfig
from models.decoder import Decoder
from models.files import FETCH_HINT, CorruptModel, ModelNotFound, check_model_dir, decoder_key, weight_files

__all__ = ["FETCH_HINT", "CorruptModel", "ModelNotFound", "check_model_dir", "decoder_key", "load_decoder"]


def _check_finite(path: Path, shard: dict[str, torch.Tensor]) -> None:
    """Raise :class:`CorruptModel` when a tensor holds NaN or Inf (e.g. weights overwritten).

    A sum per tensor (in fp32, where no sane weight overflows) is non-finite exactly when a
    value is. numpy's: ~0.1 s of CPU for SmolLM2's 538 MB, where torch's ``sum`` took 0.5 s
    and ``isfinite().all()`` 5 s (2 shared cores; numbers in docs/troubleshooting.md).
    """
    for name, tensor in shard.items():
        if not tensor.is_floating_point():
            continue
        values = tensor.float() if tensor.dtype == torch.bfloat16 else tensor  # numpy has no bf16
        if not np.isfinite(values.numpy().sum(dtype=np.float32)):
            raise CorruptModel(f"{path}: tensor {name!r} holds NaN or Inf values, so the weights are damaged")


def load_decoder(
    model_dir: Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    config: DecoderConfig | None = None,
) -> Decoder:
    """Build the decoder described by ``model_dir/config.json`` and load its weights.

    ``config``: the folder's, when the caller read it already (else read here).

    Raises:
        ModelNotFound: The folder, its config or its weights are missing.
        CorruptModel: A weight file is unreadable, holds NaN or Inf values, or tensors are
            missing or mis-shaped (the store checks recorded files before:
            :func:`store.records.check_model`, and adds the fix).
        InvalidConfig: ``config.json`` lacks a setting or is not JSON.
    """
    check_model_dir(model_dir)
    config = config or DecoderConfig.from_dir(model_dir)
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(model_dir):
        try:
            shard = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as e:
            raise CorruptModel(f"cannot read {path}: {e}; delete the folder and {FETCH_HINT}") from e
        _check_finite(path, shard)
        for name, tensor in shard.items():
            key = decoder_key(name)
            if key is not None:
                state[key] = tensor
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
        state["lm_head.weight"] = state.get("embed_tokens.weight", torch.empty(0))
    with torch.device("meta"):
        model = Decoder(config)
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        raise CorruptModel(f"weights in {model_dir} do not match its config.json: {e}") from e
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    # The non-persistent buffers (RoPE, embedding scale) were built on the meta device. Give
    # them real storage for .to(), then recompute them after the cast: RoPE frequencies stay
    # fp32 whatever the weights' dtype.
    model.reset_buffers()
    model = model.to(device=device, dtype=dtype).eval()
    model.reset_buffers()
    return model
