"""The Textual terminal UI: conversation, live latency breakdown, session statistics."""

from assistant.tui.app import AssistantApp
from assistant.tui.run import run_tui

__all__ = ["AssistantApp", "run_tui"]
