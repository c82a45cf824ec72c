"""A GGUF file named with ``--model``: converted once into the store, keyed by its sha256.

Layout under the store root::

    models/<stem>-<sha12>/        the converted folder (fp32 safetensors, tokenizer, config)
        assistant-model.json      "source": "gguf:<path>", the file's sha256 and size, and the
                                  record of every file written (as for the bundled models)
    gguf-hashes.json              <resolved path> -> {stamp: [size, mtime_ns], sha256}
                                  (store.records.HashMemo): the second start
                                  does not hash a multi-GB file again; a file that changed
                                  (size or modification time) is hashed, and converted, anew

The folder is written under a temporary name in ``models/`` and renamed when complete, so an
interrupted conversion leaves no folder that looks like a model.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from models.files import ModelNotFound
from store.bundled import FetchError, ModelStore
from store.gguf import Step, convert_gguf, inspect_gguf
from store.leftovers import OWNER, sweep_staging
from store.records import FILES, MANIFEST, HashMemo, check_model, publish_folder, read_manifest, record_files

logger = logging.getLogger(__name__)

HASHES = "gguf-hashes.json"
OLLAMA_BLOB = re.compile(r"sha256-[0-9a-f]{64}")  # ~/.ollama/models/blobs/sha256-<hex>
SPLIT = re.compile(r"-\d{5}-of-\d{5}$")  # llama.cpp's split files: model-00001-of-00003.gguf
HEADROOM_BYTES = 64 << 20  # tokenizer, config and safetensors headers besides the weights


def find_gguf(path: Path) -> Path | None:
    """The GGUF file ``path`` names: itself, or the one ``.gguf`` in a folder; else ``None``.

    Any file is taken for a GGUF, whatever its name (Ollama's blobs have none; a file that is
    no GGUF is named so by :func:`store.gguf.inspect_gguf`). A folder with a ``config.json``
    is a Hugging Face folder, not a GGUF one.

    Raises:
        ModelNotFound: A folder holds several GGUF files (lists them), or split GGUF parts.
    """
    if path.is_file():
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ModelNotFound(
            f"{path} holds {len(found)} GGUF files ({names}); name one: --model {found[0]}"
            + ("; split parts must be merged first (llama-gguf-split --merge)" if _split(found[0]) else "")
        )
    return found[0] if found else None


def _split(path: Path) -> bool:
    return SPLIT.search(path.stem) is not None


def _gguf_sha256(gguf: Path, store: ModelStore, step: Step) -> str:
    """The file's sha256, remembered in ``gguf-hashes.json`` while its size and mtime hold."""
    size_gb = gguf.stat().st_size / 1e9
    return HashMemo(store.root / HASHES).sha256(
        gguf, on_hash=lambda _f: step(f"hashing {gguf.name} ({size_gb:.2f} GB)", 0.0)
    )


def store_name(gguf: Path, sha256: str) -> str:
    """The converted folder's name: ``<stem>-<first 12 hex digits of the sha256>``."""
    stem = "ollama-blob" if OLLAMA_BLOB.fullmatch(gguf.name) else gguf.stem
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip(".-") or "model"
    return f"{stem}-{sha256[:12]}"


def _store_error(store: ModelStore, e: OSError, need_bytes: int) -> FetchError:
    where = store.models_dir
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return FetchError(
            f"no space left in {where} for the converted model (~{need_bytes / 1e6:,.0f} MB of fp32 "
            "weights): free some space, or put the store on a larger disk with --store DIR"
        )
    return FetchError(
        f"cannot write the converted model into the store {where} ({e.strerror or e}): "
        "make it writable, or choose another store with --store DIR"
    )


def stored_gguf_dir(gguf: Path, store: ModelStore, step: Step) -> Path | None:
    """The store folder converted from ``gguf`` earlier, or ``None``.

    Hashes the file unless ``gguf-hashes.json`` knows it at this size and modification time
    (``step`` hears the hashing).

    Raises:
        ModelNotFound: The file is missing.
        CorruptModel: The stored folder is damaged (names the fix).
    """
    if not gguf.is_file():
        raise ModelNotFound(f"no such GGUF file {gguf}; check the path given to --model")
    sha256 = _gguf_sha256(gguf, store, step)
    for folder in sorted(store.models_dir.glob(f"*-{sha256[:12]}")):  # any name: a copy elsewhere
        if store.is_present(folder.name) and read_manifest(folder).get("gguf_sha256") == sha256:
            check_model(folder)
            return folder
    return None


def convert_into_store(gguf: Path, store: ModelStore, step: Step) -> Path:
    """Convert ``gguf`` into its store folder (``<stem>-<sha12>``), replacing nothing complete.

    The file is checked first (:func:`store.gguf.inspect_gguf`), then the store's room;
    the folder appears, complete, only at the end.

    Raises:
        ModelNotFound: The file is missing.
        CorruptModel, UnsupportedModel: A damaged file, an architecture or a quantisation
            that cannot be used.
        FetchError: The store is not writable, or has no room for the converted weights.
    """
    if not gguf.is_file():
        raise ModelNotFound(f"no such GGUF file {gguf}; check the path given to --model")
    sha256 = _gguf_sha256(gguf, store, step)
    name = store_name(gguf, sha256)
    target = store.path(name)
    step(f"reading {gguf.name}", 0.0)
    info = inspect_gguf(gguf)  # refuse before touching the store
    need = info.fp32_bytes + HEADROOM_BYTES
    try:
        store.models_dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(store.models_dir).free
        if free < need:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        sweep_staging(store.models_dir)  # what killed fetches and conversions left
        tmp = tempfile.mkdtemp(dir=store.models_dir, prefix=f".{name}-")
        Path(tmp, OWNER).write_text(str(os.getpid()))
    except OSError as e:
        raise _store_error(store, e, need) from e
    logger.warning("converting %s into the store (once): %s", gguf, target)
    try:
        staged = Path(tmp) / "out"
        convert_gguf(gguf, staged, step, info)
        manifest = {
            "kind": "llm",
            "source": f"gguf:{gguf.resolve()}",
            "gguf_sha256": sha256,
            "gguf_size": gguf.stat().st_size,
            "architecture": info.architecture,
            "tensor_types": info.tensor_types,
            "dtype": "fp32",
            FILES: record_files(staged),
        }
        if not store.is_present(name):  # else another start converted it meanwhile: use that
            # An incomplete folder at ``target`` (no manifest) is not ours to keep: replaced.
            publish_folder(staged, target, record=(MANIFEST, manifest))
    except ModelNotFound:
        raise
    except OSError as e:
        raise _store_error(store, e, need) from e
    except Exception as e:
        if not any(s in str(e) for s in ("No space left", "os error 28")):
            raise
        # safetensors reports a full disk as SafetensorError ("... (os error 28)"), not OSError.
        raise _store_error(store, OSError(errno.ENOSPC, str(e)), need) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
