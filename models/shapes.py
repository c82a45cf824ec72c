"""``config.json``'s sizes against the weight files' headers, before anything is allocated.

A config that says ``num_hidden_layers: 1000000`` built layers until memory ran out, and an
impossible ``hidden_size`` was blamed on the tokenizer or shown as a 275-line dump of shapes.
Reading only the safetensors headers (names and shapes, through ``safe_open``: no tensor data)
costs a few milliseconds, needs no torch, and names the one setting that does not fit, and the file.
"""

from __future__ import annotations

import re
from pathlib import Path

from safetensors import SafetensorError, safe_open

from models.config import DecoderConfig, InvalidConfig
from models.files import CorruptModel, decoder_key, weight_files

LAYER = re.compile(r"layers\.(\d+)\.")


def weight_shapes(model_dir: Path) -> dict[str, tuple[tuple[int, ...], Path]]:
    """``{decoder parameter: (shape, file)}`` from the headers of ``model_dir``'s safetensors files.

    Raises:
        CorruptModel: A weight file's header is unreadable (names the file).
    """
    shapes: dict[str, tuple[tuple[int, ...], Path]] = {}
    for path in weight_files(model_dir):
        try:
            with safe_open(str(path), framework="numpy") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is no dict)
                    key = decoder_key(name)
                    if key is not None:
                        shapes[key] = (tuple(f.get_slice(name).get_shape()), path)
        except (SafetensorError, OSError, ValueError) as e:
            raise CorruptModel(f"cannot read {path}: {e}") from e
    return shapes


def check_sizes(model_dir: Path, config: DecoderConfig) -> None:
    """Refuse a ``config.json`` whose sizes the weights do not have, naming the setting and the file.

    Checks ``num_hidden_layers`` (the layers the weights hold), ``vocab_size`` and
    ``hidden_size`` (the embedding), ``intermediate_size`` (the MLP's down projection) and
    ``num_attention_heads`` x ``head_dim`` (the attention output projection). A weight that is
    missing is left to the load, which names it.

    Raises:
        InvalidConfig: A size differs from the weights (the message names both files).
        CorruptModel: A weight file's header is unreadable.
    """
    shapes = weight_shapes(model_dir)
    source = model_dir / "config.json"
    layers = {int(m.group(1)) for key in shapes if (m := LAYER.match(key))}
    if layers and config.num_layers != max(layers) + 1:
        (_shape, path) = next(v for k, v in shapes.items() if LAYER.match(k))
        raise InvalidConfig(
            f"{source}: 'num_hidden_layers' is {config.num_layers:,}, but {path} holds "
            f"{max(layers) + 1} layers (0 to {max(layers)}); the config does not belong to these weights"
        )
    expected = {
        "embed_tokens.weight": (
            ("'vocab_size'", config.vocab_size, 0),
            ("'hidden_size'", config.hidden_size, 1),
        ),
        "layers.0.mlp.down_proj.weight": (
            ("'hidden_size'", config.hidden_size, 0),
            ("'intermediate_size'", config.intermediate_size, 1),
        ),
        "layers.0.self_attn.o_proj.weight": (
            ("'hidden_size'", config.hidden_size, 0),
            (
                f"'num_attention_heads' x 'head_dim' ({config.num_heads} x {config.head_dim})",
                config.num_heads * config.head_dim,
                1,
            ),
        ),
    }
    for key, checks in expected.items():
        if key not in shapes:
            continue
        shape, path = shapes[key]
        for name, value, axis in checks:
            if len(shape) == 2 and shape[axis] != value:
                raise InvalidConfig(
                    f"{source}: {name} is {value:,}, but {path} holds {key} of shape "
                    f"{list(shape)} (dimension {axis} should be {value:,}); the config does not "
                    "belong to these weights"
                )


def parameter_count(model_dir: Path) -> int:
    """Elements of the decoder's weights, from the safetensors headers (a tied head counted once).

    Raises:
        CorruptModel: A weight file's header is unreadable.
    """
    total = 0
    for shape, _path in weight_shapes(model_dir).values():
        count = 1
        for size in shape:
            count *= size
        total += count
    return total
