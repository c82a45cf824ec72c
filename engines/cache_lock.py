"""One lock per cache entry (ONNX export or TensorRT engine), and the sweep of stale staging.

A build or export holds its entry's lock from the cache check until the entry is in place;
``engine clear`` takes the same lock without waiting and skips an entry whose lock is held.
The locks are ``fcntl.flock`` locks on ``<cache>/_locks/<entry>.lock``: the kernel releases
them when their process dies, however it dies, so "nobody holds the lock" is exactly "no
live process is writing this entry". That is also how a staging folder is known to be stale:
entries are staged in ``<cache>/.<entry>-<random>/`` (hidden, then renamed into place) with an
``owner`` file, and a staging folder with that file whose entry lock is free was left by a
killed process. A staging folder without it was made by a version before these locks, which
may still be running (an upgrade, two checkouts sharing a store): it is swept once nothing in
it changed for :data:`UNMARKED_STALE_S`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

LOCKS_DIR = "_locks"
OWNER_FILE = "owner"  # in a staging folder: made by a process that holds the entry lock
UNMARKED_STALE_S = 3600.0  # a staging folder without it: swept after an hour without changes
POLL_S = 0.1


class EntryLock:
    """The exclusive lock of one cache entry (``folder``), held while it is written or deleted."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder.parent / LOCKS_DIR / f"{folder.name}.lock"
        self._fd: int | None = None

    def acquire(self, *, wait: bool = True, cancel: threading.Event | None = None) -> bool:
        """Take the lock; returns ``False`` if another process holds it (or ``cancel`` was set).

        ``wait`` polls until it is free (every 0.1 s, so ``cancel`` can stop the wait).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait or (cancel is not None and cancel.is_set()):
                    os.close(fd)
                    return False
                time.sleep(POLL_S)
                continue
            break
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # for humans: who holds it
        self._fd = fd
        return True

    def release(self) -> None:
        """Let go of the lock (idempotent); the lock file stays, empty of meaning."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def holder(self) -> str:
        """The pid written by the process holding the lock, or ``?``."""
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def __enter__(self) -> EntryLock:
        if self._fd is None:
            self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


def lock_entry(
    folder: Path, cancel: threading.Event | None = None, on_wait: Callable[[str], None] | None = None
) -> EntryLock:
    """``folder``'s lock, acquired (after another process lets go of it, if one holds it).

    Use it as ``with lock_entry(folder): ...``. ``on_wait`` hears once that a wait started
    (another build or export of the same entry).

    Raises:
        InterruptedError: ``cancel`` was set while waiting.
    """
    lock = EntryLock(folder)
    if not lock.acquire(wait=False):
        if on_wait is not None:
            on_wait(f"waiting for process {lock.holder()}, which is making {folder.name}")
        if not lock.acquire(cancel=cancel):
            raise InterruptedError(f"cancelled while waiting for the lock of {folder.name}")
    return lock


@contextlib.contextmanager
def staging_dir(folder: Path) -> Iterator[str]:
    """A hidden temporary folder beside ``folder`` to stage it in (``.<name>-<random>``).

    Hold ``folder``'s lock while it exists: its ``owner`` file tells :func:`sweep_staging`
    that a free lock means its process is gone.
    """
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}-") as tmp:
        (Path(tmp) / OWNER_FILE).write_text(f"{os.getpid()}\n")
        yield tmp


def _last_change_s(folder: Path) -> float:
    return max((p.stat().st_mtime for p in (folder, *folder.rglob("*"))), default=0.0)


def sweep_staging(cache_dir: Path, unmarked_stale_s: float = UNMARKED_STALE_S) -> list[tuple[Path, int]]:
    """Delete staging folders of ``cache_dir`` that no live process is writing.

    Returns each removed folder with its size in bytes. A staging folder whose entry lock is
    held (an export or build in progress) is kept; so is one without an ``owner`` file (an
    older version's, maybe running) that changed within ``unmarked_stale_s``.
    """
    removed: list[tuple[Path, int]] = []
    if not cache_dir.is_dir():
        return removed
    for stale in sorted(cache_dir.glob(".*-*")):
        if not stale.is_dir():
            continue
        entry = cache_dir / stale.name[1:].rsplit("-", 1)[0]  # tempfile's suffix has no "-"
        lock = EntryLock(entry)
        try:
            if not lock.acquire(wait=False):
                continue  # being written right now
        except OSError as e:  # a read-only cache: nothing to sweep from here
            logger.debug("cannot lock %s: %s", entry, e)
            continue
        try:
            marked = (stale / OWNER_FILE).is_file()
            if not marked and time.time() - _last_change_s(stale) < unmarked_stale_s:
                logger.debug("keeping %s: no owner file, changed within the hour", stale)
                continue
            size = sum(p.stat().st_size for p in stale.rglob("*") if p.is_file())
            shutil.rmtree(stale, ignore_errors=True)
        finally:
            lock.release()
        logger.info("removed %s (%.0f MB), left by an interrupted export or build", stale, size / 1e6)
        removed.append((stale, size))
    return removed
