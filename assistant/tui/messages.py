"""Messages from the worker threads to the UI (the UI learns state only from these)."""

from __future__ import annotations

from textual.message import Message

from assistant.app import Session, SessionInfo
from assistant.events import Event


class PipelineEvent(Message):
    """A pipeline event (``assistant.events``), posted from the thread that emitted it."""

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class LoadProgress(Message):
    """Model loading has reached ``step`` (``fraction`` of the whole load, 0..1)."""

    def __init__(self, step: str, fraction: float) -> None:
        super().__init__()
        self.step = step
        self.fraction = fraction


class SessionReady(Message):
    """Loading finished; ``session`` is None when the UI runs without one (snapshots)."""

    def __init__(
        self, info: SessionInfo, session: Session | None = None, notices: tuple[str, ...] = ()
    ) -> None:
        super().__init__()
        self.info = info
        self.session = session
        self.notices = notices


class LoadFailed(Message):
    """Building the session raised ``error``."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error


class LogLine(Message):
    """A formatted log record for the log pane."""

    def __init__(self, text: str, level: int) -> None:
        super().__init__()
        self.text = text
        self.level = level
