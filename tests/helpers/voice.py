"""The app as a subprocess, Whisper as the listener, and a live run on the virtual devices."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

# Speech over a reply this long after its first audio is a new question, not the rest of the
# last one (the 1.8 s continuation window of docs/voice.md, with a margin).
AFTER_CONTINUATION_WINDOW_S = 2.6


def assistant(*args, env=None, **kwargs):
    cmd = [sys.executable, "-m", "assistant", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=300, **kwargs
    )


def transcribe(whisper, audio) -> str:
    segments, _ = whisper.transcribe(audio, beam_size=5, language="en")
    return " ".join(s.text for s in segments)


_STARTED: list[subprocess.Popen] = []  # every Live app, so that a failed test leaves none running


def kill_leftover_apps() -> None:
    """Kill the Live apps a test left running (it failed before stopping them)."""
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


class Live:
    """``assistant run --no-tui`` on the virtual devices, with its stdout read line by line.

    A thread reads stdout, so :meth:`wait_for` gives up at its timeout even when the app
    prints nothing more; :meth:`output` is everything printed so far.
    """

    def __init__(self, env, log, *args):
        cmd = [sys.executable, "-m", "assistant", "run", "--no-tui", "--log", str(log), *args]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}
        )
        _STARTED.append(self.proc)
        self.lines: list[str] = []
        self._pending: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._pending.put(line)
        self._pending.put(None)

    def wait_for(self, pattern: str, timeout_s: float = 120) -> str:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._pending.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                self._pending.put(None)  # stdout is closed: later waits end at once too
                break
            self.lines.append(line)
            if re.search(pattern, line):
                return line
        if self.proc.poll() is None:
            self.proc.kill()
        stderr = self.proc.stderr.read()
        printed = "".join(self.lines)
        raise AssertionError(f"no {pattern!r} within {timeout_s:.0f} s in output: {printed} {stderr}")

    def output(self, timeout_s: float = 30) -> str:
        """All of stdout once the app has exited (wait for it first)."""
        self._reader.join(timeout_s)
        while True:
            try:
                line = self._pending.get_nowait()
            except queue.Empty:
                return "".join(self.lines)
            if line is not None:
                self.lines.append(line)


def _poll_events(path: Path, proc: subprocess.Popen, found, what: str, timeout_s: float):
    """Poll the ``--events`` file until ``found(events)`` returns something; that (else: kill, fail)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        events = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        if (result := found(events)) is not None:
            return result
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"no {what}: {proc.communicate()[1][-2000:]}")


def wait_for_event(path: Path, proc: subprocess.Popen, turn: int, name: str, timeout_s: float = 180) -> None:
    """Poll the ``--events`` file until ``turn`` has event ``name`` (the loop prints nothing meanwhile)."""

    def found(events: list[dict]) -> bool | None:
        return any(e["event"] == name and e["turn_id"] == turn for e in events) or None

    _poll_events(path, proc, found, f"{name} of turn {turn}", timeout_s)


def wait_for_answer(path: Path, proc: subprocess.Popen, word: str, timeout_s: float = 180) -> int:
    """Poll the ``--events`` file until the turn whose transcript has ``word`` is done; its id."""

    def found(events: list[dict]) -> int | None:
        said = [e for e in events if e["event"] == "TranscriptReady" and word in e["text"].lower()]
        heard = [e["turn_id"] for e in said]
        done = heard and any(e["event"] == "TurnDone" and e["turn_id"] == heard[-1] for e in events)
        return heard[-1] if done else None

    return _poll_events(path, proc, found, f"answered turn with {word!r}", timeout_s)


def sound_bursts(audio, gap_s: float = 0.4, level: float = 1e-3) -> list[tuple[float, float]]:
    """(start, end) seconds of the stretches of sound separated by at least ``gap_s`` of silence."""
    loud = np.nonzero(np.abs(audio) > level)[0] / 16000
    if not loud.size:
        return []
    breaks = np.nonzero(np.diff(loud) >= gap_s)[0]
    starts = np.concatenate([[loud[0]], loud[breaks + 1]])
    ends = np.concatenate([loud[breaks], [loud[-1]]])
    return list(zip(starts.tolist(), ends.tolist(), strict=True))
