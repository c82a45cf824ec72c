"""Helpers for the UI tests: the screen as plain text."""

from __future__ import annotations

import io

from rich.console import Console


def screen_text(app) -> str:
    """What the terminal shows now, as plain text (one line per row)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True, force_terminal=True)
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()
