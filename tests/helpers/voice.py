"""The app as a subprocess, Whisper as the listener, and a live run on the virtual devices."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import numpy as np


def assistant(*args, env=None, **kwargs):
    cmd = [sys.executable, "-m", "assistant", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=300, **kwargs
    )


def transcribe(whisper, audio) -> str:
    segments, _ = whisper.transcribe(audio, beam_size=5, language="en")
    return " ".join(s.text for s in segments)


class Live:
    """``assistant run --no-tui`` on the virtual devices, with its stdout read line by line."""

    def __init__(self, env, log, *args):
        cmd = [sys.executable, "-m", "assistant", "run", "--no-tui", "--log", str(log), *args]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}
        )
        self.lines: list[str] = []

    def wait_for(self, pattern: str, timeout_s: float = 120) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if re.search(pattern, line):
                return line
        stderr = self.proc.stderr.read() if self.proc.poll() is not None else ""
        raise AssertionError(f"no {pattern!r} in output: {''.join(self.lines)} {stderr}")


def sound_bursts(audio, gap_s: float = 0.4, level: float = 1e-3) -> list[tuple[float, float]]:
    """(start, end) seconds of the stretches of sound separated by at least ``gap_s`` of silence."""
    loud = np.nonzero(np.abs(audio) > level)[0] / 16000
    if not loud.size:
        return []
    breaks = np.nonzero(np.diff(loud) >= gap_s)[0]
    starts = np.concatenate([[loud[0]], loud[breaks + 1]])
    ends = np.concatenate([loud[breaks], [loud[-1]]])
    return list(zip(starts.tolist(), ends.tolist(), strict=True))
