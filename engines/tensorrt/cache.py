"""The engine cache: one folder per engine, keyed by everything that shaped it, plus tuning caches.

Layout under the cache folder (``<store>/engines`` in the app)::

    <model>-<flavour>-<target>-<precision>-<key>/decoder.engine   the serialized engine
    <model>-<flavour>-<target>-<precision>-<key>/engine.json      what it was built from and for,
                                                                  size + sha256; written last;
                                                                  ``verified``: the accuracy gate
    _caches/timing-<flavour>-<version>-<gpu>.bin                  TensorRT timing cache
    _caches/runtime-<flavour>-<version>-<gpu>.bin                 TensorRT-RTX runtime cache
    _caches/calibration-<onnx sha>-<snippets sha>-<length>tok-<flavour>-<version>.bin
                                                                  INT8 calibration scales

``key`` hashes the ONNX files (their sha256), the build options, the flavour and its version,
the targets and the builder code. An entry is reused only when its record says exactly that
(else it is "foreign": another TensorRT version or GPU) and the engine file matches its size and
sha256 (else truncated or corrupt); anything else is reported and rebuilt. A record whose
fields have unexpected types (or that lacks the engine's size and sha256) is unusable as a
whole: listed as such and rebuilt, never half-read. A build holds its entry's lock
(``engines/cache_lock.py``, ``_locks/<entry>.lock``) from the cache check until the engine is
in place; ``assistant engine clear`` skips entries whose lock is held. Tuning caches carry a
small header with their own sha256, so a damaged one is ignored with a warning instead of
reaching TensorRT (``tuning.py``).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.cache_lock import LOCKS_DIR, EntryLock, staging_dir, sweep_staging
from store.records import HashMemo, publish_folder, write_json_atomic

logger = logging.getLogger(__name__)

ENGINE_FILE = "decoder.engine"
RECORD_FILE = "engine.json"
HASH_MEMO = "hashes.json"  # engines' sha256s by size and mtime (store.records.HashMemo)
FAILED_FILE = "build-failed.json"  # a build that failed: why, and when (no engine beside it)
CACHES_DIR = "_caches"
# Fields of engine.json that must equal what the caller expects; a difference means foreign.
IDENTITY = ("key", "flavour", "version", "targets", "device", "precision", "onnx_sha256")
# The JSON type each field of engine.json must have when present ("engine" must be).
RECORD_TYPES: dict[str, type | tuple[type, ...]] = {
    **{name: str for name in ("key", "flavour", "version", "device", "precision", "onnx_sha256")},
    **{name: str for name in ("model_id", "contract", "builder_code_sha256", "built_at")},
    "targets": list,
    "strongly_typed": bool,
    "workspace_mib": int,
    "optimization_level": int,
    "build_s": (int, float),
    "profile": dict,
    "onnx": dict,
    "verified": (dict, type(None)),
    "engine": dict,
}


def engine_key(identity: dict[str, Any]) -> str:
    """sha256 over a canonical JSON of everything that shapes an engine."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def slug(text: str) -> str:
    """A file-name-safe form of ``text`` (GPU names, versions)."""
    return "".join(c if c.isalnum() or c in ".-+" else "_" for c in text).strip("_") or "unknown"


@dataclass(frozen=True)
class EngineEntry:
    """One cache folder as ``assistant engine list`` shows it; ``problem`` is why it is unusable."""

    folder: Path
    record: dict[str, Any]
    size_bytes: int
    problem: str | None

    @property
    def engine_path(self) -> Path:
        """The serialized engine inside the folder."""
        return self.folder / ENGINE_FILE

    def describe(self) -> str:
        """``tensorrt-rtx 1.7.1.116 sm89 fp16, prefill 1/128/512, context 2048, accuracy gate ...``."""
        r = self.record
        if not r:
            return self.problem or "no record"
        p = r.get("profile", {})
        state = f"accuracy gate {gate_summary(r.get('verified'))}"
        return (
            f"{r.get('model_id', '?')}: {r.get('flavour', '?')} {r.get('version', '?')} "
            f"{','.join(r.get('targets', []))} {r.get('precision', '?')}, prefill "
            f"{p.get('prefill_min_tokens')}/{p.get('prefill_opt_tokens')}/{p.get('prefill_max_tokens')}, "
            f"context {p.get('context_max_tokens')}, {state}"
        )


