"""TensorRT's callbacks as ours: progress as events, log messages as :mod:`logging`.

``IProgressMonitor`` becomes :class:`~engines.progress.EngineProgress` events; ``ILogger``
sends TensorRT's messages to this module's logger.

The callbacks run on TensorRT's builder threads: they must be thread-safe and quick.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from engines.progress import EngineProgress, ProgressCallback, Stage

logger = logging.getLogger(__name__)


def make_monitor(trt: Any, callback: ProgressCallback | None, cancel: threading.Event | None = None) -> Any:
    """An ``IProgressMonitor`` of ``trt`` (either flavour) that forwards phases to ``callback``.

    Setting ``cancel`` makes TensorRT stop the build at its next step.
    """

    class Monitor(trt.IProgressMonitor):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.lock = threading.Lock()
            self.parents: dict[str, str] = {}
            self.sizes: dict[str, int] = {}

        def _send(self, phase: str, step: int, finished: bool = False) -> None:
            if callback is not None:
                event = EngineProgress(
                    Stage.BUILD,
                    phase,
                    phase=phase,
                    parent=self.parents.get(phase, ""),
                    step=step,
                    num_steps=self.sizes.get(phase, 0),
                    finished=finished,
                    t_ns=time.monotonic_ns(),
                )
                callback(event)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            with self.lock:
                self.parents[phase_name] = parent_phase or ""
                self.sizes[phase_name] = num_steps
                self._send(phase_name, 0)

        def step_complete(self, phase_name: str, step: int) -> bool:
            with self.lock:
                self._send(phase_name, step + 1)
            return not (cancel is not None and cancel.is_set())

        def phase_finish(self, phase_name: str) -> None:
            with self.lock:
                self._send(phase_name, self.sizes.get(phase_name, 0), finished=True)

    return Monitor()


def make_logger(trt: Any) -> Any:
    """An ``ILogger`` sending TensorRT's messages to :mod:`logging` (info and verbose at debug)."""

    class Logger(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            s = trt.ILogger.Severity
            level = {
                s.INTERNAL_ERROR: logging.ERROR,
                s.ERROR: logging.ERROR,
                s.WARNING: logging.WARNING,
            }.get(severity, logging.DEBUG)
            if "Int64 binding" in msg:  # the runtime binds int64 ids, as the parser asks
                level = logging.DEBUG
            logger.log(level, "TensorRT: %s", msg)

    return Logger()
