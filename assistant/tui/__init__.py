"""The Textual terminal UI: conversation, live latency breakdown, session statistics."""

from assistant.tui.app import AssistantApp, run_tui

__all__ = ["AssistantApp", "run_tui"]
