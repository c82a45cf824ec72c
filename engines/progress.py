"""Getting a decoder ready as typed events: ONNX export, engine cache hit, build phases, warm-up.

A UI subscribes with a callback taking :class:`EngineProgress`; the CLI prints them
(``assistant engine build``). Events may come from TensorRT's builder threads: a callback
must be thread-safe and quick (post a message, do not draw).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineProgress:
    """One step of getting an engine ready.

    Attributes:
        stage: ``export``, ``parse``, ``build`` (TensorRT phases), ``save``, ``cached`` (a
            cache hit), ``miss`` (a cache had nothing usable), ``rebuild`` (a cached engine
            was unusable), ``warmup``, ``done`` (an engine was built) or ``convert`` (a GGUF
            file converting into the store; ``step`` of ``num_steps`` = 100).
        message: Human-readable line (phase name, or what happened).
        phase: TensorRT phase name for ``build`` events, else ``""``.
        parent: The enclosing TensorRT phase, ``""`` at the top level.
        step: Steps of ``phase`` completed so far.
        num_steps: Steps ``phase`` has (0 when not a TensorRT phase).
        finished: The phase ended.
        t_ns: ``time.monotonic_ns()`` when it happened.
        cache: Which cache a ``cached``/``miss``/``export``/``rebuild``/``done`` event is about:
            one of :data:`CACHES`, else ``""``.
        reason: Why a ``rebuild`` happened, as a short word (``unusable``, ``incompatible``).
    """

    stage: str
    message: str
    phase: str = ""
    parent: str = ""
    step: int = 0
    num_steps: int = 0
    finished: bool = False
    t_ns: int = 0
    cache: str = ""
    reason: str = ""


CACHES = ("onnx_export", "engine", "timing_cache", "runtime_cache", "compile_cache")
"""The caches that make a second start fast; the metrics count a hit or a miss of each."""

REBUILD_REASONS = ("unusable", "incompatible")
"""Why a ``rebuild`` happened: the cache check refused the entry, or TensorRT refused the engine."""


ProgressCallback = Callable[[EngineProgress], None]


def emit(
    callback: ProgressCallback | None, stage: str, message: str, *, cache: str = "", reason: str = ""
) -> None:
    """Send a stage event (not a TensorRT phase) to ``callback`` if there is one."""
    assert cache in ("", *CACHES), cache
    assert stage != "rebuild" or reason in REBUILD_REASONS, reason
    if callback is not None:
        callback(EngineProgress(stage, message, t_ns=time.monotonic_ns(), cache=cache, reason=reason))


def emit_lookup(callback: ProgressCallback | None, cache: str, hit: bool, message: str) -> None:
    """A ``cached`` (hit) or ``miss`` event of ``cache``."""
    emit(callback, "cached" if hit else "miss", message, cache=cache)


class ConsolePrinter:
    """A callback printing top-level phases and stage messages, one line each, with elapsed time."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self.start_ns = time.monotonic_ns()
        self.lock = threading.Lock()

    def __call__(self, event: EngineProgress) -> None:
        """Print ``event`` if it is a stage or the start/end of a top-level TensorRT phase."""
        if event.stage == "build" and (event.parent or (event.step > 0 and not event.finished)):
            return
        elapsed_s = (event.t_ns - self.start_ns) / 1e9
        what = event.message
        if event.stage == "build":
            what = f"{event.phase} ({'done' if event.finished else f'{event.num_steps} steps'})"
        with self.lock:
            self.write(f"[{elapsed_s:6.1f} s] {event.stage}: {what}")
