"""What a batched CUDA-graph step captured, for the CPU and GPU tests."""

from __future__ import annotations

from engines.serving.batching_graph import BatchedGraphStep
from engines.serving.mixed_step import Packing


def record_buckets(step: BatchedGraphStep) -> list[int]:
    """The bucket each decode step of ``step`` runs, in order."""
    ran: list[int] = []

    def recorded(n, run):
        def wrapper():
            ran.append(n)
            run()

        return wrapper

    step.decodes = {n: recorded(n, run) for n, run in step.decodes.items()}
    return ran


def record_packings(step: BatchedGraphStep) -> list[Packing]:
    """The packing each mixed step (chunked prefill) of ``step`` runs, in order."""
    ran: list[Packing] = []

    def recorded(packing, run):
        def wrapper():
            ran.append(packing)
            run()

        return wrapper

    step.mixeds = {p: recorded(p, run) for p, run in step.mixeds.items()}
    return ran
