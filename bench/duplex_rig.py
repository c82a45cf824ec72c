"""The app live on the virtual sound devices, driven like a person at a speaker with an echo.

:class:`LiveApp` runs ``assistant run --no-tui`` on the private PulseAudio of
``scripts/virtual-audio.sh`` (``env``), reads its output and its event log, types questions on
its standard input and speaks into its microphone (``micfeed``). The full-duplex tests
(``tests/integration/test_full_duplex.py``) and the benchmark (``python -m bench.duplex``) use
it with the echo path of :func:`bench.echo_rig.echo_path`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench.speech import silence, speak, trim, write_wav


class LiveApp:
    """``assistant run --no-tui`` with its events in ``folder``; stop it with :meth:`stop`."""

    def __init__(self, env: dict[str, str], folder: Path, *args: str) -> None:
        self.env = {**os.environ, **env}
        self.events_path, self.log_path = folder / "events.jsonl", folder / "turns.jsonl"
        cmd = [sys.executable, "-m", "assistant", "run", "--no-tui"]
        cmd += ["--events", str(self.events_path), "--log", str(self.log_path), *args]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_line(self, pattern: str, timeout_s: float = 120) -> str:
        """The first output line matching ``pattern`` (waits for it)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if re.search(pattern, line):
                    return line
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in output: {''.join(self.lines)}")

    def events(self) -> list[dict]:
        """The event log so far (complete lines)."""
        if not self.events_path.exists():
            return []
        text = self.events_path.read_text()
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def wait_event(
        self,
        name: str,
        turn: int | None = None,
        timeout_s: float = 120,
        after: int = 0,
        text: str | None = None,
    ) -> dict:
        """The first event ``name`` (of ``turn``, with ``text``) logged at or after index ``after``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for event in self.events()[after:]:
                if (
                    event["event"] == name
                    and (turn is None or event["turn_id"] == turn)
                    and (text is None or event.get("text") == text)
                ):
                    return event
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(
            f"no {name} (turn {turn}, text {text!r}) in {len(self.events())} events: {''.join(self.lines)}"
        )

    def ask(self, text: str) -> None:
        """Type a question (answered aloud after the turn in progress)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def say(self, wav: Path) -> None:
        """Speak ``wav`` into the microphone (returns when it has played)."""
        subprocess.run(["paplay", "--device=micfeed", str(wav)], env=self.env, check=True)

    def records(self) -> dict[int, dict]:
        """Turn records so far, by turn."""
        if not self.log_path.exists():
            return {}
        return {r["turn_id"]: r for r in map(json.loads, self.log_path.read_text().splitlines())}

    def stop(self) -> str:
        """Ctrl-C, wait, and return its standard error."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        return self.proc.stderr.read() if self.proc.stderr else ""


def utterance(folder: Path, text: str, name: str, gain_db: float = 0.0, **voice: object) -> Path:
    """``text`` spoken (espeak-ng), trimmed, with 0.2 s of silence around it, as a WAV.

    ``gain_db`` raises (or lowers) the voice, at most to a peak of 0.95 (no clipping).
    """
    audio = trim(speak(text, folder, f"{name}-espeak", **voice))  # type: ignore[arg-type]
    peak = float(np.abs(audio).max()) or 1.0
    audio = audio * min(10 ** (gain_db / 20), 0.95 / peak)
    return write_wav(folder / f"{name}.wav", np.concatenate([silence(0.2), audio, silence(0.2)]))


def piper_speech(text: str, wpm: int) -> np.ndarray:
    """``text`` in the bundled Piper voice at ``wpm``, at its own level, with 0.2 s of silence around it."""
    from assistant.config import ModelSettings
    from assistant.config.sections import TtsOptions
    from assistant.stages.tts_piper import PiperSynthesizer
    from store.bundled import ModelStore

    store = ModelStore(ModelSettings().store_dir)
    with PiperSynthesizer(TtsOptions(engine="piper", rate_wpm=wpm), store) as piper:
        audio = piper.synthesize(text)
    return np.concatenate([silence(0.2), audio, silence(0.2)])


def piper_utterance(folder: Path, text: str, name: str, wpm: int) -> Path:
    """:func:`piper_speech` as a WAV."""
    return write_wav(folder / f"{name}.wav", piper_speech(text, wpm))


def burst(folder: Path, name: str = "cough", seconds: float = 0.18, dbfs: float = -12) -> Path:
    """A cough-like burst of noise (fast attack, short decay) as a WAV."""
    rng = np.random.default_rng(3)
    n = int(seconds * 16000)
    envelope = np.exp(-np.arange(n) / (0.35 * n))
    noise = np.convolve(rng.standard_normal(n), np.ones(3) / 3, mode="same") * envelope
    noise *= 10 ** (dbfs / 20) / max(float(np.sqrt(np.mean(noise**2))), 1e-9)
    return write_wav(
        folder / f"{name}.wav", np.concatenate([silence(0.2), noise.astype(np.float32), silence(0.2)])
    )


def reply_playing(app: LiveApp, turn: int, after: int = 0, timeout_s: float = 120) -> dict:
    """Wait until spoken turn ``turn``'s reply plays: its first piece is ready and the turn ended.

    ``AudioReady`` alone is not enough: a speculative reply's first piece is rendered before the
    user's turn is confirmed (``SpeechEnded``), and plays only then (with a 3-word first chunk
    it is often ready that early).
    """
    ready = app.wait_event("AudioReady", turn, timeout_s, after)
    app.wait_event("SpeechEnded", turn, timeout_s, after)
    return ready


def next_turn(app: LiveApp, after: int, timeout_s: float = 120) -> int:
    """The turn of the next ``TranscriptReady`` logged at or after index ``after``."""
    return int(app.wait_event("TranscriptReady", None, timeout_s, after)["turn_id"])


def settle(app: LiveApp, quiet_s: float = 1.5, timeout_s: float = 120) -> None:
    """Wait until every turn transcribed so far is done and nothing was logged for ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    count, since = -1, time.monotonic()
    while time.monotonic() < deadline and app.proc.poll() is None:
        events = app.events()
        heard = {e["turn_id"] for e in events if e["event"] == "TranscriptReady"}
        done = {e["turn_id"] for e in events if e["event"] == "TurnDone"}
        if len(events) != count:
            count, since = len(events), time.monotonic()
        elif heard <= done and time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.1)
