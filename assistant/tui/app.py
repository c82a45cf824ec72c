"""The Textual app: builds the session in a worker, then shows each turn as its events arrive.

Threads: a loader thread builds the session; the pipeline runs on ``LiveLoop``'s capture
and turn threads. Every one of them talks to the UI only through ``post_message``
(thread-safe); the UI thread never waits on audio or the model, except to join the
threads at quit. Quitting while the models load cancels the load at its next step and
exits once the loader has closed what it opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from pathlib import Path

import numpy as np
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, RichLog

from assistant.app import Session
from assistant.config import Settings
from assistant.observe.gpu import GpuMonitor
from assistant.tui.breakdown import LatencyBreakdown
from assistant.tui.conversation import Conversation
from assistant.tui.feed import TurnFeed
from assistant.tui.footer import KeyFooter
from assistant.tui.loader import Builder, SessionLoader, make_loop
from assistant.tui.loading import TICK_S, LoadingLine
from assistant.tui.messages import LoadFailed, LoadProgress, LogLine, SessionReady
from assistant.tui.stats import SessionStats
from assistant.tui.status import StatusBar
from assistant.turns.live import LiveLoop

logger = logging.getLogger(__name__)

# The GIL is handed to a waiting thread after this long (Python's default: 5 ms). Textual
# draws in Python on the UI thread; with 5 ms the decode thread waited for the GIL after
# each CUDA sync (H200: 227 tok/s in the UI against 493 without it; at 0.2 ms, 490).
# docs/benchmarks.md has the runs (bench/ui.py).
UI_SWITCH_INTERVAL_S = 0.0002
GPU_POLL_S = 2.0  # the status bar's GPU line and the memory trend
LOADER_JOIN_S = 120.0  # longest single load step waited for at quit (an ONNX export: ~15 s)


class AssistantApp(TurnFeed):
    """Conversation, live latency breakdown of each turn, session statistics, status bar."""

    CSS_PATH = "app.tcss"
    TITLE = "assistant"
    AUTO_FOCUS = None  # a focused Input would swallow the keys
    ENABLE_COMMAND_PALETTE = False  # the footer needs the room for the keys
    # app.tcss sizes the panes by these: below 70 columns the statistics pane goes (the
    # conversation keeps the width) and the keys wrap; below 18 rows the breakdown goes.
    HORIZONTAL_BREAKPOINTS = [(0, "-tiny"), (50, "-small"), (70, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (18, "-tall")]

    def __init__(
        self,
        build: Builder | None,
        *,
        input_wav: Path | None = None,
        input_audio: np.ndarray | None = None,
        settings: Settings | None = None,
        export_dir: Path | None = None,
        gpu: bool = True,
    ) -> None:
        super().__init__()
        self.build = build
        self.input_wav = input_wav
        self.input_audio = input_audio  # input_wav already read; else it is read at the replay
        self.settings = settings or Settings()
        self.export_dir = export_dir or Path.cwd()
        self.gpu = GpuMonitor() if gpu else None
        self.session: Session | None = None
        self.load_error: BaseException | None = None  # why the session could not be built
        self.loop: LiveLoop | None = None
        self.listening = True
        self.muted = False
        self.barge_in = self.settings.pipeline.barge_in
        self.has_mic = False
        self.cancel_load = threading.Event()
        self.loader: SessionLoader | None = None
        self.quitting = False

    def compose(self) -> ComposeResult:
        """Status, progress, conversation | statistics, breakdown, input, log, footer."""
        yield StatusBar(id="status")
        yield LoadingLine(id="loading")
        with Horizontal(id="main"):
            yield Conversation(id="conversation")
            with Vertical(id="side"):
                yield SessionStats(id="stats")
        yield LatencyBreakdown(id="breakdown")
        yield Input(placeholder="type a message, Enter to send, Esc to go back", id="text-input")
        yield RichLog(id="log", max_lines=500, wrap=True)
        yield KeyFooter()

    def on_mount(self) -> None:
        """Start loading; poll the GPU if there is one."""
        self.query_one(StatusBar).set(barge_in=self.barge_in)
        self.query_one(Conversation).border_title = "conversation"
        self.set_focus(None)  # a focused Input would swallow the keys
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
            # SIGTERM and SIGHUP (the terminal closed) quit like q: the turn stopped, threads
            # joined, temporary files removed.
            for stop in (signal.SIGTERM, signal.SIGHUP):
                asyncio.get_running_loop().add_signal_handler(stop, self.action_quit_app)
        self.start_drain()
        if self.gpu is not None and self.gpu.available:
            self.set_interval(GPU_POLL_S, self._poll_gpu)
            self._poll_gpu()
        if self.build is not None:
            self.loader = SessionLoader(
                self.build, self.emit, self.cancel_load, self.post_message, self._loaded
            )
            self.loader.start()
            # The app's timer, not one on the widget: with the widget's own timer the partial
            # transcripts of a first turn were mostly lost (test_turn_taking.py, partials test).
            self.set_interval(TICK_S, self.query_one(LoadingLine).tick)

    def _poll_gpu(self) -> None:
        """One NVML read: the status line and the memory trend show the same sample."""
        if self.gpu is not None and self.is_running:  # not while the screen is taken down
            sample, line = self.gpu.reading()
            self.query_one(StatusBar).set(gpu=line)
            if sample is not None:
                self.query_one(SessionStats).add_gpu_sample(sample)

    def _loaded(self, session: Session) -> None:
        """Loader thread: the built session's live loop, with the keys' state so far."""
        self.loop = make_loop(session, self.input_wav, self.emit)
        self.loop.listening, self.loop.muted = self.listening, self.muted

    # --- messages -------------------------------------------------------------------------

    def on_load_progress(self, message: LoadProgress) -> None:
        """Move the progress bar."""
        if self.quitting:
            return
        self.query_one(LoadingLine).progress(message.step, message.fraction)

    def on_load_failed(self, message: LoadFailed) -> None:
        """Say what failed; the fix is in the message (ModelNotFound names the command)."""
        if self.quitting:  # the cancelled load has closed what it opened: now exit
            self.exit(0)
            return
        self.load_error = message.error
        self.query_one("#loading").display = False
        self.query_one(Conversation).notice(f"error: {message.error}", error=True)
        self.query_one(StatusBar).set(state="error")
        self.notify(str(message.error), title="could not start", severity="error", timeout=30)

    def on_session_ready(self, message: SessionReady) -> None:
        """Show the session; start listening; replay ``--input`` if given."""
        if self.quitting:  # loaded just as q was pressed: close it and go
            self.session = message.session
            self.shutdown()
            self.exit(0)
            return
        self.session = message.session
        self.has_mic = message.info.mic != ""
        self.query_one("#loading").display = False
        conversation = self.query_one(Conversation)
        for notice in message.notices:
            conversation.notice(f"notice: {notice}")
        i = message.info
        engine = f", {i.engine}" if i.engine else ""
        conversation.notice(f"ready: {i.llm} ({i.backend}){engine}, loaded in {i.load_s:.1f} s")
        self.query_one(StatusBar).set(info=i, state=self._idle_state())
        if self.loop is not None:
            self._push_barge_in()
            self.loop.start()
            if self.input_wav is not None:
                self._replay(self.input_wav)

    def _replay(self, path: Path) -> None:
        from assistant.stages.audio_file import load_wav
        from assistant.stages.recording import find_utterance

        assert self.loop is not None
        assert self.session is not None
        audio = self.input_audio if self.input_audio is not None else load_wav(path)
        speech, delay_ms = find_utterance(audio, self.settings.vad, path, self.session.turn_policy)
        turn = self.loop.submit_speech(speech, delay_ms)
        self.query_one(Conversation).notice(f"turn {turn}: replaying {path.name}")

    def on_log_line(self, message: LogLine) -> None:
        """Append to the log pane."""
        self.query_one(RichLog).write(message.text)

    def action_quit_app(self) -> None:
        """Q: stop the turn in progress, join the threads, close the streams, exit.

        While the models load, the load is cancelled first and the app exits when the
        loader has stopped (at its next step), so nothing it opened is left behind.
        """
        if self.loader is not None and self.loader.is_alive():
            self.quitting = True
            self.cancel_load.set()
            self.query_one(LoadingLine).say("quitting: stopping the load at its next step")
            return
        self.shutdown()
        self.exit(0)

    def on_unmount(self) -> None:
        """The app is going, however it goes: nothing it started may outlive it."""
        self.shutdown()
        self.stop_drain()

    def shutdown(self) -> None:
        """Stop the load, join every pipeline thread and close the devices (idempotent)."""
        self.cancel_load.set()
        if self.loader is not None and self.loader is not threading.current_thread():
            self.loader.join(timeout=LOADER_JOIN_S)
            if self.loader.is_alive():  # a step that does not return (a stuck download)
                logger.warning("the model loader is still running after %.0f s; leaving it", LOADER_JOIN_S)
        if self.loop is not None:
            self.loop.stop()
            self.loop = None
        if self.session is not None:
            self.session.close()
            self.session = None
