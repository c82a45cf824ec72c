"""A Triton Inference Server model repository for a cached engine (``config.pbtxt`` + plan).

Triton's ``tensorrt_plan`` platform deserializes the engine with its own full TensorRT, so
only engines of flavour ``tensorrt`` built with Triton's TensorRT version load there; a
TensorRT-RTX engine is refused here rather than at Triton start-up. The engine's profiles are
batch 1 (``max_batch_size: 1``): Triton's ``dynamic_batching`` then queues requests (with
``max_queue_delay_microseconds``) but cannot merge them, and the KV cache travels with every
request, so this serves one conversation per request. Batched serving needs batch > 1
profiles and a stateful (sequence) batcher, which this contract does not have; ``assistant
serve`` (:mod:`engines.serving.triton_model`) serves the PyTorch decoder batched in flight instead.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from engines.onnx_export import INPUT_IDS, LAST_LOGITS, POSITION_IDS, past_names, present_names

TYPES = {"fp16": "TYPE_FP16", "fp32": "TYPE_FP32"}


class TritonExportError(ValueError):
    """The engine cannot be served by Triton's TensorRT backend."""


def triton_config(
    name: str, record: dict[str, Any], metadata: dict[str, str], queue_delay_us: int = 100
) -> str:
    """The ``config.pbtxt`` text for an engine with this cache record and export metadata.

    Raises:
        TritonExportError: A TensorRT-RTX engine (Triton runs full TensorRT plans only).
    """
    if record.get("flavour") != "tensorrt":
        raise TritonExportError(
            f"Triton's tensorrt_plan backend runs full TensorRT engines, not {record.get('flavour')}; "
            "build with --flavour tensorrt using Triton's TensorRT version"
        )
    layers = int(metadata["assistant.num_layers"])
    kv, head, vocab = (int(metadata[f"assistant.{k}"]) for k in ("num_kv_heads", "head_dim", "vocab_size"))
    cache_type = TYPES[record["onnx"]["dtype"]]

    def tensor(tensor_name: str, data_type: str, dims: list[int]) -> str:
        return f'  {{ name: "{tensor_name}" data_type: {data_type} dims: [ {", ".join(map(str, dims))} ] }}'

    inputs = [tensor(INPUT_IDS, "TYPE_INT64", [-1]), tensor(POSITION_IDS, "TYPE_INT64", [-1])]
    inputs += [tensor(n, cache_type, [kv, -1, head]) for n in past_names(layers)]
    outputs = [tensor(LAST_LOGITS, "TYPE_FP32", [vocab])]
    outputs += [tensor(n, cache_type, [kv, -1, head]) for n in present_names(layers)]
    return "\n".join(
        [
            f'name: "{name}"',
            'platform: "tensorrt_plan"',
            "max_batch_size: 1  # the engine's profiles are batch 1 (see engines/tensorrt/triton.py)",
            "input [",
            ",\n".join(inputs),
            "]",
            "output [",
            ",\n".join(outputs),
            "]",
            f"dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_us} }}",
            "instance_group [ { count: 1 kind: KIND_GPU } ]",
            "",
        ]
    )


def write_repository(
    repository: Path, name: str, engine_path: Path, record: dict[str, Any], metadata: dict[str, str]
) -> Path:
    """Write ``<repository>/<name>/config.pbtxt`` and ``<name>/1/model.plan``; returns the model folder."""
    text = triton_config(name, record, metadata)
    folder = repository / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(engine_path, folder / "1" / "model.plan")
    (folder / "config.pbtxt").write_text(text)
    return folder
