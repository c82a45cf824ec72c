"""``run_tui``: the UI on the configured stages, with logging, stderr and the GIL set for it."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
from textual.app import App

from assistant.app import Progress, Session, build_session
from assistant.config import Settings
from assistant.events import Event, MicLevel
from assistant.observe.latency import EventLog
from assistant.observe.metrics import Metrics, serving
from assistant.tui.app import UI_SWITCH_INTERVAL_S, AssistantApp
from assistant.tui.messages import LogLine
from assistant.tui.stderr import StderrToLog


class _UiLogHandler(logging.Handler):
    """Sends log records to the app's log pane (the terminal belongs to the UI)."""

    def __init__(self, app: App[int]) -> None:
        super().__init__(logging.INFO)
        self.app = app
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        """Post the formatted record."""
        try:
            self.app.post_message(LogLine(self.format(record), record.levelno))
        except Exception:  # a log line must never take the app down
            self.handleError(record)


def run_tui(
    settings: Settings,
    *,
    input_wav: Path | None = None,
    input_audio: np.ndarray | None = None,
    log_path: Path | None = None,
    events_path: Path | None = None,
    export_dir: Path | None = None,
) -> int:
    """Open the UI on the configured stages until ``q``; returns the exit status.

    ``input_audio`` is ``input_wav`` already read (by the start-up check), so it is not read twice.

    With ``[metrics] port`` set, Prometheus metrics are served while the UI runs (the port is
    opened first: one in use fails before any model loads).
    """
    with serving(settings.metrics) as metrics:
        return _run(settings, metrics, input_wav, input_audio, log_path, events_path, export_dir)


def _run(
    settings: Settings,
    metrics: Metrics | None,
    input_wav: Path | None,
    input_audio: np.ndarray | None,
    log_path: Path | None,
    events_path: Path | None,
    export_dir: Path | None,
) -> int:
    event_log = EventLog(events_path) if events_path else None
    app: AssistantApp

    def build(emit: Callable[[Event], None], progress: Progress, cancel: threading.Event) -> Session:
        def both(event: Event) -> None:
            if event_log is not None and not isinstance(event, MicLevel):
                event_log(event)
            if metrics is not None:
                metrics(event)
            emit(event)

        wav = input_wav is not None
        session = build_session(
            settings,
            asr=True if wav else None,
            tts=True if wav else None,
            emit=both,
            log_path=log_path,
            progress=progress,
            cancel=cancel,
            engine_events=metrics.engine_event if metrics else None,
        )
        if metrics is not None:
            asr_model = session.transcriber.description if session.transcriber else ""
            metrics.attach(session.dialogue.decoder, settings.models.llm, asr_model)
        return session

    app = AssistantApp(
        build, input_wav=input_wav, input_audio=input_audio, settings=settings, export_dir=export_dir
    )
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [_UiLogHandler(app)]
    root.setLevel(min(root.level, logging.INFO))
    switch_s = sys.getswitchinterval()
    sys.setswitchinterval(UI_SWITCH_INTERVAL_S)

    # ALSA and PortAudio print to fd 2; in the log pane, not over the screen.
    def to_log_pane(line: str) -> None:
        app.post_message(LogLine(line, logging.WARNING))

    capture = StderrToLog(to_log_pane)
    code = 1
    try:
        with capture:
            result = app.run()
        # A crash returns None, with return_code 1 and the traceback printed (into the pipe:
        # replayed below); q returns 0.
        code = app.return_code if app.return_code is not None else (result or 0)
        return code
    finally:
        app.shutdown()
        sys.setswitchinterval(switch_s)
        root.handlers = saved
        if event_log is not None:
            event_log.close()
        if code != 0:
            capture.replay()  # a crash's traceback went to the pipe: show it now
