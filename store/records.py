"""Records of stored files: one sha256, the model manifest, hash memos and staged writes.

Every cache and stored model is written the same way (:func:`publish_folder`,
:func:`write_json_atomic`): staged under a hidden name in the same folder and renamed into
place, its record written last, so an interrupted write never looks complete.

Large files are checked at start by their record's size and a memo of when they were last
hashed (:class:`HashMemo`: size and modification time): a file whose size or mtime changed
is hashed again. A byte changed in place with its mtime set back is not seen at start; only
``assistant models verify`` (every byte of every recorded file) finds it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from models.config import InvalidConfig
from models.files import FETCH_HINT, CorruptModel, check_model_dir
from store.files import atomic_write

logger = logging.getLogger(__name__)

MANIFEST = "assistant-model.json"
FILES = "files"  # the manifest's record of each file: {"size", "sha256", "sample_sha256"}
SAMPLE_BLOCKS = 64  # a sampled sha256 reads 64 blocks of 64 KiB spread over the file
SAMPLE_BLOCK_BYTES = 1 << 16
HASH_BLOCK_BYTES = 1 << 22


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(HASH_BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def sample_sha256(path: Path) -> str:
    """Hex sha256 of 64 blocks of 64 KiB spread evenly over a file (all of it up to 4 MiB).

    The cheap check at load: 11 ms for SmolLM2's 538 MB against 3.2 s for the full hash.
    """
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        if size <= SAMPLE_BLOCKS * SAMPLE_BLOCK_BYTES:
            digest.update(f.read())
            return digest.hexdigest()
        for i in range(SAMPLE_BLOCKS):
            f.seek(i * (size - SAMPLE_BLOCK_BYTES) // (SAMPLE_BLOCKS - 1))
            digest.update(f.read(SAMPLE_BLOCK_BYTES))
    return digest.hexdigest()


def stamp(path: Path) -> list[int]:
    """``[size in bytes, modification time in ns]``: what a memoized hash is keyed by."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


class HashMemo:
    """sha256s of large files, remembered in one JSON file by each file's size and mtime.

    A file of the same size and modification time as when it was hashed is not read again
    (unless ``full``); anything else is hashed and remembered. The memo is only a speed-up:
    one that cannot be read or written costs hashing again, nothing else.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def sha256(self, file: Path, *, full: bool = False, on_hash: Any = None) -> str:
        """The sha256 of ``file``: remembered, or (changed, unknown or ``full``) hashed now.

        ``on_hash`` (a callable taking ``file``) hears when the file is read in full.
        """
        key, now = str(file.resolve()), stamp(file)
        entry = self._read().get(key)
        if (
            not full
            and isinstance(entry, dict)
            and entry.get("stamp") == now
            and isinstance(entry.get("sha256"), str)
        ):
            return str(entry["sha256"])
        if on_hash is not None:
            on_hash(file)
        digest = sha256_file(file)
        data = self._read()
        data[key] = {"stamp": now, "sha256": digest}
        try:
            write_json_atomic(self.path, data)
        except OSError as e:  # only a speed-up: the next start hashes again
            logger.debug("cannot write %s: %s", self.path, e)
        return digest


def write_json_atomic(path: Path, data: Any, *, indent: int = 1, sort_keys: bool = True) -> None:
    """Write ``data`` as JSON to ``path`` whole or not at all (:func:`store.files.atomic_write`).

    Raises:
        OSError: The folder cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        f.write((json.dumps(data, indent=indent, sort_keys=sort_keys) + "\n").encode())


