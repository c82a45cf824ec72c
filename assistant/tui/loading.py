"""The loading line: the current load step, the seconds spent on it, and the progress bar."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import ProgressBar, Static

TICK_S = 0.5  # how often the app redraws the seconds on the current step


class LoadingLine(Horizontal):
    """Shown while the session loads; the app hides it once the session is ready or failed.

    It counts the seconds on each step, so a long one (an engine build) never looks frozen.
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.step = ("loading", time.monotonic())

    def compose(self) -> ComposeResult:
        """The step and its seconds, then the bar."""
        yield Static("loading", id="load-step", markup=False)  # steps name paths: plain text
        yield ProgressBar(total=100, show_eta=False, id="load-bar")

    def tick(self) -> None:
        """Seconds on the current load step."""
        if self.display:
            text, since = self.step
            self.query_one("#load-step", Static).update(f"{text}  {time.monotonic() - since:.0f} s")

    def progress(self, step: str, fraction: float) -> None:
        """A load step's progress: the clock restarts when the step changes."""
        if step != self.step[0]:
            self.step = (step, time.monotonic())
        self.tick()
        self.query_one(ProgressBar).update(progress=100 * fraction)

    def say(self, text: str) -> None:
        """Replace the step's text (quitting), restarting its clock."""
        self.step = (text, time.monotonic())
        self.tick()
