"""Paths and messages in the UI are plain text, and a crash of the UI exits non-zero with its traceback.

Pilot runs on real sessions (the bundled SmolLM2 in a folder whose name holds ``[/x]``, which
Textual's markup parser rejects); the crash test runs ``assistant`` in a pseudo-terminal with
a crash injected into the app's start (a stand-in: no real input crashes the UI any more).
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from assistant.tui.app import AssistantApp
from assistant.tui.loading import LoadingLine
from tests.helpers.screen import screen_text
from tests.helpers.tui import builder, no_audio_env, settings, wait_until

ROOT = Path(__file__).resolve().parents[2]


def toasts(app: AssistantApp) -> list[str]:
    """The notifications on screen, as the toasts render them (title, then message)."""
    return [toast.render().plain for toast in app.screen.query("Toast")]


def bracket_model(model_dir: Path, tmp_path: Path) -> Path:
    """The bundled model's files, linked into ``m[/x]`` (the issue's reproduction: ``mkdir -p``)."""
    folder = tmp_path / "m[/x]"
    folder.mkdir(parents=True)
    for f in model_dir.iterdir():
        (folder / f.name).symlink_to(f)
    return folder


@pytest.mark.asyncio
async def test_model_and_export_folders_with_brackets_load_answer_export(model_dir, tmp_path, monkeypatch):
    """``--model m[/x] --backend pytorch`` then a typed turn and ``e`` into ``e[/x]``.

    Each crashed the app with MarkupError (the load-step line, then the export's notice), and
    the process exited 0 on a blank screen.
    """
    no_audio_env(monkeypatch, tmp_path)
    folder = bracket_model(model_dir, tmp_path)
    s = settings(**{"models.llm": str(folder), "decoder.backend": "pytorch"})
    steps: list[str] = []
    app = AssistantApp(builder(s, steps=steps), settings=s, export_dir=tmp_path / "e[/x]", gpu=False)
    async with app.run_test(size=(140, 40), notifications=True) as pilot:
        await wait_until(pilot, lambda: app.session is not None or app.return_code is not None)
        assert app.return_code is None, "the app ended while loading"
        assert f"loading LLM {folder}" in steps
        await pilot.press("t", *"Say hi.", "enter")
        await wait_until(pilot, lambda: len(app.records) == 1)
        await pilot.press("e")
        await wait_until(pilot, lambda: any("latency report" in t for t in toasts(app)))
        (csv_path,) = (tmp_path / "e[/x]").glob("latency-*.csv")
        assert any(f"1 turns -> {csv_path}, {csv_path.with_suffix('.json')}" in t for t in toasts(app))
        await pilot.press("q")
    assert app.return_code == 0


@pytest.mark.asyncio
async def test_the_load_step_and_a_load_error_show_brackets_literally(tmp_path):
    """``models [old]/m`` was shown as ``models /m``; a load error naming ``n[/x]`` crashed the toast."""
    missing = tmp_path / "n[/x]"
    s = settings(**{"models.llm": str(missing), "decoder.backend": "pytorch"})
    app = AssistantApp(builder(s), settings=s, gpu=False)
    async with app.run_test(size=(140, 40), notifications=True) as pilot:
        await wait_until(pilot, lambda: toasts(app) or app.return_code is not None)
        assert app.return_code is None, "the app ended on a load error"
        (toast,) = toasts(app)
        assert toast.startswith("could not start\nno such folder") and f"{missing} and no stored" in toast
        line = app.query_one(LoadingLine)
        line.display = True
        line.progress("loading LLM /srv/models [old]/m", 0.5)
        await pilot.pause()
        assert "loading LLM /srv/models [old]/m" in screen_text(app)
        await pilot.press("q")
    assert app.return_code == 0


CRASH = """
import sys
from assistant.tui.app import AssistantApp

def crash(self):
    raise RuntimeError("injected crash at start")

AssistantApp.on_mount = crash
from assistant.__main__ import main
sys.exit(main([]))
"""


def test_a_crash_of_the_ui_exits_non_zero_and_prints_its_traceback(tmp_path):
    """``code = app.run() or 0`` made every crash exit 0, its traceback never replayed."""
    terminal, pane = pty.openpty()
    fcntl.ioctl(pane, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "XDG_CONFIG_HOME": str(tmp_path / "no-config")}
    app = subprocess.Popen(
        [sys.executable, "-c", CRASH], stdin=pane, stdout=pane, stderr=subprocess.PIPE, env=env, cwd=ROOT
    )
    os.close(pane)

    def drain() -> None:  # the screen: read so the app never blocks on a full terminal
        try:
            while os.read(terminal, 65536):
                pass
        except OSError:
            pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        stderr = app.communicate(timeout=300)[1].decode(errors="replace")
    finally:
        app.kill()
        os.close(terminal)
    assert app.returncode == 1, stderr[-3000:]
    assert "RuntimeError: injected crash at start" in stderr
    assert "Traceback" in stderr or "in crash" in stderr, stderr[-3000:]
