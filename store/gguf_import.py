"""A GGUF file named with ``--model``: converted once into the store, keyed by its sha256.

Layout under the store root::

    models/<stem>-<sha12>/        the converted folder (fp32 safetensors, tokenizer, config)
        assistant-model.json      "source": "gguf:<path>", the file's sha256 and size, and the
                                  record of every file written (as for the bundled models)
    gguf-hashes.json              <resolved path> -> {size, mtime_ns, sha256}: the second start
                                  does not hash a multi-GB file again; a file that changed
                                  (size or modification time) is hashed, and converted, anew

The folder is written under a temporary name in ``models/`` and renamed when complete, so an
interrupted conversion leaves no folder that looks like a model.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from models.weights import ModelNotFound, check_model_dir
from store.bundled import FILES, MANIFEST, FetchError, ModelStore, record_files, sha256_file
from store.gguf import Step, convert_gguf, inspect_gguf

logger = logging.getLogger(__name__)

HASHES = "gguf-hashes.json"
OWNER = "owner.pid"  # in a conversion's temporary folder: the process writing it
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


class _HashRecord:
    """``gguf-hashes.json``: a file's sha256, valid while its size and mtime are unchanged."""

    def __init__(self, root: Path) -> None:
        self.path = root / HASHES

    def _read(self) -> dict[str, dict[str, object]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}  # none yet, or damaged: files are hashed again
        return data if isinstance(data, dict) else {}

    def sha256(self, gguf: Path, step: Step) -> str:
        key = str(gguf.resolve())
        st = gguf.stat()
        entry = self._read().get(key)
        if (
            isinstance(entry, dict)
            and entry.get("size") == st.st_size
            and entry.get("mtime_ns") == st.st_mtime_ns
            and isinstance(entry.get("sha256"), str)
        ):
            return str(entry["sha256"])
        step(f"hashing {gguf.name} ({st.st_size / 1e9:.2f} GB)", 0.0)
        digest = sha256_file(gguf)
        self._write(key, {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest})
        return digest

    def _write(self, key: str, entry: dict[str, object]) -> None:
        data = self._read()
        data[key] = entry
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{HASHES}-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1)
            os.replace(tmp, self.path)
        except OSError as e:  # only a speed-up: the next start hashes again
            logger.warning("could not record the sha256 of %s in %s (%s)", key, self.path, e)


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


def _remove_abandoned(models_dir: Path, name: str) -> None:
    """Remove the temporary folders of conversions of ``name`` whose process is gone (killed)."""
    for tmp in models_dir.glob(f".{name}-*"):
        try:
            pid = int((tmp / OWNER).read_text())
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (OSError, ValueError):
            continue  # no owner recorded yet, or not ours to judge


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
    sha256 = _HashRecord(store.root).sha256(gguf, step)
    for folder in sorted(store.models_dir.glob(f"*-{sha256[:12]}")):  # any name: a copy elsewhere
        if store.is_present(folder.name) and _manifest(folder).get("gguf_sha256") == sha256:
            check_model_dir(folder)
            return folder
    return None


def _manifest(folder: Path) -> dict[str, object]:
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


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
    sha256 = _HashRecord(store.root).sha256(gguf, step)
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
        _remove_abandoned(store.models_dir, name)
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
        (staged / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if not store.is_present(name):  # else another start converted it meanwhile: use that
            if target.exists():  # an incomplete folder (no manifest): not ours to keep
                shutil.rmtree(target)
            staged.rename(target)
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
