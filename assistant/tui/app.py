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
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, ProgressBar, RichLog, Static

from assistant.app import LoadCancelled, Progress, Session
from assistant.config import Settings
from assistant.events import AudioDeviceLost, AudioDeviceRestored, Event, TurnDone
from assistant.observe.gpu import GpuMonitor
from assistant.observe.latency import TurnRecord, build_record, export_report
from assistant.stages.audio import AudioSink, FileSink
from assistant.stages.devices import device_notice
from assistant.tui.breakdown import LatencyBreakdown
from assistant.tui.fold import TurnFold
from assistant.tui.messages import LoadFailed, LoadProgress, LogLine, PipelineEvent, SessionReady
from assistant.tui.widgets import Conversation, KeyFooter, SessionStats, StatusBar
from assistant.turns.live import LiveLoop
from assistant.turns.protocols import PipelineOptions

logger = logging.getLogger(__name__)

DRAIN_HZ = 20  # how often pipeline events reach the screen
# The GIL is handed to a waiting thread after this long (Python's default: 5 ms). Textual
# draws in Python on the UI thread; with 5 ms the decode thread waited for the GIL after
# each CUDA sync (H200: 227 tok/s in the UI against 493 without it; at 0.2 ms, 490).
# docs/benchmarks.md has the runs (bench/ui.py).
UI_SWITCH_INTERVAL_S = 0.0002
GPU_POLL_S = 2.0  # the status bar's GPU line and the memory trend
LOADER_JOIN_S = 120.0  # longest single load step waited for at quit (an ONNX export: ~15 s)

Builder = Callable[[Callable[[Event], None], Progress, threading.Event], Session]
"""Builds the session from the UI's event callback, progress callback and cancel flag
(runs on the loader thread; raises :class:`LoadCancelled` once the flag is set)."""


