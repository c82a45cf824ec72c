"""A private PulseAudio that can be killed, hung and restarted, and the app run against it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.paths import ROOT

SCRIPT = str(ROOT / "scripts" / "virtual-audio.sh")


class Pulse:
    """This module's PulseAudio: ``kill()`` it as a crash would, ``start()`` it again."""

    def __init__(self, runtime: Path) -> None:
        self.runtime = runtime
        self.env: dict[str, str] = {}
        self.hung = 0  # pid of the server while it is stopped (SIGSTOP)

    def _script(self, command: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "VIRTUAL_AUDIO_RUNTIME": str(self.runtime)}
        return subprocess.run([SCRIPT, command], capture_output=True, text=True, env=env)

    def start(self) -> None:
        """Start it (a no-op while it runs)."""
        out = self._script("start")
        assert out.returncode == 0, out.stderr
        self.env = dict(item.split("=", 1) for item in out.stdout.split()[1:])

    def kill(self) -> int:
        """SIGKILL the server; returns the monotonic time of the kill (ns)."""
        pid = int((self.runtime / "pulse" / "pid").read_text())
        t_ns = time.monotonic_ns()
        os.kill(pid, signal.SIGKILL)
        return t_ns

    def hang(self) -> int:
        """SIGSTOP the server (still there, answering nothing); returns the monotonic time (ns)."""
        self.hung = int((self.runtime / "pulse" / "pid").read_text())
        t_ns = time.monotonic_ns()
        os.kill(self.hung, signal.SIGSTOP)
        return t_ns

    def resume(self) -> None:
        if self.hung:
            os.kill(self.hung, signal.SIGCONT)
            self.hung = 0

    def stop(self) -> None:
        self.resume()
        self._script("stop")


class App:
    """``assistant run --no-tui`` on the module's server: stdout read line by line, events logged."""

    def __init__(self, server: Pulse, folder: Path, started: list[App], args: tuple[str, ...] = ()) -> None:
        started.append(self)
        self.events_path, self.log = folder / "events.jsonl", folder / "turns.jsonl"
        self.stderr_path = folder / "stderr.txt"
        cmd = [sys.executable, "-m", "assistant", "run", "--no-tui", *args]
        cmd += ["--events", str(self.events_path), "--log", str(self.log)]
        self.stderr = self.stderr_path.open("w")  # a file: PortAudio's lines must not fill a pipe
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env={**os.environ, **server.env}
        )
        self.lines: list[str] = []

    def wait_for(self, pattern: str, timeout_s: float) -> str:
        """The next stdout line matching ``pattern``; fails after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        os.set_blocking(self.proc.stdout.fileno(), False)
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
                continue
            self.lines.append(line)
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no {pattern!r} within {timeout_s} s in: {''.join(self.lines)}")

    def events(self, name: str) -> list[dict]:
        lines = self.events_path.read_text().splitlines() if self.events_path.exists() else []
        return [e for e in map(json.loads, lines) if e["event"] == name]

    def records(self) -> dict[int, dict]:
        return {r["turn_id"]: r for r in map(json.loads, self.log.read_text().splitlines())}

    def finish(self, sig: int = signal.SIGINT) -> str:
        """Stop it with ``sig``; asserts a clean exit and no traceback; returns stderr."""
        self.proc.send_signal(sig)
        code = self.proc.wait(30)
        self.stderr.close()
        stderr = self.stderr_path.read_text()
        rest = self.proc.stdout.read() or ""
        assert code == 0, (code, stderr)
        assert "stopped" in rest, rest
        assert "Traceback" not in stderr, stderr
        return stderr
