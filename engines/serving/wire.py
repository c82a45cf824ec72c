"""What a decoder served by Triton looks like on the wire, and its model repository.

One model, ``assistant_llm``, in decoupled mode (a request gets one response per token):

    PROMPT_IDS  int64  [T]   the whole prompt (chat template applied by the client)
    SESSION     uint8  [N]   the conversation's id, UTF-8: its KV prefix stays on the server
    OPTIONS     uint8  [N]   optional UTF-8 JSON of GenerationOptions fields (sampling, max_new_tokens)
    -> TOKEN    int64  [1]   the chosen token id
    -> SERVER_US int64 [1]   server time from the request's arrival to this token, microseconds
    -> REUSED   int32  [1]   prompt tokens the session's cached prefix saved

The server chooses tokens and stops at an end token, ``max_new_tokens`` or a full context; the
client detokenizes, applies stop strings and cancels the stream when it has what it needs (a
cancelled request leaves the batch at the next step). Text travels as UTF-8 bytes in uint8
tensors, not Triton BYTES: the Python backend of tritonserver 2.51 mis-reads BYTES tensors
under numpy 2 (``deserialize_bytes_tensor``: "unpack_from requires a buffer of at least
33686022 bytes", seen on the GPU machine).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engines.base import GenerationOptions
from store.records import sha256_file

MODEL_NAME = "assistant_llm"
PROMPT_IDS, SESSION, OPTIONS = "PROMPT_IDS", "SESSION", "OPTIONS"
TOKEN, SERVER_US, REUSED = "TOKEN", "SERVER_US", "REUSED"
REFUSED = "request refused: "  # leads the error of a request the server will not run (the client's fault)
SERVED_OPTIONS = ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed")


@dataclass(frozen=True)
class ServeOptions:
    """The served model: where it runs, how many sequences share it, Triton's batcher.

    ``sequences``: KV-cache rows, i.e. conversations decoded together and sessions whose prefix
    is kept (the longest idle one loses it when a new one needs a row). ``queue_delay_us`` and
    ``preferred_batch_sizes``: Triton's dynamic batcher, which hands requests arriving within
    the delay to the model together (they join the same decode step). ``prefill_chunk``: prompt
    tokens a decode step carries (chunked prefill; 0: prompts are prefilled between steps).
    """

    model_dir: Path = Path()
    sequences: int = 16
    context_tokens: int = 2048
    device: str = "auto"
    dtype: str = "auto"
    threads: int = 0
    cuda_graph: str = "auto"
    queue_delay_us: int = 100
    preferred_batch_sizes: tuple[int, ...] = ()
    prefill_chunk: int = 1024
    tokenizer_sha256: str = ""


def utf8(text: str) -> np.ndarray:
    """``text`` as the ``[1, N]`` uint8 tensor SESSION and OPTIONS travel in."""
    return np.frombuffer(text.encode(), dtype=np.uint8).reshape(1, -1)


def encode_options(options: GenerationOptions) -> str:
    """The JSON the server reads back with :func:`decode_options` (stop strings stay on the client)."""
    return json.dumps({k: getattr(options, k) for k in SERVED_OPTIONS})


def decode_options(text: str) -> GenerationOptions:
    """Options from a request; unknown keys or bad values raise ``ValueError`` naming them."""
    try:
        values = json.loads(text) if text else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"OPTIONS is not JSON ({e}): {text[:80]!r}") from e
    if not isinstance(values, dict):
        raise ValueError("OPTIONS must be a JSON object")
    unknown = set(values) - set(SERVED_OPTIONS)
    if unknown:
        raise ValueError(f"unknown options {sorted(unknown)}; known: {', '.join(SERVED_OPTIONS)}")
    return GenerationOptions(**values)


def model_config(options: ServeOptions) -> str:
    """``config.pbtxt`` of the served decoder: decoupled, dynamically batched, our settings as parameters."""
    params = {
        k: ",".join(map(str, v)) if isinstance(v, tuple) else str(v)
        for k, v in dataclasses.asdict(options).items()
    }
    parameters = "\n".join(
        f'parameters {{ key: "{k}" value: {{ string_value: {json.dumps(v)} }} }}' for k, v in params.items()
    )
    preferred = ", ".join(map(str, options.preferred_batch_sizes))
    batcher = f"max_queue_delay_microseconds: {options.queue_delay_us}"
    if preferred:
        batcher += f" preferred_batch_size: [ {preferred} ]"
    return f"""name: "{MODEL_NAME}"
backend: "python"
max_batch_size: {options.sequences}
model_transaction_policy {{ decoupled: true }}
dynamic_batching {{ {batcher} }}
input [
  {{ name: "{PROMPT_IDS}" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true }},
  {{ name: "{SESSION}" data_type: TYPE_UINT8 dims: [ -1 ] allow_ragged_batch: true }},
  {{ name: "{OPTIONS}" data_type: TYPE_UINT8 dims: [ -1 ] allow_ragged_batch: true optional: true }}
]
output [
  {{ name: "{TOKEN}" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "{SERVER_US}" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "{REUSED}" data_type: TYPE_INT32 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{parameters}
"""


def read_parameters(config: dict[str, Any]) -> ServeOptions:
    """The :class:`ServeOptions` a model config's parameters carry (what :func:`model_config` wrote)."""
    # Triton's own JSON says string_value, protobuf's JSON (tritonclient) stringValue.
    raw = {
        k: v.get("string_value", v.get("stringValue", "")) for k, v in config.get("parameters", {}).items()
    }
    values: dict[str, Any] = {}
    for f in dataclasses.fields(ServeOptions):
        if f.name not in raw:
            continue
        text = raw[f.name]
        if f.name == "model_dir":
            values[f.name] = Path(text)
        elif f.name == "preferred_batch_sizes":
            values[f.name] = tuple(int(x) for x in text.split(",") if x)
        elif isinstance(f.default, int):
            values[f.name] = int(text)
        else:
            values[f.name] = text
    return ServeOptions(**values)


def write_repository(repository: Path, options: ServeOptions) -> Path:
    """``<repository>/assistant_llm/{config.pbtxt, 1/model.py}``; returns the model folder."""
    folder = repository / MODEL_NAME
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(model_config(options))
    (folder / "1" / "model.py").write_text(
        '"""Triton runs this file; the model is engines.serving.triton_model."""\n'
        "from engines.serving.triton_model import TritonPythonModel  # noqa: F401\n"
    )
    return folder


def tokenizer_sha256(model_dir: Path) -> str:
    """The sha256 of the model's ``tokenizer.json`` (clients check theirs is the same)."""
    path = model_dir / "tokenizer.json"
    return sha256_file(path) if path.is_file() else ""
