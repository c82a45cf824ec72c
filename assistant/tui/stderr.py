"""Keeps what C libraries write to stderr (ALSA, PortAudio) off the UI's screen.

ALSA prints lines such as ``ALSA lib pcm.c:8570:(snd_pcm_recover) underrun occurred``
straight to file descriptor 2, over whatever the terminal shows. Textual draws through
``sys.__stderr__``, so while the UI runs that object is pointed at a copy of the terminal's
descriptor, and fd 2 itself (C libraries, ``sys.stderr``) becomes a pipe: a reader thread
hands each line to a callback (the log pane) and keeps the last ones, so that a crash's
traceback can still be printed once the terminal is back.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import TextIO


def _set_dunder_stderr(stream: TextIO | None) -> None:
    # Textual's driver writes to sys.__stderr__, which typing marks final.
    setattr(sys, "__stderr__", stream)  # noqa: B010


class StderrToLog:
    """Context manager: fd 2 goes to ``write_line`` (any thread) until exit."""

    def __init__(self, write_line: Callable[[str], None], keep_lines: int = 200) -> None:
        self.write_line = write_line
        self.lines: deque[str] = deque(maxlen=keep_lines)
        self._saved_fd = -1
        self._reader: threading.Thread | None = None
        self._dunder: TextIO | None = None

    def __enter__(self) -> StderrToLog:
        sys.stderr.flush()
        self._saved_fd = os.dup(2)
        self._dunder = sys.__stderr__
        encoding = getattr(self._dunder, "encoding", None) or "utf-8"
        terminal = open(self._saved_fd, "w", encoding=encoding, closefd=False)  # noqa: SIM115
        _set_dunder_stderr(terminal)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._reader = threading.Thread(target=self._read, args=(read_fd,), name="stderr-to-log", daemon=True)
        self._reader.start()
        return self

    def _read(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "r", errors="replace") as pipe:
            for line in pipe:
                text = line.rstrip()
                if text:
                    self.lines.append(text)
                    self.write_line(text)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        sys.stderr.flush()
        terminal = sys.__stderr__
        if terminal is not None:
            terminal.flush()
            terminal.close()
        os.dup2(self._saved_fd, 2)  # closes the pipe's last write end here: the reader sees EOF
        _set_dunder_stderr(self._dunder)
        os.close(self._saved_fd)
        if self._reader is not None:
            # Child processes that inherited fd 2 (espeak-ng) keep the pipe open until they end.
            self._reader.join(timeout=1.0)

    def replay(self) -> None:
        """Write the kept lines to the real stderr (after a crash)."""
        if self.lines:
            sys.stderr.write("\n".join(self.lines) + "\n")
