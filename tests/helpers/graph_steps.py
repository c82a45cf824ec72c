"""What a batched CUDA-graph step captured, for the CPU and GPU tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engines.serving.batching_graph import BatchedGraphStep
from engines.serving.mixed_step import Packing


def _recording(table: dict[Any, Callable[[], None]], ran: list[Any]) -> dict[Any, Callable[[], None]]:
    """``table`` with each run noting its key in ``ran`` first."""

    def recorded(key: Any, run: Callable[[], None]) -> Callable[[], None]:
        def wrapper() -> None:
            ran.append(key)
            run()

        return wrapper

    return {key: recorded(key, run) for key, run in table.items()}


def record_buckets(step: BatchedGraphStep) -> list[int]:
    """The bucket each decode step of ``step`` runs, in order."""
    ran: list[int] = []
    step.decodes = _recording(step.decodes, ran)
    return ran


def record_packings(step: BatchedGraphStep) -> list[Packing]:
    """The packing each mixed step (chunked prefill) of ``step`` runs, in order."""
    ran: list[Packing] = []
    step.mixeds = _recording(step.mixeds, ran)
    return ran