def publish_folder(staged: Path, target: Path, *, record: tuple[str, Any] | None = None) -> None:
    """Rename the complete folder ``staged`` to ``target``, replacing what was there.

    ``record`` (file name, JSON data) is written into ``staged`` first: the record comes last,
    so a folder with one is complete. ``staged`` must be on the file system of ``target``.
    """
    if record is not None:
        name, data = record
        (staged / name).write_text(json.dumps(data, indent=2) + "\n")
    if target.exists():
        shutil.rmtree(target)
    staged.rename(target)


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a stored model, or ``{}`` when it is missing or unreadable."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record_files(folder: Path) -> dict[str, dict[str, Any]]:
    """Size, sha256 and sampled sha256 of every file in a freshly written model folder."""
    return {
        p.relative_to(folder).as_posix(): {
            "size": p.stat().st_size,
            "sha256": sha256_file(p),
            "sample_sha256": sample_sha256(p),
        }
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def recorded_files(folder: Path) -> dict[str, dict[str, Any]] | None:
    """The file record of a stored model, or ``None`` when its manifest has none (an older fetch).

    Raises:
        ValueError: The manifest or its record is unreadable or of the wrong shape.
    """
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{folder / MANIFEST} is unreadable ({e})") from e
    if not isinstance(manifest, dict):
        raise ValueError(f"{folder / MANIFEST} is not a JSON object")
    files = manifest.get(FILES)
    if files is None:
        return None
    valid = (
        isinstance(files, dict)
        and bool(files)
        and all(
            isinstance(r, dict)
            and type(r.get("size")) is int
            and isinstance(r.get("sha256"), str)
            and isinstance(r.get("sample_sha256"), str)
            for r in files.values()
        )
    )
    if not valid:
        raise ValueError(f"{folder / MANIFEST} has a {FILES!r} record of the wrong shape")
    return files


def check_files(folder: Path, *, full: bool = False) -> str | None:
    """Why the recorded files of the model in ``folder`` are damaged, or ``None``.

    Cheap by default (each file's size and sampled sha256: ~11 ms for 538 MB); ``full``
    hashes every byte (3.2 s for 538 MB). A folder without a manifest or without a file
    record (fetched by an older version) passes: there is nothing to check against.
    """
    if not (folder / MANIFEST).is_file():
        return None
    try:
        files = recorded_files(folder)
    except ValueError as e:
        return str(e)
    for name, expected in (files or {}).items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return f"{path} has {size} bytes, {expected['size']} recorded (truncated or replaced?)"
        if full and sha256_file(path) != expected["sha256"]:
            return f"{path} does not match its recorded sha256 (damaged)"
        if not full and sample_sha256(path) != expected["sample_sha256"]:
            return f"{path} does not match its recorded sha256 (damaged)"
    return None


def repair_hint(folder: Path) -> str:
    """The fix for damaged files in a model folder: fetch a stored model again, else replace it."""
    if (folder / MANIFEST).is_file():
        source = read_manifest(folder).get("source", "")
        source = source if isinstance(source, str) else ""
        if source.startswith("gguf:"):
            return f"delete {folder}; the next start converts {source.removeprefix('gguf:')} again"
        return f"run 'assistant models fetch --force {folder.name}'"
    return f"replace {folder} with an intact copy of the model"


@contextlib.contextmanager
def repair_hints(folder: Path) -> Iterator[None]:
    """Add the fix (:func:`repair_hint`) to a damaged-model error raised inside.

    ``models/`` names the file and the problem only; a message that already names a fix
    (``FETCH_HINT`` or this hint) is left as it is. The error keeps its type, chained ``from`` the original.
    """
    try:
        yield
    except (CorruptModel, InvalidConfig) as e:
        text, hint = str(e), repair_hint(folder)
        if FETCH_HINT in text or hint in text:
            raise
        raise type(e)(f"{text}; {hint}") from e


def check_model(folder: Path) -> None:
    """Check a decoder folder: config and weights present, recorded files intact (cheaply).

    Raises:
        ModelNotFound: No config or no weights.
        CorruptModel: A recorded file is missing, of another size or another sampled sha256
            (the message names the file and the fix).
    """
    with repair_hints(folder):
        check_model_dir(folder)
    problem = check_files(folder)
    if problem:
        raise CorruptModel(f"damaged model files: {problem}; {repair_hint(folder)}")
