"""The scheduler's bookkeeping: requests, cache rows and the counts of its steps (:mod:`.batching`)."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from engines.base import GenerationOptions, StopReason
from engines.sampling import Sampler

HISTORY = 4096  # per-step batch sizes kept


class RequestError(ValueError):
    """A request the scheduler refuses (empty prompt, prompt too long); the message says why."""


@dataclass
class BatchedRequest:
    """One generation in the batch; iterate :meth:`tokens` for ``(token_id, t_ns)`` pairs.

    ``stop_reason`` and the counts are final once the iteration ends.
    """

    session: str
    prompt_ids: list[int]
    options: GenerationOptions
    t_submit_ns: int = field(default_factory=time.monotonic_ns)
    reused_tokens: int = 0
    generated_tokens: int = 0
    stop_reason: StopReason | None = None
    error: str = ""
    row: int = -1
    sampler: Sampler | None = None
    context: list[int] = field(default_factory=list)
    last_token: int = -1
    prefilled: int = 0  # chunked prefill: prompt tokens in the row's cache so far
    cancelled: threading.Event = field(default_factory=threading.Event)
    out: queue.Queue[tuple[int, int] | None] = field(default_factory=queue.Queue)
    tag: Any = None  # the submitter's own (the server's stream of this request)

    def cancel(self) -> None:
        """Stop generating (the client left or has what it needs); the row is freed at the next step."""
        self.cancelled.set()

    def tokens(self) -> Iterator[tuple[int, int]]:
        """Yield each chosen ``(token_id, t_ns)``; lazy, blocks until the scheduler produces them.

        Raises:
            RequestError: The scheduler failed this sequence (``error`` says why).
        """
        while (item := self.out.get()) is not None:
            yield item
        if self.error:
            raise RequestError(self.error)


@dataclass
class Row:
    """A KV-cache row: the session whose prefix it holds, and whether a sequence runs on it."""

    session: str = ""
    cached_ids: list[int] = field(default_factory=list)
    busy: bool = False
    last_used_ns: int = 0


def place_session(rows: list[Row], session: str, swap_rows: Callable[[int, int, int], None]) -> int | None:
    """The lowest free row, holding ``session``'s cached prefix if it has one; None when all are busy.

    Decode steps run over rows ``0..highest running``, so running sequences are kept low:
    the session's own row (or, for a new session, an empty row, else the one idle the
    longest, whose prefix is dropped) is swapped into the lowest free row, its cached
    keys with it; the idle session that sat there keeps its prefix in the other row.
    """
    free = [i for i, r in enumerate(rows) if not r.busy]
    if not free:
        return None
    lowest = free[0]
    own = next((i for i in free if session and rows[i].session == session), None)
    if own is None:
        empty = [i for i in free if not rows[i].session]
        own = empty[0] if empty else min(free, key=lambda i: rows[i].last_used_ns)
        rows[own] = Row(session=session)
    if own != lowest:
        slots = max(len(rows[own].cached_ids), len(rows[lowest].cached_ids))
        if slots:
            swap_rows(own, lowest, slots)
        rows[own], rows[lowest] = rows[lowest], rows[own]
    return lowest


@dataclass
class StepCounts:
    """What the scheduler ran, for the server's log and tests; the per-step history is bounded."""

    steps: int = 0  # decode steps run
    decoded: int = 0  # sequences advanced, summed over the steps
    prefills: int = 0  # prefill forwards run (chunked: steps that carried prompt chunks)
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY))  # per decode step
    prefill_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY))  # per prefill
    decode_ns: int = 0  # time in decode steps (host view, logits on the device)
    chunk_step_ns: int = 0  # chunked prefill: time in the steps that carried prompt chunks

    def decode_step(self, sequences: int, step_ns: int) -> None:
        """Count a decode step that advanced ``sequences``."""
        self.steps += 1
        self.decode_ns += step_ns
        self.decoded += sequences
        self.batch_sizes.append(sequences)

    def prompt_step(self, prompts: int, step_ns: int = 0) -> None:
        """Count a prefill forward (or a step carrying chunks, ``step_ns`` long) of ``prompts``."""
        self.prefills += 1
        self.prefill_sizes.append(prompts)
        self.chunk_step_ns += step_ns

    def summary(self, chunked: bool) -> str:
        """Decode steps, their mean time and batch size, prefill forwards (for the server's log)."""
        steps = max(self.steps, 1)
        prefills = f"{self.prefills} prefill forwards"
        if chunked:
            each = self.chunk_step_ns / 1e6 / max(self.prefills, 1)
            prefills = f"{self.prefills} steps with prompt chunks, {each:.1f} ms each"
        return (
            f"{self.steps} decode steps, {self.decode_ns / 1e6 / steps:.1f} ms and "
            f"{self.decoded / steps:.1f} sequences each; {prefills}"
        )
