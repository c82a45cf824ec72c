"""Files the user asked for (``--output``, ``--log``, ``--events``, the latency report).

Checked before any model loads, so a typo in a folder name costs nothing; written so that
a failure (disk full, killed process) never leaves half a file: whole files go to a
temporary file in the same folder and are renamed over the target, and log lines are
appended a whole line at a time, a failed write rolled back.

What a shell's ``>`` would do decides the other kinds of path: a symbolic link is followed
(its target is written, atomically, and the link stays), a character device (``/dev/null``)
or a named pipe is written through, never renamed over; a block device or a socket is refused.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
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


def _target(path: Path) -> Path:
    """The file a write to ``path`` lands in: a symbolic link (or a chain of them) is followed."""
    path = path.expanduser()
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _is_stream(mode: int) -> bool:
    """A character device or a named pipe: written through, as ``>`` does, never replaced."""
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _kind_problem(target: Path, mode: int) -> str | None:
    """Why ``target`` (an existing path) cannot take a file's contents, by its kind."""
    if stat.S_ISDIR(mode):
        return f"{target} is a folder, not a file"
    if stat.S_ISBLK(mode):
        return f"{target} is a block device, not a file (writing it would overwrite a disk)"
    if not (stat.S_ISREG(mode) or _is_stream(mode)):
        return f"{target} is a socket or another special file, not a file"
    return None


def check_writable_file(path: Path, flag: str) -> None:
    """Check that a file can be written or appended at ``path``, before any work is done.

    Never blocks: a named pipe is checked by its permissions, not opened (opening waits for
    a reader).

    Raises:
        UnwritablePath: The folder is missing or read-only, or ``path`` is a folder, a block
            device, a socket or read-only.
    """
    path = path.expanduser()
    target = _target(path)
    problem: str | None = None
    try:
        mode: int | None = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        mode, problem = None, f"cannot open {target} for writing ({e.strerror})"
    if problem is None and mode is None:
        problem = _probe_dir(target.parent)
    elif problem is None and mode is not None:
        problem = _kind_problem(target, mode)
        if problem is None and stat.S_ISFIFO(mode):
            if not os.access(target, os.W_OK):
                problem = f"cannot open {target} for writing (Permission denied)"
        elif problem is None:
            problem = _probe_dir(target.parent) if stat.S_ISREG(mode) else None
            try:  # opens, changes nothing; a device does not block with O_NONBLOCK
                os.close(os.open(target, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
            except OSError as e:
                problem = problem or f"cannot open {target} for writing ({e.strerror})"
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
    and is removed if the writing fails; the file gets the usual permissions (umask). A
    symbolic link is followed: its target is replaced, the link kept. A character device
    (``/dev/null``) or a named pipe is written through instead: renaming over it would
    replace the device node (as root, ``/dev/null`` itself).

    Raises:
        UnwritablePath: ``path`` is a folder, a block device or a socket.
    """
    target = _target(path)
    try:
        mode: int | None = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        problem = _kind_problem(target, mode)
        if problem:
            raise UnwritablePath(f"{path}: cannot write there: {problem}")
        if _is_stream(mode):
            with open(target, "wb") as stream:  # nothing to sync or rename on a device or pipe
                yield stream
            return
    temp = target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.part")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
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
