"""The UI's keys and what they do to the running session (quitting is the app's own)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from textual.app import App
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.widgets import Input, RichLog

from assistant.app import Session
from assistant.observe.latency import TurnRecord
from assistant.observe.report import export_report
from assistant.tui.conversation import Conversation
from assistant.tui.fold import TurnFold
from assistant.tui.status import StatusBar
from assistant.turns.live import LiveLoop

BARGE_IN_NEXT = {"auto": "on", "on": "off", "off": "auto"}
BARGE_IN_WORDS = {
    "auto": "speech stops the reply while echo cancellation works",
    "on": "speech always stops the reply (use a headset without echo cancellation)",
    "off": "replies are never stopped; speech over them is answered after",
}


class KeyActions(App[int]):
    """The key bindings and their actions; :class:`~assistant.tui.app.AssistantApp` sets the state."""

    BINDINGS = [
        Binding("space", "toggle_listening", "Listen"),
        Binding("m", "mute", "Mute"),
        Binding("t", "type", "Type"),
        Binding("s", "stop_reply", "Stop"),
        Binding("b", "barge_in", "Barge-in"),
        Binding("e", "export", "Export"),
        Binding("l", "log", "Log"),
        Binding("q", "quit_app", "Quit"),
        Binding("ctrl+q,ctrl+c", "quit_app", "Quit", show=False, priority=True),
        Binding("escape", "leave_input", "Back", show=False),
    ]

    listening: bool
    muted: bool
    barge_in: str
    has_mic: bool
    loop: LiveLoop | None
    session: Session | None
    load_error: BaseException | None
    fold: TurnFold
    records: list[TurnRecord]
    export_dir: Path

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """Textual's ``notify``, plain text unless asked: messages hold paths and errors.

        A path such as ``m[/x]`` read as markup raised ``MarkupError`` and took the app down;
        ``models [old]/m`` lost its ``[old]``.
        """
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def _idle_state(self) -> str:
        if not self.has_mic:
            return "text mode"
        if self.fold.lost_devices:
            return self.fold.lost_state()
        return "muted" if self.muted else "listening" if self.listening else "paused"

    def _push_barge_in(self) -> None:
        """The barge-in setting, to the pipeline of the running loop."""
        if self.loop is not None:
            self.loop.pipeline.options = replace(self.loop.pipeline.options, barge_in=self.barge_in)
            self.loop.set_barge_in(self.barge_in)

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

    def action_stop_reply(self) -> None:
        """S: stop the reply being written or spoken, as a spoken "stop" would (what played is kept)."""
        if self.loop is None or not self.loop.stop_reply():
            self.notify("nothing to stop: no reply is being written or spoken")

    def action_barge_in(self) -> None:
        """B: barge-in auto (while echo cancellation works), on (headsets) or off, in turn."""
        self.barge_in = BARGE_IN_NEXT[self.barge_in]
        self._push_barge_in()
        self.query_one(StatusBar).set(barge_in=self.barge_in)
        self.notify(f"barge-in {self.barge_in}: {BARGE_IN_WORDS[self.barge_in]}")

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

    def on_input_submitted(self, message: Input.Submitted) -> None:
        """Send the typed message as a turn; focus goes back so the keys work again."""
        text = message.value.strip()
        message.input.value = ""
        self.action_leave_input()
        if not text:
            return
        if self.load_error is not None:  # it will never be ready: say why again, not "still loading"
            self.query_one(Conversation).notice(
                f"cannot answer: the start failed ({self.load_error}); quit with q", error=True
            )
            return
        if self.loop is None or self.session is None:  # the session is set once it is ready
            self.query_one(Conversation).notice("still loading: try again in a moment")
            return
        self.loop.submit_text(text)
        self.query_one(StatusBar).set(state="thinking")