class AssistantApp(App[int]):
    """Conversation, live latency breakdown of each turn, session statistics, status bar."""

    CSS_PATH = "app.tcss"
    TITLE = "assistant"
    AUTO_FOCUS = None  # a focused Input would swallow the keys
    ENABLE_COMMAND_PALETTE = False  # the footer needs the room for the keys
    # app.tcss sizes the panes by these: below 70 columns the statistics pane goes (the
    # conversation keeps the width) and the keys wrap; below 18 rows the breakdown goes.
    HORIZONTAL_BREAKPOINTS = [(0, "-tiny"), (50, "-small"), (70, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (18, "-tall")]
    BINDINGS = [
        Binding("space", "toggle_listening", "Listen on/off"),
        Binding("m", "mute", "Mute"),
        Binding("t", "type", "Type"),
        Binding("b", "barge_in", "Barge-in"),
        Binding("e", "export", "Export"),
        Binding("l", "log", "Log"),
        Binding("q", "quit_app", "Quit"),
        Binding("ctrl+q,ctrl+c", "quit_app", "Quit", show=False, priority=True),
        Binding("escape", "leave_input", "Back", show=False),
    ]

    def __init__(
        self,
        build: Builder | None,
        *,
        input_wav: Path | None = None,
        settings: Settings | None = None,
        export_dir: Path | None = None,
        gpu: bool = True,
    ) -> None:
        super().__init__()
        self.build = build
        self.input_wav = input_wav
        self.settings = settings or Settings()
        self.export_dir = export_dir or Path.cwd()
        self.gpu = GpuMonitor() if gpu else None
        self.session: Session | None = None
        self.loop: LiveLoop | None = None
        self.records: list[TurnRecord] = []
        self.fold = TurnFold()
        self.listening = True
        self.muted = False
        self.barge_in = self.settings.pipeline.barge_in
        self.has_mic = False
        self.cancel_load = threading.Event()
        self.loader: threading.Thread | None = None
        self.quitting = False
        self.load_step = ("loading", time.monotonic())
        self._inbox: deque[Event] = deque()

    def compose(self) -> ComposeResult:
        """Status, progress, conversation | statistics, breakdown, input, log, footer."""
        yield StatusBar(id="status")
        with Horizontal(id="loading"):
            yield Static("loading", id="load-step")
            yield ProgressBar(total=100, show_eta=False, id="load-bar")
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
            # SIGTERM quits like q: the turn stopped, threads joined, temporary files removed.
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self.action_quit_app)
        self.set_interval(1 / DRAIN_HZ, self._drain)
        if self.gpu is not None and self.gpu.available:
            self.set_interval(GPU_POLL_S, self._poll_gpu)
            self._poll_gpu()
        if self.build is not None:
            self.loader = threading.Thread(target=self._load, name="session-loader", daemon=True)
            self.loader.start()
            self.set_interval(0.5, self._tick_load_step)

    def _poll_gpu(self) -> None:
        """One NVML read: the status line and the memory trend show the same sample."""
        if self.gpu is not None and self.is_running:  # not while the screen is taken down
            sample, line = self.gpu.reading()
            self.query_one(StatusBar).set(gpu=line)
            if sample is not None:
                self.query_one(SessionStats).add_gpu_sample(sample)

    def _load(self) -> None:
        """Loader thread: build the session; report progress and the result as messages."""
        assert self.build is not None
        try:
            session = self.build(self.emit, self._progress, self.cancel_load)
            if self.cancel_load.is_set():  # quit came as the last step finished
                session.close()
                raise LoadCancelled("cancelled")
            self.loop = self._make_loop(session)
        except Exception as e:  # shown to the user; the app stays up for text or quit
            self.post_message(LoadFailed(e))
            return
        self.post_message(SessionReady(session.info(), session, tuple(session.notices)))

    def _progress(self, step: str, fraction: float) -> None:
        self.post_message(LoadProgress(step, fraction))

    def _tick_load_step(self) -> None:
        """Seconds on the current load step, so a long one (an engine build) never looks frozen."""
        if self.query_one("#loading").display:
            text, since = self.load_step
            self.query_one("#load-step", Static).update(f"{text}  {time.monotonic() - since:.0f} s")

    def _make_loop(self, session: Session) -> LiveLoop:
        speaker: AudioSink | None = session.speaker
        if speaker is None and self.input_wav is not None and session.synthesizer is not None:
            speaker = FileSink()  # replay without a speaker: the reply is rendered, not played
        endpointer = session.endpointer() if session.mic is not None else None
        loop = LiveLoop(session.pipeline, session.mic, speaker, endpointer, self.emit, session.settings_turn)
        loop.listening, loop.muted = self.listening, self.muted
        return loop

    def emit(self, event: Event) -> None:
        """The pipeline's event callback (any thread): queued for the UI's next drain."""
        self._inbox.append(event)  # deque.append is thread-safe

    # --- messages -------------------------------------------------------------------------

    def on_load_progress(self, message: LoadProgress) -> None:
        """Move the progress bar."""
        if self.quitting:
            return
        if message.step != self.load_step[0]:
            self.load_step = (message.step, time.monotonic())
        self._tick_load_step()
        self.query_one(ProgressBar).update(progress=100 * message.fraction)

    def on_load_failed(self, message: LoadFailed) -> None:
        """Say what failed; the fix is in the message (ModelNotFound names the command)."""
        if self.quitting:  # the cancelled load has closed what it opened: now exit
            self.exit(0)
            return
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
            self.loop.pipeline.options = _with_barge_in(self.loop.pipeline.options, self.barge_in)
            self.loop.start()
            if self.input_wav is not None:
                self._replay(self.input_wav)

    def _idle_state(self) -> str:
        if not self.has_mic:
            return "text mode"
        if self.fold.lost_devices:
            return self.fold.lost_state()
        return "muted" if self.muted else "listening" if self.listening else "paused"

    def _replay(self, path: Path) -> None:
        from assistant.stages.asr import load_wav
        from assistant.stages.vad import find_utterance

        assert self.loop is not None
        assert self.session is not None
        speech, delay_ms = find_utterance(load_wav(path), self.settings.vad, path, self.session.turn_policy)
        turn = self.loop.submit_speech(speech, delay_ms)
        self.query_one(Conversation).notice(f"turn {turn}: replaying {path.name}")

    def on_pipeline_event(self, message: PipelineEvent) -> None:
        """An event posted as a message (tests, snapshots): shown at once."""
        self._inbox.append(message.event)
        self._drain()

    def _drain(self) -> None:
        """Fold the events that came since the last drain into the conversation, breakdown, status.

        The pipeline's threads only append to the inbox (``emit``); the UI drains it
        :data:`DRAIN_HZ` times a second rather than being woken for every token, which
        would take the GIL from the decode loop each time.
        """
        if not self._inbox or not self.is_running:
            return
        live: int | None = None
        status, conversation = self.query_one(StatusBar), self.query_one(Conversation)
        while self._inbox:
            event = self._inbox.popleft()
            if isinstance(event, TurnDone) and isinstance(event.record, TurnRecord):
                self.turn_done(event.record)
                live = None if live == event.turn_id else live
            elif isinstance(event, AudioDeviceLost | AudioDeviceRestored):
                self.fold.apply(event, status, conversation)
                lost = isinstance(event, AudioDeviceLost)
                self.notify(
                    device_notice(event), title="sound device", severity="warning" if lost else "information"
                )
                status.set(state=self._idle_state())
            elif self.fold.apply(event, status, conversation):
                live = event.turn_id
        conversation.flush()
        if live is not None and live in self.turn_events:
            self.query_one(LatencyBreakdown).show(self._live_record(live), done=False)

    @property
    def turn_events(self) -> dict[int, list[Event]]:
        """The events so far of each turn in flight."""
        return self.fold.turn_events

    def _live_record(self, turn: int) -> TurnRecord:
        return build_record(turn, self.turn_events.get(turn, []))

    def turn_done(self, record: TurnRecord) -> None:
        """A finished turn: last-turn breakdown, statistics, back to idle."""
        self.turn_events.pop(record.turn_id, None)
        self.records.append(record)
        self.query_one(LatencyBreakdown).show(record, done=True)
        self.query_one(SessionStats).update_records(self.records)
        self.query_one(StatusBar).set(state=self._idle_state())

    def on_log_line(self, message: LogLine) -> None:
        """Append to the log pane."""
        self.query_one(RichLog).write(message.text)

    def on_input_submitted(self, message: Input.Submitted) -> None:
        """Send the typed message as a turn; focus goes back so the keys work again."""
        text = message.value.strip()
        message.input.value = ""
        self.action_leave_input()
        if not text:
            return
        if self.loop is None or self.session is None:  # the session is set once it is ready
            self.query_one(Conversation).notice("still loading: try again in a moment")
            return
        self.loop.submit_text(text)
        self.query_one(StatusBar).set(state="thinking")

    # --- actions --------------------------------------------------------------------------

    def action_toggle_listening(self) -> None:
        """Space: stop or resume listening to the microphone."""
        self.listening = not self.listening
        if self.loop is not None:
            self.loop.listening = self.listening
        self.query_one(StatusBar).set(state=self._idle_state())

    def action_mute(self) -> None:
        """M: mute or unmute the microphone."""
        self.muted = not self.muted
        if self.loop is not None:
            self.loop.muted = self.muted
        self.query_one(StatusBar).set(state=self._idle_state())

    def action_type(self) -> None:
        """T: show the text input and focus it."""
        box = self.query_one(Input)
        box.display = True
        box.focus()

    def action_leave_input(self) -> None:
        """Esc (or Enter): hide the input and move focus off it."""
        box = self.query_one(Input)
        box.display = False
        self.set_focus(None)

    def action_barge_in(self) -> None:
        """B: let speech interrupt replies (headsets), or not."""
        self.barge_in = not self.barge_in
        if self.loop is not None:
            self.loop.pipeline.options = _with_barge_in(self.loop.pipeline.options, self.barge_in)
        self.query_one(StatusBar).set(barge_in=self.barge_in)
        self.notify(f"barge-in {'on: use a headset' if self.barge_in else 'off'}")

    def action_export(self) -> None:
        """E: write the session's latency report (CSV and JSON)."""
        stem = time.strftime("latency-%Y%m%d-%H%M%S")
        try:
            csv_path, json_path = export_report(self.records, self.export_dir, stem)
        except OSError as e:
            self.notify(f"export failed: {e}", severity="error")
            return
        self.notify(f"{len(self.records)} turns -> {csv_path}, {json_path}", title="latency report")

    def action_log(self) -> None:
        """L: show or hide the log pane."""
        log = self.query_one(RichLog)
        log.display = not log.display

    def action_quit_app(self) -> None:
        """Q: stop the turn in progress, join the threads, close the streams, exit.

        While the models load, the load is cancelled first and the app exits when the
        loader has stopped (at its next step), so nothing it opened is left behind.
        """
        if self.loader is not None and self.loader.is_alive():
            self.quitting = True
            self.cancel_load.set()
            self.load_step = ("quitting: stopping the load at its next step", time.monotonic())
            self._tick_load_step()
            return
        self.shutdown()
        self.exit(0)

    def on_unmount(self) -> None:
        """The app is going, however it goes: nothing it started may outlive it."""
        self.shutdown()

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


def _with_barge_in(options: PipelineOptions, on: bool) -> PipelineOptions:
    return replace(options, barge_in=on)
