"""The tuning caches beside the engines, each behind a small header with its own sha256.

TensorRT's timing cache, TensorRT-RTX's runtime cache and the INT8 calibration scales live in
``<cache>/_caches`` (``cache.CACHES_DIR``). A damaged or foreign one (bad header, tag, size or
sha256) is ignored with a warning instead of reaching TensorRT, which then starts from an empty
cache; saving one that cannot be written is only a warning too.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from engines.tensorrt.cache import CACHES_DIR
from store.files import atomic_write

logger = logging.getLogger(__name__)

BLOB_MAGIC = b"assistant-trt-cache/1\n"


def tuning_caches(cache_dir: Path) -> list[Path]:
    """The timing, runtime and calibration cache files."""
    folder = cache_dir / CACHES_DIR
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def load_blob(path: Path, tag: str) -> bytes | None:
    """The payload of a tuning cache written by :func:`save_blob`, or ``None``.

    A missing file is silent; a damaged or foreign one (bad header, tag, size or sha256) is
    logged as a warning and ignored: the caller starts with an empty cache.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        logger.warning("cannot read %s, starting without it: %s", path, e)
        return None
    problem = None
    if not data.startswith(BLOB_MAGIC):
        problem = "not an assistant tuning cache"
    else:
        header, _, payload = data[len(BLOB_MAGIC) :].partition(b"\n")
        try:
            meta = json.loads(header)
            if meta["tag"] != tag:
                problem = f"made for {meta['tag']!r}, not {tag!r}"
            elif meta["size"] != len(payload) or meta["sha256"] != hashlib.sha256(payload).hexdigest():
                problem = "size or sha256 mismatch (truncated or corrupt)"
        except (ValueError, KeyError, TypeError) as e:
            problem = f"unreadable header ({e})"
    if problem:
        logger.warning("ignoring %s (%s); it will be rebuilt", path, problem)
        return None
    return payload


def save_blob(path: Path, payload: bytes, tag: str) -> None:
    """Write a tuning cache with its header (atomically); a failure is only a warning."""
    header = json.dumps({"tag": tag, "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as f:
            f.write(BLOB_MAGIC + header.encode() + b"\n" + payload)
    except OSError as e:
        logger.warning("cannot save %s: %s", path, e)
