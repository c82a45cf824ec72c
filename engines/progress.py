"""Getting a decoder ready as typed events: ONNX export, engine cache hit, build phases, warm-up.

A UI subscribes with a callback taking :class:`EngineProgress`; the CLI prints them
(``assistant engine build``). Events may come from TensorRT's builder threads: a callback
must be thread-safe and quick (post a message, do not draw).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


class Stage(enum.StrEnum):
    """What an :class:`EngineProgress` event is about (a ``str``: logs and JSON show the word)."""

    EXPORT = "export"  # an ONNX export started (the export cache missed)
    PARSE = "parse"  # TensorRT parses the ONNX export
    BUILD = "build"  # a TensorRT builder phase (``phase``, ``step`` of ``num_steps``)
    SAVE = "save"  # the built engine is written into its cache folder
    CACHED = "cached"  # a cache hit
    MISS = "miss"  # a cache had nothing usable
    REBUILD = "rebuild"  # a cached engine was unusable; it is built again (``reason``)
    WARMUP = "warmup"  # the engine ran its warm-up
    DONE = "done"  # an engine was built
    CONVERT = "convert"  # a GGUF file converting into the store (``step`` of 100)
    WAIT = "wait"  # another process holds the cache entry; waiting for it
    GATE = "gate"  # the accuracy gate checks a TensorRT engine against PyTorch


class Cache(enum.StrEnum):
    """The caches that make a second start fast; the metrics count a hit or a miss of each."""

    ONNX_EXPORT = "onnx_export"
    ENGINE = "engine"
    TIMING_CACHE = "timing_cache"
    RUNTIME_CACHE = "runtime_cache"
    COMPILE_CACHE = "compile_cache"


class RebuildReason(enum.StrEnum):
    """Why a ``rebuild`` happened."""

    UNUSABLE = "unusable"  # the cache check refused the entry
    INCOMPATIBLE = "incompatible"  # TensorRT refused the engine on this machine


@dataclass(frozen=True)
class EngineProgress:
    """One step of getting an engine ready.

    Attributes:
        stage: What happened (:class:`Stage`).
        message: Human-readable line (phase name, or what happened).
        phase: TensorRT phase name for ``build`` events, else ``""``.
        parent: The enclosing TensorRT phase, ``""`` at the top level.
        step: Steps of ``phase`` completed so far.
        num_steps: Steps ``phase`` has (0 when not a TensorRT phase).
        finished: The phase ended.
        t_ns: ``time.monotonic_ns()`` when it happened.
        cache: Which cache a ``cached``/``miss``/``export``/``rebuild``/``done`` event is about
            (:class:`Cache`), else ``""``.
        reason: Why a ``rebuild`` happened (:class:`RebuildReason`), else ``""``.
    """

    stage: Stage
    message: str
    phase: str = ""
    parent: str = ""
    step: int = 0
    num_steps: int = 0
    finished: bool = False
    t_ns: int = 0
    cache: Cache | str = ""
    reason: RebuildReason | str = ""


CACHES = tuple(Cache)
"""Every :class:`Cache`, in order (the metrics show a zero for each before its first lookup)."""

REBUILD_REASONS = tuple(RebuildReason)
"""Every :class:`RebuildReason`."""


ProgressCallback = Callable[[EngineProgress], None]


def emit(
    callback: ProgressCallback | None,
    stage: Stage,
    message: str,
    *,
    cache: Cache | None = None,
    reason: RebuildReason | None = None,
) -> None:
    """Send a stage event (not a TensorRT phase) to ``callback`` if there is one."""
    assert stage != Stage.REBUILD or reason is not None, stage
    if callback is not None:
        event = EngineProgress(
            stage, message, t_ns=time.monotonic_ns(), cache=cache or "", reason=reason or ""
        )
        callback(event)


def emit_lookup(callback: ProgressCallback | None, cache: Cache, hit: bool, message: str) -> None:
    """A ``cached`` (hit) or ``miss`` event of ``cache``."""
    emit(callback, Stage.CACHED if hit else Stage.MISS, message, cache=cache)


class ConsolePrinter:
    """A callback printing top-level phases and stage messages, one line each, with elapsed time."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self.start_ns = time.monotonic_ns()
        self.lock = threading.Lock()

    def __call__(self, event: EngineProgress) -> None:
        """Print ``event`` if it is a stage or the start/end of a top-level TensorRT phase."""
        if event.stage == Stage.BUILD and (event.parent or (event.step > 0 and not event.finished)):
            return
        elapsed_s = (event.t_ns - self.start_ns) / 1e9
        what = event.message
        if event.stage == Stage.BUILD:
            what = f"{event.phase} ({'done' if event.finished else f'{event.num_steps} steps'})"
        with self.lock:
            self.write(f"[{elapsed_s:6.1f} s] {event.stage}: {what}")
