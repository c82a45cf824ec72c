"""The events of the turns in flight, and the record each one leaves.

Events come from several threads (the turn's, TTS, playback, the capture thread); each is
kept until its turn is done, then :func:`~assistant.observe.latency.build_record` turns them
into the turn's :class:`TurnRecord` (appended to ``--log`` as one JSON line).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from assistant.events import Event, TurnDone
from assistant.observe.latency import TurnRecord, build_record
from store.files import append_line


class TurnLog:
    """Keeps events for their turn's record and passes each on to ``emit``."""

    def __init__(self, emit: Callable[[Event], None] | None, log_path: Path | None) -> None:
        self._emit = emit
        self.log_path = log_path
        self.records: list[TurnRecord] = []
        self._events: list[Event] = []
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        """Keep an event and pass it on."""
        with self._lock:
            self._events.append(event)
        if self._emit:
            self._emit(event)

    def emitted(self, event: Event) -> bool:
        """Whether this very event was emitted already (the live loop emits endpointer events first)."""
        with self._lock:
            return any(e is event for e in self._events)

    def forget_before(self, turn: int) -> None:
        """Keep only ``turn``'s events (and later turns' already heard): earlier turns are done."""
        with self._lock:
            self._events[:] = [e for e in self._events if e.turn_id >= turn]

    def finish(self, turn: int, **identity: str) -> TurnRecord:
        """``turn``'s record from its events (``identity``: the models that answered it), logged."""
        with self._lock:
            events = list(self._events)
        record = build_record(turn, events, **identity)
        self.records.append(record)
        if self.log_path:
            append_line(self.log_path, record.to_json())
        self.emit(TurnDone(turn, time.monotonic_ns(), record))
        return record
