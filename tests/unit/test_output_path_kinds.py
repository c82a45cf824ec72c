"""``--output`` (and every whole file the app writes) on paths that are not plain files.

Real nodes in a temporary folder: a character device made with ``mknod`` (1, 3: the same
device as ``/dev/null``; the tests run as root, and skip where ``mknod`` is not allowed), a
symbolic link, a named pipe. The reply is written as ``run --output`` writes it
(:func:`assistant.modes.run.write_wav`).
"""

from __future__ import annotations

import os
import stat
import threading
import wave
from pathlib import Path

import numpy as np
import pytest

from assistant.modes.run import write_wav
from store.files import UnwritablePath, atomic_write, check_writable_file

REPLY = np.zeros(1_600, np.float32)  # 0.1 s of 16 kHz audio: a 3,244-byte WAV
WAV_BYTES = 44 + 2 * len(REPLY)


def null_device(folder: Path) -> Path:
    """A character device node (1, 3), i.e. a second ``/dev/null``, in ``folder``."""
    node = folder / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs root (CAP_MKNOD)")
    return node


def test_a_character_device_is_written_through_not_replaced(tmp_path):
    """``--output /dev/null`` discards the reply; the device node stays a device (it was renamed over)."""
    node = null_device(tmp_path)
    check_writable_file(node, "--output")
    write_wav(node, REPLY)
    st = node.lstat()
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]  # no temporary file left


def test_a_symlink_is_followed_its_target_written_whole_and_the_link_kept(tmp_path):
    """``--output latest.wav`` where latest.wav -> replies/today.wav: today.wav gets the reply."""
    (tmp_path / "replies").mkdir()
    target = tmp_path / "replies" / "today.wav"
    target.write_bytes(b"old")
    link = tmp_path / "latest.wav"
    link.symlink_to(Path("replies") / "today.wav")
    check_writable_file(link, "--output")
    write_wav(link, REPLY)
    assert link.is_symlink() and os.readlink(link) == str(Path("replies") / "today.wav")
    with wave.open(str(target), "rb") as w:
        assert w.getnframes() == len(REPLY)
    assert sorted(p.name for p in target.parent.iterdir()) == ["today.wav"]  # no temporary file left


def test_a_dangling_symlink_creates_its_target(tmp_path):
    """As ``>`` does: the link's missing target is created, the link kept."""
    link = tmp_path / "reply.wav"
    link.symlink_to(tmp_path / "made.wav")
    check_writable_file(link, "--output")
    write_wav(link, REPLY)
    assert link.is_symlink() and (tmp_path / "made.wav").stat().st_size == WAV_BYTES


def test_a_named_pipe_is_checked_without_blocking_and_written_through(tmp_path):
    """The start-up check used to open the pipe and wait forever for a reader."""
    fifo = tmp_path / "reply.fifo"
    os.mkfifo(fifo)
    checked = threading.Event()

    def check() -> None:
        check_writable_file(fifo, "--output")
        checked.set()

    checker = threading.Thread(target=check, daemon=True)
    checker.start()
    checker.join(timeout=30)
    assert checked.is_set(), "check_writable_file blocked on a named pipe"
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_wav(fifo, REPLY)
    reader.join(timeout=30)
    assert got and len(got[0]) == WAV_BYTES and got[0][:4] == b"RIFF"
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_socket_is_refused_with_a_message_naming_it(tmp_path):
    import socket

    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(UnwritablePath, match=r"--output .*/s: cannot write there: .* is a socket"):
            check_writable_file(path, "--output")
        with pytest.raises(UnwritablePath, match="is a socket"), atomic_write(path) as f:
            f.write(b"x")
        assert stat.S_ISSOCK(path.lstat().st_mode)


def test_a_regular_file_is_still_replaced_atomically(tmp_path):
    """The existing behaviour for plain files: a new inode renamed over the old one."""
    path = tmp_path / "reply.wav"
    path.write_bytes(b"old")
    before = path.stat().st_ino
    write_wav(path, REPLY)
    assert path.stat().st_size == WAV_BYTES and path.stat().st_ino != before
