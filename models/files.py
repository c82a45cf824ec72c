"""What a model folder must hold, and the errors that say it does not (no torch, no I/O but stat).

The store adds the fix for its own folders (``store.records.repair_hints``); these errors
name the file and the problem only, so the decoder's maths never depends on the store.
"""

from __future__ import annotations

import json
from pathlib import Path

FETCH_HINT = "run 'assistant models fetch' (or point --model at a safetensors folder of a supported family)"


class ModelNotFound(FileNotFoundError):
    """The model folder or one of its files is missing."""


class CorruptModel(ValueError):
    """A weight file exists but cannot be read or does not fit the config."""


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of ``model_dir`` (the shards its index names, if it has one).

    Raises:
        CorruptModel: The index is unreadable.
    """
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return [model_dir / s for s in shards]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptModel(f"{index} is unreadable ({e!r})") from e
    return sorted(model_dir.glob("*.safetensors"))


def check_model_dir(model_dir: Path) -> None:
    """Check that ``model_dir`` has a ``config.json`` and safetensors weights.

    The recorded files of a stored model are checked by the store
    (:func:`store.records.check_model`).

    Raises:
        ModelNotFound: No config or no weights.
        CorruptModel: The weights' index is unreadable.
    """
    if not (model_dir / "config.json").is_file():
        raise ModelNotFound(f"no model at {model_dir} (config.json missing): {FETCH_HINT}")
    if not weight_files(model_dir):
        raise ModelNotFound(f"no *.safetensors weights in {model_dir}: {FETCH_HINT}")


# Multimodal checkpoints (Gemma 3 4B and up) keep the text decoder under a prefix; the vision
# tower and projector are not loaded.
TEXT_PREFIXES = ("language_model.", "model.language_model.")
VISION_PREFIXES = (
    "vision_tower.",
    "multi_modal_projector.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
)


def decoder_key(name: str) -> str | None:
    """The :class:`Decoder` parameter a checkpoint tensor loads into; ``None``: not the decoder's.

    ``model.layers.0...`` -> ``layers.0...``; multimodal ``language_model.model.layers.0...``
    and ``model.language_model.layers.0...`` likewise.
    """
    if name.startswith(VISION_PREFIXES):
        return None
    for prefix in TEXT_PREFIXES:
        name = name.removeprefix(prefix)
    return name.removeprefix("model.")
