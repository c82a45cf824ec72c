"""Export the ``models/`` decoder to ONNX, once per (weights, settings), cached beside the model.

The graph (names, shapes and the TensorRT notes in ``docs/engines.md``)::

    input_ids               int64  [batch, sequence]
    position_ids            int64  [batch, sequence]  values past_sequence ... past_sequence+sequence-1
    past_key_values.N.key   cache  [batch, kv_heads, past_sequence, head_dim]    (and .value)
    -> last_logits          fp32   [batch, vocab]     logits of the last input token
    -> present.N.key        cache  [batch, kv_heads, past_sequence + sequence, head_dim]  (and .value)

``cache`` is the graph dtype (fp32, fp16, or bf16: only TensorRT builds from that one). One
graph serves prefill (``sequence`` = prompt length) and decode (``sequence`` = 1);
``past_sequence`` may be 0.

Why past -> present concatenation and not a fixed-capacity cache updated in place
(ScatterND): ONNX has no in-place update, so a scattered cache is a new tensor each step.
Keeping it in place needs the runtime to alias an input with an output, which ONNX Runtime
does not guarantee and TensorRT's ONNX parser cannot express; without aliasing the whole
capacity is copied every step. A fixed capacity also makes every step attend over all of it
(masked), work that grows with the capacity instead of the real context. With
concatenation, attention covers exactly ``past_sequence + sequence`` slots, the cache length is
an ordinary dynamic axis (what TensorRT optimization profiles describe), and cutting the
cache back to a common prefix is just passing a shorter ``past``. The price is one copy of the
past per step (SmolLM2 fp16: 23 KB per cached token, against 270 MB of weights read).

Cache layout under the model folder::

    onnx/decoder-<dtype>-<key>/decoder.onnx   the graph (its weights in decoder.onnx.data)
    onnx/decoder-<dtype>-<key>/decoder.ort.onnx  fp32, fp16: the graph as ONNX Runtime optimizes
                                              it, its weights in decoder.onnx.data too
                                              (engines.onnxruntime_graph)
    onnx/decoder-<dtype>-<key>/export.json    sha256 and size of each file; written last
    onnx/hashes.json                          sha256 memo of the weights and export files,
                                              keyed by size + mtime (store.records.HashMemo)

``key`` hashes the weights, the dtype, the opset, :data:`CONTRACT` and the source of the code
that builds the graph (so a code change never reuses an old export). A folder whose files
do not match ``export.json`` (truncated, corrupt, interrupted), or whose ``export.json`` is not
of the expected shape, is exported again. At start a file whose size and mtime are those it
had when last hashed is taken as hashed (a full re-hash of ~540 MB cost ~3 s a start);
``assistant models verify`` and a failed load hash every byte. An export holds the entry's lock
(``engines/cache_lock.py``) from the cache check to the rename; staging folders left by a
killed export are swept at the next export (and by ``assistant engine clear``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import models
from engines.cache_lock import EntryLock, lock_entry, staging_dir, sweep_staging
from engines.progress import Cache, ProgressCallback, Stage, emit
from models.files import check_model_dir
from models.shapes import parameter_count
from store.records import HashMemo, publish_folder

logger = logging.getLogger(__name__)

OPSET = 17  # TensorRT 10.x parses opset 9 and up; TensorRT-RTX 1.7 accepted this export
CONTRACT = "past-present-concat/1"  # bump when names, layouts or semantics of the graph change
DTYPES = ("fp32", "fp16", "bf16")  # bf16: for strongly typed TensorRT builds only
INPUT_IDS = "input_ids"
POSITION_IDS = "position_ids"
LAST_LOGITS = "last_logits"
GRAPH_FILE = "decoder.onnx"
DATA_FILE = "decoder.onnx.data"
SIDECAR = "export.json"
HASH_MEMO = "hashes.json"  # in onnx/: sha256s by size and mtime (store.records.HashMemo)
GRAPH_CODE = ("onnx_graph.py", "onnx_trace.py", "onnxruntime_graph.py")  # engines/ files it comes from
MODEL_CODE = ("config.py", "decoder.py", "layers.py", "rope.py")  # models/ files the graph comes from
# Every key onnx_trace writes (prefixed "assistant."); export.json must carry them all.
METADATA_KEYS = tuple(
    f"assistant.{k}"
    for k in (
        "model_id", "model_source", "weights_sha256", "dtype", "opset", "cache_contract",
        "graph_code_sha256", "exporter", "onnx_version", "model_type", "num_layers",
        "num_kv_heads", "head_dim", "vocab_size", "max_position_embeddings",
    )
)  # fmt: skip


class ExportError(RuntimeError):
    """The decoder could not be exported, or the export cannot be written or read."""


@dataclass(frozen=True)
class ExportOptions:
    """What to export: ``dtype`` ``fp32``, ``fp16`` or ``bf16`` (weights, activations, KV cache)."""

    dtype: str = "fp32"
    opset: int = OPSET


@dataclass(frozen=True)
class ExportedDecoder:
    """An ONNX export on disk. ``export_s`` is 0 for a cache hit; ``notice`` says why not."""

    path: Path
    cache_hit: bool
    size_bytes: int
    metadata: dict[str, str]
    export_s: float = 0.0
    notice: str | None = None


@dataclass(frozen=True)
class ExportRecord:
    """``export.json``: each file's size and sha256, and the graph's metadata."""

    files: dict[str, tuple[int, str]]  # name -> (size in bytes, sha256)
    metadata: dict[str, str]

    @classmethod
    def parse(cls, data: Any) -> ExportRecord:
        """Check the shape of a decoded ``export.json`` as a whole.

        Raises:
            ValueError: Anything unexpected, naming the first field that is wrong.
        """
        if not isinstance(data, dict):
            raise ValueError(f"{type(data).__name__} where a JSON object belongs")
        files, metadata = data.get("files"), data.get("metadata")
        if not isinstance(files, dict) or not files:
            raise ValueError("'files' is missing, empty or not an object")
        if GRAPH_FILE not in files:
            raise ValueError(f"'files' does not list {GRAPH_FILE}")
        parsed: dict[str, tuple[int, str]] = {}
        for name, entry in files.items():
            if "/" in name or name.startswith(".") or name == SIDECAR:
                raise ValueError(f"'files' lists {name!r}, not a file of the export")
            size = entry.get("size") if isinstance(entry, dict) else None
            sha = entry.get("sha256") if isinstance(entry, dict) else None
            if type(size) is not int or size < 0 or not _is_sha256(sha):
                raise ValueError(f"'files' entry {name!r} is {entry!r}, not {{size, sha256}}")
            parsed[name] = (size, str(sha))
        if not isinstance(metadata, dict):
            raise ValueError("'metadata' is missing or not an object")
        missing = [k for k in METADATA_KEYS if not isinstance(metadata.get(k), str)]
        if missing:
            raise ValueError(f"'metadata' lacks {', '.join(missing)} (or they are not strings)")
        return cls(parsed, {str(k): str(v) for k, v in metadata.items()})

    @classmethod
    def read(cls, folder: Path) -> ExportRecord:
        """The checked ``export.json`` of ``folder``.

        Raises:
            FileNotFoundError: No record (an interrupted export).
            ValueError: Not JSON, or JSON of the wrong shape.
        """
        try:
            data = json.loads((folder / SIDECAR).read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(str(e)) from e
        return cls.parse(data)


def _is_sha256(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def past_names(num_layers: int) -> list[str]:
    """Cache input names, key then value of each layer: ``past_key_values.N.key``..."""
    return [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]


def present_names(num_layers: int) -> list[str]:
    """Cache output names, in the order of :func:`past_names`: ``present.N.key``..."""
    return [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]


def hash_memo(cache_dir: Path) -> HashMemo:
    """The sha256 memo of an ONNX cache folder (``<model>/onnx``)."""
    return HashMemo(cache_dir / HASH_MEMO)


def weights_sha256(model_dir: Path) -> str:
    """sha256 over ``config.json`` and the safetensors files (each memoized by size and mtime)."""
    files = sorted(p for p in model_dir.iterdir() if p.name == "config.json" or ".safetensors" in p.name)
    memo = hash_memo(model_dir / "onnx")
    digest = hashlib.sha256()
    for p in files:
        digest.update(f"{p.name}\0{memo.sha256(p)}\0".encode())
    return digest.hexdigest()


def graph_code_sha256() -> str:
    """sha256 of the code that defines the graph, so editing it invalidates cached exports."""
    digest = hashlib.sha256()
    here, model_code = Path(__file__), Path(models.__file__).parent  # no torch import
    graph_code = [here.with_name(f) for f in (GRAPH_CODE + (here.name,))]
    sources = [*graph_code, *(model_code / f for f in MODEL_CODE)]
    for source in sources:
        digest.update(source.read_bytes())
    return digest.hexdigest()


def export_folder(model_dir: Path, options: ExportOptions, weights_sha: str) -> Path:
    """The cache folder of this export (present or not)."""
    settings = f"{weights_sha}|{options.dtype}|opset{options.opset}|{CONTRACT}|{graph_code_sha256()}"
    key = hashlib.sha256(settings.encode()).hexdigest()[:16]
    return model_dir / "onnx" / f"decoder-{options.dtype}-{key}"


def check_export(folder: Path, expected: dict[str, str] | None = None, *, full: bool = False) -> str | None:
    """Why the export in ``folder`` is unusable, or ``None`` when every file matches its record.

    ``export.json`` must be of the expected shape as a whole (:class:`ExportRecord`), list
    every file of the folder (the graph at least), and carry the ``expected`` metadata. A
    file is hashed when its size or mtime changed since it was last hashed (the folder's
    :class:`~store.records.HashMemo`), or always with ``full``.
    """
    try:
        record = ExportRecord.read(folder)
    except FileNotFoundError:
        return f"{folder / SIDECAR} is missing (interrupted export?)"
    except (OSError, ValueError) as e:
        return f"{folder / SIDECAR} is unreadable ({e})"
    for key, value in (expected or {}).items():
        if record.metadata.get(key) != value:
            return f"{folder / SIDECAR} records {key} {record.metadata.get(key)!r}, not {value!r}"
    unlisted = sorted(p.name for p in folder.iterdir() if p.name != SIDECAR and p.name not in record.files)
    if unlisted:
        return f"{folder / SIDECAR} does not list {', '.join(unlisted)}"
    for name, (size, sha) in record.files.items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != size:
            return f"{path} has {path.stat().st_size} bytes, {size} expected (truncated?)"
        if hash_memo(folder.parent).sha256(path, full=full) != sha:
            return f"{path} does not match its recorded sha256 (corrupt)"
    return None


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def export_decoder(
    model_dir: Path, options: ExportOptions, *, force: bool = False, progress: ProgressCallback | None = None
) -> ExportedDecoder:
    """The ONNX export of the decoder in ``model_dir``: from the cache, or exported now.

    A cached export is checked against its recorded sha256 first; a corrupt, truncated or
    incomplete one is logged and exported again. Exporting loads the weights with PyTorch
    (SmolLM2-135M: ~15 s on 2 cores). ``progress`` hears of the cache hit or the export.

    Raises:
        ExportError: Unsupported dtype, an unwritable folder, or a failed export or check.
        ModelNotFound: No model in ``model_dir``.
    """
    if options.dtype not in DTYPES:
        raise ExportError(f"ONNX export dtype {options.dtype!r} unsupported; use {' or '.join(DTYPES)}")
    check_model_dir(model_dir)
    weights_sha = weights_sha256(model_dir)
    folder = export_folder(model_dir, options, weights_sha)
    expected = {"assistant.dtype": options.dtype, "assistant.weights_sha256": weights_sha}
    sweep_staging(folder.parent)  # what killed exports left (hidden, ~230 MB each)
    if folder.exists() and not force and check_export(folder, expected) is None:
        # A hit needs no lock (nor a writable folder): entries are replaced by a rename.
        emit(progress, Stage.CACHED, f"ONNX export cache hit ({options.dtype})", cache=Cache.ONNX_EXPORT)
        return ExportedDecoder(folder / GRAPH_FILE, True, _size(folder), ExportRecord.read(folder).metadata)
    # While it is written the export is there twice (the tracer's graph, then the saved one).
    need = 2 * parameter_count(model_dir) * (2 if options.dtype == "fp16" else 4)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(folder.parent).free < need:  # said before a 15 s export, not after
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        with lock_entry(folder, on_wait=lambda m: emit(progress, Stage.WAIT, m)):
            return _export_locked(model_dir, options, weights_sha, folder, force, progress)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            free = shutil.disk_usage(folder.parent).free
            raise ExportError(
                f"no space left under {folder.parent} for the ONNX export ({options.dtype}): it needs about "
                f"{need / 1e6:,.0f} MB while it is written ({need / 2e6:,.0f} MB kept), {free / 1e6:,.0f} MB "
                "are free; free some space there, or decode with --backend pytorch (no export)"
            ) from e
        raise ExportError(f"cannot write the ONNX export under {folder.parent}: {e}") from e


def _export_locked(
    model_dir: Path,
    options: ExportOptions,
    weights_sha: str,
    folder: Path,
    force: bool,
    progress: ProgressCallback | None,
) -> ExportedDecoder:
    """:func:`export_decoder` under the entry's lock: check again, else export.

    Checked again because another process may have exported it while this one waited.
    """
    notice = "forced" if force else None
    if folder.exists() and not force:
        expected = {"assistant.dtype": options.dtype, "assistant.weights_sha256": weights_sha}
        problem = check_export(folder, expected)
        if problem is None:
            metadata = ExportRecord.read(folder).metadata
            emit(progress, Stage.CACHED, f"ONNX export cache hit ({options.dtype})", cache=Cache.ONNX_EXPORT)
            return ExportedDecoder(folder / GRAPH_FILE, True, _size(folder), metadata)
        notice = f"cached export unusable, exporting again: {problem}"
        logger.warning("%s", notice)
    emit(progress, Stage.EXPORT, f"exporting ONNX ({options.dtype}), once per model", cache=Cache.ONNX_EXPORT)
    from engines.onnx_trace import trace_decoder  # torch and the tracer: only on a cache miss

    start = time.monotonic()
    with staging_dir(folder) as tmp:
        staged = Path(tmp) / "out"
        metadata = trace_decoder(model_dir, options, weights_sha, staged)
        publish_folder(staged, folder)
    _prune_stale(folder, weights_sha)
    export_s = time.monotonic() - start
    logger.info("exported %s (%s) to %s in %.1f s", model_dir.name, options.dtype, folder, export_s)
    return ExportedDecoder(folder / GRAPH_FILE, False, _size(folder), metadata, export_s, notice)


def _prune_stale(folder: Path, weights_sha: str) -> None:
    """Delete exports of this dtype from other weights or older graph code: none can be hit again."""
    dtype_prefix = folder.name.rsplit("-", 1)[0] + "-"
    current = (weights_sha, graph_code_sha256())
    for other in folder.parent.glob(f"{dtype_prefix}*"):
        if other == folder or not other.is_dir() or other.name.startswith("."):
            continue
        try:
            meta = ExportRecord.read(other).metadata
            made: tuple[str, str | None] = (
                meta["assistant.weights_sha256"],
                meta.get("assistant.graph_code_sha256"),
            )
        except (OSError, ValueError):
            made = ("", None)
        lock = EntryLock(other)
        if made != current and lock.acquire(wait=False):  # held: another process is writing it
            try:
                logger.info("removing stale export %s", other)
                shutil.rmtree(other, ignore_errors=True)
            finally:
                lock.release()
