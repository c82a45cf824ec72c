"""One ONNX export of the ``models/`` decoder, traced into a folder (the cache's miss path).

:func:`trace_decoder` loads the weights in the export dtype, traces
:class:`~engines.onnx_graph.OnnxDecoder` with the names and dynamic axes of the graph contract
(:mod:`engines.onnx_export`), stores the weights in a file beside the graph, adds the metadata,
runs ``onnx.checker``, writes ONNX Runtime's optimized graph beside a graph it runs
(:mod:`engines.onnxruntime_graph`) and writes the sidecar with each file's size and sha256 last.
:mod:`engines.onnx_export` decides when to call it and moves the folder into the cache.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

import onnx
import torch

from engines.onnx_export import (
    CONTRACT,
    DATA_FILE,
    GRAPH_FILE,
    INPUT_IDS,
    LAST_LOGITS,
    POSITION_IDS,
    SIDECAR,
    ExportError,
    ExportOptions,
    graph_code_sha256,
    past_names,
    present_names,
)
from engines.onnx_graph import OnnxDecoder
from engines.onnxruntime_backend import NUMPY_DTYPES
from engines.onnxruntime_graph import write_optimized_graph
from models.config import DecoderConfig
from models.weights import load_decoder
from store.records import sha256_file

logger = logging.getLogger(__name__)


def trace_decoder(model_dir: Path, options: ExportOptions, weights_sha: str, out: Path) -> dict[str, str]:
    """Trace to ONNX in ``out``, add metadata, check it, record file hashes; returns the metadata.

    Raises:
        ExportError: ``torch.onnx.export`` failed, or the graph fails ``onnx.checker``.
    """
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[options.dtype]
    model = load_decoder(model_dir, dtype=dtype)
    config = model.config
    raw = out / "raw"
    raw.mkdir(parents=True)
    past, present = past_names(config.num_layers), present_names(config.num_layers)
    axes: dict[str, dict[int, str]] = {
        INPUT_IDS: {0: "batch", 1: "sequence"},
        POSITION_IDS: {0: "batch", 1: "sequence"},
        LAST_LOGITS: {0: "batch"},
        **{n: {0: "batch", 2: "past_sequence"} for n in past},
        **{n: {0: "batch", 2: "total_sequence"} for n in present},
    }
    # Example sizes other than 0 and 1 so no axis can be mistaken for a constant.
    past_len, seq_len = 2, 3
    cache = [torch.zeros(1, config.num_kv_heads, past_len, config.head_dim, dtype=dtype) for _ in past]
    ids = torch.zeros(1, seq_len, dtype=torch.long)
    positions = torch.arange(past_len, past_len + seq_len)[None]
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            # The TorchScript exporter is deprecated in favour of dynamo (which needs
            # onnxscript and specializes 0/1-sized axes); it still writes opset 17 directly.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(
                OnnxDecoder(model).eval(),
                (ids, positions, *cache),
                str(raw / GRAPH_FILE),
                dynamo=False,
                opset_version=options.opset,
                input_names=[INPUT_IDS, POSITION_IDS, *past],
                output_names=[LAST_LOGITS, *present],
                dynamic_axes=axes,
                do_constant_folding=True,
            )
    except (RuntimeError, ValueError, TypeError) as e:
        raise ExportError(f"torch.onnx.export failed for {model_dir}: {e}") from e
    del model
    metadata = _metadata(model_dir, config, options, weights_sha, torch.__version__)
    graph = onnx.load(str(raw / GRAPH_FILE))  # also reads external data torch wrote above 2 GB
    graph.producer_name, graph.producer_version = "assistant", CONTRACT
    onnx.helper.set_model_props(graph, metadata)
    # The weights go in DATA_FILE: protobuf cannot hold a message over 2 GiB, and ONNX Runtime
    # builds a session from external data in 0.5 s where it parsed SmolLM2's 540 MB graph in
    # 0.8 s (docs/benchmarks.md, start-up).
    onnx.save_model(
        graph,
        str(out / GRAPH_FILE),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=DATA_FILE,
        size_threshold=1024,
    )
    del graph
    shutil.rmtree(raw)
    try:
        onnx.checker.check_model(str(out / GRAPH_FILE))  # a path: works above 2 GB too
    except onnx.checker.ValidationError as e:
        raise ExportError(f"the exported graph fails onnx.checker: {e}") from e
    if options.dtype in NUMPY_DTYPES:  # a graph ONNX Runtime runs: its optimized graph beside it
        try:
            write_optimized_graph(out)
        except Exception as e:  # onnxruntime's own types; the export still serves TensorRT
            logger.warning("no optimized graph for ONNX Runtime: %s (it optimizes at each load)", e)
    files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(out.iterdir())}
    (out / SIDECAR).write_text(json.dumps({"files": files, "metadata": metadata}, indent=2) + "\n")
    return metadata


def _metadata(
    model_dir: Path, config: DecoderConfig, options: ExportOptions, weights_sha: str, torch_version: str
) -> dict[str, str]:
    source = ""
    manifest = model_dir / "assistant-model.json"
    if manifest.is_file():
        source = str(json.loads(manifest.read_text()).get("source", ""))
    values: dict[str, Any] = {
        "model_id": model_dir.name,
        "model_source": source,
        "weights_sha256": weights_sha,
        "dtype": options.dtype,
        "opset": options.opset,
        "cache_contract": CONTRACT,
        "graph_code_sha256": graph_code_sha256(),
        "exporter": f"torch.onnx TorchScript exporter, torch {torch_version}",
        "onnx_version": onnx.__version__,
        "model_type": config.model_type,
        "num_layers": config.num_layers,
        "num_kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
    }
    return {f"assistant.{k}": str(v) for k, v in values.items()}
