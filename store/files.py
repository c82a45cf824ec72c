"""Files the user asked for (``--output``, ``--log``, ``--events``, the latency report).

Checked before any model loads, so a typo in a folder name costs nothing; written so that
a failure (disk full, killed process) never leaves half a file: whole files go to a
temporary file in the same folder and are renamed over the target, and log lines are
appended a whole line at a time, a failed write rolled back.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


class UnwritablePath(ValueError):
    """A path given on the command line cannot be written; names the flag and the path."""


def _probe_dir(folder: Path) -> str | None:
    """Why files cannot be created in ``folder``, or ``None`` when they can.

    Creates and removes a hidden file there: permission bits do not tell (root, read-only
    mounts, /proc), trying does.
    """
    if not folder.exists():
        return f"the folder {folder} does not exist"
    if not folder.is_dir():
        return f"{folder} is not a folder"
    probe = folder / f".assistant-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as e:
        return f"cannot create files in {folder} ({e.strerror})"
    probe.unlink()
    return None


def check_writable_file(path: Path, flag: str) -> None:
    """Check that a file can be written or appended at ``path``, before any work is done.

    Raises:
        UnwritablePath: The folder is missing or read-only, or ``path`` is a folder or read-only.
    """
    path = path.expanduser()
    problem = f"{path} is a folder, not a file" if path.is_dir() else _probe_dir(path.parent)
    if problem is None and path.exists():
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))  # opens, changes nothing
        except OSError as e:
            problem = f"cannot open {path} for writing ({e.strerror})"
    if problem:
        raise UnwritablePath(f"{flag} {path}: cannot write there: {problem}")


def check_writable_dir(path: Path, flag: str) -> None:
    """Check that files can be written in the folder ``path`` (created later if missing).

    Raises:
        UnwritablePath: ``path`` is a file, or its nearest existing folder is read-only.
    """
    path = path.expanduser()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    problem = _probe_dir(existing)
    if problem:
        raise UnwritablePath(f"{flag} {path}: cannot write there: {problem}")


@contextlib.contextmanager
def atomic_write(path: Path) -> Iterator[BinaryIO]:
    """Write ``path`` as a whole or not at all: a hidden temporary file, renamed when complete.

    The temporary file sits in the same folder (a rename within one file system is atomic)
    and is removed if the writing fails; the file gets the usual permissions (umask).
    """
    path = path.expanduser()
    temp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.part")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise


class LineAppender:
    """An append-only text file (JSON lines) written one whole line per call.

    A write that fails part-way (disk full) is cut back off, so the file never ends in half
    a line; the error is raised.
    """

    def __init__(self, path: Path) -> None:
        self.path = path.expanduser()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)

    def write_line(self, text: str) -> None:
        """Append ``text`` and a newline."""
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        data = memoryview((text + "\n").encode())
        size = os.fstat(self._fd).st_size
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, size)
            raise

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def append_line(path: Path, text: str) -> None:
    """Append one whole line to ``path`` (see :class:`LineAppender`)."""
    appender = LineAppender(path)
    try:
        appender.write_line(text)
    finally:
        appender.close()
