"""What killed processes leave behind: staging folders in the model store, temporary folders.

A fetch or a GGUF conversion stages its model in a hidden ``<store>/models/.<name>-<random>/``
with an ``owner.pid`` file, then renames it into place; the TTS and ``serve`` name their
temporary folders with their pid. SIGKILL (or a power cut) skips every clean-up, so the next
start removes what a process that is gone left: only when the pid recorded is not alive, so a
second instance at work keeps its folders. A store staging folder without ``owner.pid`` (made
by a version before it) is removed once nothing in it changed for an hour, as the ONNX
export's are (:data:`engines.cache_lock.UNMARKED_STALE_S`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

OWNER = "owner.pid"  # in a staging folder: the pid of the process writing it
UNMARKED_STALE_S = 3600.0  # a staging folder without it: removed after an hour without changes


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (another user's counts: it is not ours to judge)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive, another user's
        return True
    return True


def folder_bytes(path: Path) -> int:
    """The size of the files under ``path`` (0 for what cannot be read)."""
    total = 0
    for p in path.rglob("*"):
        try:
            total += p.stat().st_size if p.is_file() else 0
        except OSError:
            continue
    return total


def _last_change_s(folder: Path) -> float:
    try:
        return max((p.stat().st_mtime for p in (folder, *folder.rglob("*"))), default=0.0)
    except OSError:
        return time.time()


def abandoned_staging(models_dir: Path, name: str = "*") -> list[Path]:
    """Staging folders ``.<name>-*`` of ``models_dir`` whose writer is gone (see the module)."""
    found: list[Path] = []
    if not models_dir.is_dir():
        return found
    for staged in sorted(models_dir.glob(f".{name}-*")):
        if not staged.is_dir():
            continue
        try:
            pid = int((staged / OWNER).read_text())
        except FileNotFoundError:
            if time.time() - _last_change_s(staged) >= UNMARKED_STALE_S:
                found.append(staged)
            continue
        except (OSError, ValueError):
            continue  # owner being written, or unreadable: not ours to judge
        if not pid_alive(pid):
            found.append(staged)
    return found


def sweep_staging(models_dir: Path, name: str = "*") -> list[tuple[Path, int]]:
    """Remove :func:`abandoned_staging` folders; each removed one with its size in bytes."""
    removed: list[tuple[Path, int]] = []
    for staged in abandoned_staging(models_dir, name):
        size = folder_bytes(staged)
        shutil.rmtree(staged, ignore_errors=True)
        if not staged.exists():
            logger.info("removed %s (%.0f MB), left by an interrupted fetch", staged, size / 1e6)
            removed.append((staged, size))
    return removed


@contextlib.contextmanager
def staging_folder(models_dir: Path, name: str) -> Iterator[Path]:
    """A hidden ``<models_dir>/.<name>-<random>/`` with ``owner.pid``; removed when the block ends.

    Folders of earlier writers of any name that are gone (:func:`sweep_staging`) are removed first.
    """
    models_dir.mkdir(parents=True, exist_ok=True)
    sweep_staging(models_dir)
    with tempfile.TemporaryDirectory(dir=models_dir, prefix=f".{name}-") as tmp:
        (Path(tmp) / OWNER).write_text(str(os.getpid()))
        yield Path(tmp)


def sweep_dead_pid_folders(parent: Path, prefix: str, pattern: re.Pattern[str] | None = None) -> list[Path]:
    """Remove folders ``<parent>/<prefix><pid>-*`` (and files) whose ``pid`` is not alive.

    For temporary folders named with their process id (``assistant-tts-<pid>-xxxx``); one
    of another user, or that cannot be removed, is left alone. ``pattern`` (group 1: the pid,
    matched in full) names them otherwise (``assistant<pid><uuid>`` shared-memory regions).
    """
    pattern = pattern or re.compile(re.escape(prefix) + r"(\d+)-.*")
    removed: list[Path] = []
    try:
        entries = list(parent.glob(f"{prefix}*"))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError as e:
            logger.debug("cannot remove %s: %s", entry, e)
            continue
        logger.info("removed %s, left by process %s, which is gone", entry, match.group(1))
        removed.append(entry)
    return removed