def gate_summary(verified: dict[str, Any] | None) -> str:
    """An engine's accuracy-gate verdict (its record's ``verified``) in words.

    ``passed (agreement 100.0%, logits error 2.1e-03, ROUGE-L 1.000; start-up gate 2026-12-03)``,
    ``FAILED (...): token agreement 3.1% < 90%`` or ``not checked``.
    """
    if not verified:
        return "not checked"
    numbers = []
    for key, form in (("token_agreement", "agreement {:.1%}"), ("max_logits_rel_err", "logits error {:.1e}")):
        if isinstance(verified.get(key), int | float):
            numbers.append(form.format(verified[key]))
    if isinstance(verified.get("rouge_l"), int | float):
        numbers.append(f"ROUGE-L {verified['rouge_l']:.3f}")
    day = str(verified.get("checked_at") or "")[:10]
    when = " ".join(str(w) for w in (verified.get("checked_by"), day) if w)
    detail = f" ({', '.join(numbers)}{'; ' + when if when else ''})" if numbers or when else ""
    if verified.get("passed"):
        return f"passed{detail}"
    failures = verified.get("failures") or []
    return f"FAILED{detail}" + (f": {'; '.join(str(f) for f in failures)}" if failures else "")


def check_record(record: Any) -> None:
    """Check the shape of a decoded engine.json as a whole.

    Raises:
        ValueError: Not an object, no engine size and sha256, or a field of another type
            than this code writes (names the field).
    """
    if not isinstance(record, dict):
        raise ValueError(f"{type(record).__name__} where a JSON object belongs")
    for name, kinds in RECORD_TYPES.items():
        value = record.get(name)
        if name not in record and name != "engine":
            continue
        if not isinstance(value, kinds) or (isinstance(value, bool) and kinds is not bool):
            raise ValueError(f"{name!r} is {value!r}, of the wrong type")
    engine, verified = record["engine"], record.get("verified")
    if type(engine.get("size")) is not int or not isinstance(engine.get("sha256"), str):
        raise ValueError(f"'engine' is {engine!r}, not {{size, sha256}}")
    if not all(isinstance(t, str) for t in record.get("targets", [])):
        raise ValueError(f"'targets' is {record['targets']!r}, not a list of names")
    if verified is not None and not isinstance(verified.get("passed"), bool):
        raise ValueError(f"'verified' is {verified!r}, without a true/false 'passed'")
    profile = record.get("profile", {})
    if not all(isinstance(v, int | None) for v in profile.values()):
        raise ValueError(f"'profile' is {profile!r}, not token counts")


