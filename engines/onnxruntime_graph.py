"""ONNX Runtime's optimized graph of an export, written once beside it, so no start optimizes it.

ONNX Runtime transforms a graph at every session start (fusions, constant folding): SmolLM2's
fp32 export took 0.8-1.1 s to load, ~0.3 s of it those transformations (docs/engines.md, "The
optimized graph kept"; docs/benchmarks.md, "Start-up, fifth step"). :func:`write_optimized_graph`
runs them once, when the export is written, at ONNX Runtime's *extended* level, whose fusions
belong to the CPU provider but not to one processor (the *all* level's layout changes for this
processor still run at load), and saves the result as ``decoder.ort.onnx`` beside
``decoder.onnx``. Its weights point into the export's own ``decoder.onnx.data``: the optimizer
keeps each weight it does not change byte for byte, and each one it changed or added is kept in
the graph (small) or in ``decoder.ort.onnx.data`` (large), so the export holds its weights once.
The session built from it computes the same logits, bit for bit
(tests/integration/test_onnx_backend.py).

:func:`graph_to_load` picks it when the running ONNX Runtime is the one that wrote it (another
version's fused operators may differ), else the plain graph, optimized at load as before.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
import onnxruntime as ort
from google.protobuf.message import DecodeError

from engines.onnx_export import DATA_FILE, GRAPH_FILE

ORT_GRAPH_FILE = "decoder.ort.onnx"
ORT_DATA_FILE = "decoder.ort.onnx.data"  # only when the optimizer made a large weight of its own
VERSION_KEY = "assistant.onnxruntime_version"  # metadata: the ONNX Runtime that optimized it
INLINE_BYTES = 1024  # weights below this stay in the graph, as the export keeps them
ALIGN = 4096  # offsets in ORT_DATA_FILE, as onnx aligns external data for memory mapping
_STAGED = "optimized.tmp.onnx"  # ONNX Runtime's own output, rewritten then removed


def write_optimized_graph(folder: Path) -> Path:
    """Write ``folder/decoder.ort.onnx``: the export in ``folder`` as ONNX Runtime optimizes it.

    Raises:
        onnxruntime's errors: the graph cannot be loaded (the export's own check comes first).
    """
    staged, staged_data = folder / _STAGED, folder / f"{_STAGED}.data"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(staged)
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", staged_data.name
    )
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", str(INLINE_BYTES)
    )
    try:
        ort.InferenceSession(str(folder / GRAPH_FILE), options, providers=["CPUExecutionProvider"])
        graph = onnx.load(str(staged), load_external_data=False)
        original = _external(onnx.load(str(folder / GRAPH_FILE), load_external_data=False))
        with _mapped(folder / DATA_FILE) as weights, _mapped(staged_data) as optimized:
            _point_into_the_export(graph, original, weights, optimized, folder / ORT_DATA_FILE)
        props = {p.key: p.value for p in graph.metadata_props}
        onnx.helper.set_model_props(graph, {**props, VERSION_KEY: ort.__version__})
        onnx.save_model(graph, str(folder / ORT_GRAPH_FILE))
    finally:
        staged.unlink(missing_ok=True)
        staged_data.unlink(missing_ok=True)
    return folder / ORT_GRAPH_FILE


def graph_to_load(folder: Path) -> tuple[Path, str]:
    """The graph of the export in ``folder`` to build a session from, and why that one."""
    optimized = folder / ORT_GRAPH_FILE
    if not optimized.is_file():
        return folder / GRAPH_FILE, "no optimized graph in the export: optimized at load"
    try:
        props = {p.key: p.value for p in onnx.load(str(optimized), load_external_data=False).metadata_props}
    except (OSError, DecodeError) as e:
        return folder / GRAPH_FILE, f"optimized graph unreadable ({e}): optimized at load"
    made_by = props.get(VERSION_KEY)
    if made_by != ort.__version__:
        return folder / GRAPH_FILE, (
            f"optimized graph from onnxruntime {made_by}, running {ort.__version__}: optimized at load"
        )
    return optimized, "optimized graph"


def _external(graph: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """Each weight of ``graph`` kept in its data file: name -> (offset, length)."""
    return {t.name: _span(t) for t in graph.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}


def _span(tensor: onnx.TensorProto) -> tuple[int, int]:
    """Where an external weight's bytes are in its data file: (offset, length)."""
    entry = {e.key: e.value for e in tensor.external_data}
    return int(entry.get("offset", 0)), int(entry["length"])


def _point_into_the_export(
    graph: onnx.ModelProto,
    original: dict[str, tuple[int, int]],
    weights: bytes | mmap.mmap,
    optimized: bytes | mmap.mmap,
    own_data: Path,
) -> None:
    """Point each external weight of ``graph`` at its unchanged bytes in the export's data file.

    A weight that is not there unchanged moves into the graph, or into ``own_data`` when large.
    """
    own: list[bytes] = []
    size = 0
    for tensor in graph.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        start, length = _span(tensor)
        data = optimized[start : start + length]
        del tensor.external_data[:]
        where = original.get(tensor.name)
        if where is not None and where[1] == length and weights[where[0] : where[0] + length] == data:
            _set_external(tensor, DATA_FILE, *where)
        elif length < INLINE_BYTES:
            tensor.data_location, tensor.raw_data = onnx.TensorProto.DEFAULT, data
        else:
            pad = -size % ALIGN
            own.append(b"\0" * pad + data)
            _set_external(tensor, own_data.name, size + pad, length)
            size += pad + length
    if own:
        own_data.write_bytes(b"".join(own))


def _set_external(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


@contextmanager
def _mapped(path: Path) -> Iterator[bytes | mmap.mmap]:
    """``path`` mapped read-only; empty bytes for a missing or empty file."""
    if not path.is_file() or path.stat().st_size == 0:
        yield b""
        return
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        yield mapped