def read_record(folder: Path) -> dict[str, Any]:
    """The engine.json of ``folder``, checked by :func:`check_record`.

    Raises:
        FileNotFoundError: No record (an interrupted build).
        ValueError: Not JSON, or JSON of the wrong shape.
    """
    try:
        record = json.loads((folder / RECORD_FILE).read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(str(e)) from e
    check_record(record)
    return dict(record)


def read_failure(folder: Path) -> dict[str, Any] | None:
    """The failed build recorded in ``folder`` (``reason``, ``failed_at``), or ``None``."""
    try:
        failure = json.loads((folder / FAILED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return failure if isinstance(failure, dict) else None


def write_failure(folder: Path, reason: str) -> None:
    """Record that building the engine of ``folder`` failed (written atomically)."""
    folder.mkdir(parents=True, exist_ok=True)
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    write_json_atomic(folder / FAILED_FILE, {"reason": reason, "failed_at": when}, indent=2, sort_keys=False)


def check_entry(folder: Path, expected: dict[str, Any] | None = None, *, full: bool = False) -> str | None:
    """Why the engine in ``folder`` cannot be reused, or ``None`` when it can.

    Args:
        folder: A cache folder.
        expected: Identity fields (:data:`IDENTITY`) the record must carry; ``None`` checks
            the files only.
        full: Hash the engine even when its size and mtime are those it had when last
            hashed (``<cache>/hashes.json``, :class:`~store.records.HashMemo`).
    """
    try:
        record = read_record(folder)
        size, sha = int(record["engine"]["size"]), str(record["engine"]["sha256"])
    except FileNotFoundError:
        if (failure := read_failure(folder)) is not None:
            return f"build failed {str(failure.get('failed_at'))[:10]}: {failure.get('reason')}"
        return f"{folder / RECORD_FILE} is missing (interrupted build?)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{folder / RECORD_FILE} is unreadable ({e})"
    for field in IDENTITY if expected is not None else ():
        if record.get(field) != expected.get(field):  # type: ignore[union-attr]
            return (
                f"foreign engine: built with {field} {record.get(field)!r}, this build needs "
                f"{expected.get(field)!r}"  # type: ignore[union-attr]
            )
    path = folder / ENGINE_FILE
    if not path.is_file():
        return f"{path} is missing"
    if path.stat().st_size != size:
        return f"{path} has {path.stat().st_size} bytes, {size} expected (truncated?)"
    if HashMemo(folder.parent / HASH_MEMO).sha256(path, full=full) != sha:
        return f"{path} does not match its recorded sha256 (corrupt)"
    return None


def write_entry(folder: Path, engine: memoryview | bytes, record: dict[str, Any]) -> dict[str, Any]:
    """Stage the engine and its record in a temporary folder, then rename it into place.

    Returns the record as written (with the engine's size and sha256 added).
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    data = memoryview(engine)
    with staging_dir(folder) as tmp:
        staged = Path(tmp) / "out"
        staged.mkdir()
        (staged / ENGINE_FILE).write_bytes(data)
        full = {**record, "engine": {"size": data.nbytes, "sha256": hashlib.sha256(data).hexdigest()}}
        (staged / RECORD_FILE).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
        publish_folder(staged, folder)
    return full


def update_record(folder: Path, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into an entry's record (atomically: write, then rename)."""
    record = {**read_record(folder), **fields}
    write_json_atomic(folder / RECORD_FILE, record, indent=2)
    return record


def _folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def list_entries(cache_dir: Path, *, check_files: bool = True, full: bool = False) -> list[EngineEntry]:
    """Every engine folder, sorted by name; ``check_files`` also checks each engine's hash.

    ``full`` hashes every engine, even one whose size and mtime match its memo.
    """
    if not cache_dir.is_dir():
        return []
    entries = []
    for folder in sorted(p for p in cache_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        try:
            record = read_record(folder)
        except (OSError, ValueError) as e:
            record = {}
            logger.info("%s: unusable record (%s)", folder, e)
        problem = check_entry(folder, full=full) if check_files or not record else None
        entries.append(EngineEntry(folder, record, _folder_size(folder), problem))
    return entries


@dataclass(frozen=True)
class Cleared:
    """What :func:`clear_entries` did.

    ``removed`` entries; ``busy`` ones skipped because a build holds them (with the builder's
    pid); ``swept`` staging folders of interrupted builds (with their sizes in bytes).
    """

    removed: list[EngineEntry]
    busy: list[tuple[EngineEntry, str]]
    swept: list[tuple[Path, int]]


def clear_entries(cache_dir: Path, keep: Callable[[EngineEntry], bool] = lambda _e: False) -> Cleared:
    """Delete the engine folders ``keep`` rejects (all by default), except those being built.

    Each folder is deleted under its entry lock, so a build in progress (which holds it) keeps
    its entry; staging folders of interrupted builds are swept.
    """
    removed, busy = [], []
    entries = list_entries(cache_dir, check_files=False)
    for entry in entries:
        lock = EntryLock(entry.folder)
        if not lock.acquire(wait=False):
            busy.append((entry, lock.holder()))
            continue
        try:
            if not keep(entry):
                shutil.rmtree(entry.folder, ignore_errors=True)
                removed.append(entry)
        finally:
            lock.release()
    # First builds of an entry have no folder yet: their lock alone says they are running.
    known = {e.folder.name for e in entries}
    for lock_file in sorted((cache_dir / LOCKS_DIR).glob("*.lock")) if cache_dir.is_dir() else ():
        lock = EntryLock(cache_dir / lock_file.stem)
        if lock_file.stem not in known and not lock.acquire(wait=False):
            busy.append((EngineEntry(lock.folder, {}, 0, "being built"), lock.holder()))
        lock.release()
    # As before the locks, clearing takes every unlocked staging folder, old versions' too.
    return Cleared(removed, busy, sweep_staging(cache_dir, unmarked_stale_s=0.0))
