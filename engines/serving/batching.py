"""In-flight (continuous) batching: many conversations decoded by one model, one step at a time.

The KV cache has one row per sequence slot. Each decode step advances every running sequence
by one token, each at its own position (``models`` takes per-row positions), and sequences
leave as soon as they stop. Newcomers join in one of two ways: with chunked prefill (the
step's ``chunk_shapes``, :mod:`engines.serving.mixed_step`) their prompts ride in the decode
steps, up to the step's token budget each step, and a prompt's last chunk gives its first
token; without it, their prompts are prefilled in forwards of their own between steps. A
session keeps its row between turns, so the next turn prefills only what follows the common
prefix, as :class:`~engines.driver.DecoderDriver` does for one conversation; when every row is
taken, the session idle the longest loses its row.

Token choice is the driver's (:class:`~engines.sampling.Sampler`), so greedy replies are the
same tokens a batch-1 run gives.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engines.base import GenerationOptions, StopReason
from engines.driver import common_prefix_len
from engines.sampling import Sampler
from engines.serving.batched_step import BatchedTorchStep
from engines.serving.mixed_step import Chunk, plan_chunks

HISTORY = 4096  # per-step batch sizes kept
PREFILL_GROUP = 16  # newcomers prefilled in one forward (left-padded to the longest)


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
class _Row:
    session: str = ""
    cached_ids: list[int] = field(default_factory=list)
    busy: bool = False
    last_used_ns: int = 0


def place_session(rows: list[_Row], session: str, swap_rows: Callable[[int, int, int], None]) -> int | None:
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
        rows[own] = _Row(session=session)
    if own != lowest:
        slots = max(len(rows[own].cached_ids), len(rows[lowest].cached_ids))
        if slots:
            swap_rows(own, lowest, slots)
        rows[own], rows[lowest] = rows[lowest], rows[own]
    return lowest


class BatchScheduler:
    """Owns the step and one thread that runs it: submit from any thread, read tokens as they come.

    ``close()`` stops the thread and ends every running sequence as cancelled. With an
    ``outbox``, each item put in a sequence's ``out`` queue is announced there too (the sequence
    itself), so one thread can serve every stream instead of a thread blocked on each.
    """

    def __init__(
        self,
        step: BatchedTorchStep,
        eos_token_ids: Sequence[int],
        outbox: queue.Queue[BatchedRequest | None] | None = None,
    ) -> None:
        self.step = step
        self.outbox = outbox
        self.eos_token_ids = frozenset(eos_token_ids)
        self.capacity_tokens = step.capacity_tokens
        self.rows = [_Row() for _ in range(step.rows)]
        self.waiting: list[BatchedRequest] = []
        self.running: list[BatchedRequest] = []
        self.prefilling: list[BatchedRequest] = []  # chunked prefill: prompts partly in the cache
        self.lock = threading.Condition()
        self.closed = False
        # Counts for the log and tests; the per-step history is bounded (a server runs for days).
        self.steps = 0  # decode steps run
        self.decoded = 0  # sequences advanced, summed over the steps
        self.prefills = 0  # prefill forwards run (chunked: steps that carried prompt chunks)
        self.batch_sizes: deque[int] = deque(maxlen=HISTORY)  # sequences per decode step, latest
        self.prefill_sizes: deque[int] = deque(maxlen=HISTORY)  # prompts a prefill forward or step, latest
        self.decode_ns = 0  # time in decode steps (host view, logits on the device)
        self.chunk_step_ns = 0  # chunked prefill: time in the steps that carried prompt chunks
        self.thread = threading.Thread(target=self._loop, name="batch-scheduler", daemon=True)
        self.thread.start()

    def submit(
        self, session: str, prompt_ids: Sequence[int], options: GenerationOptions, tag: Any = None
    ) -> BatchedRequest:
        """Queue a generation of ``prompt_ids`` for ``session`` (its row keeps the prefix), ``tag`` on it.

        Raises:
            RequestError: The prompt is empty or does not fit the context.
        """
        if not prompt_ids:
            raise RequestError("empty prompt: send at least one token id")
        if len(prompt_ids) >= self.capacity_tokens:
            raise RequestError(
                f"prompt of {len(prompt_ids)} tokens does not fit the server's context of "
                f"{self.capacity_tokens}; shorten the conversation or raise the server's context"
            )
        sequence = BatchedRequest(session, list(prompt_ids), options, tag=tag)
        with self.lock:
            if self.closed:
                raise RequestError("the server is shutting down")
            self.waiting.append(sequence)
            self.lock.notify()
        return sequence

    def busy_rows(self) -> int:
        """Rows held by running sequences."""
        with self.lock:
            return sum(r.busy for r in self.rows)

    def summary(self) -> str:
        """Decode steps, their mean time and batch size, prefill forwards (for the server's log)."""
        steps = max(self.steps, 1)
        mean_batch = self.decoded / steps
        prefills = f"{self.prefills} prefill forwards"
        if self.step.chunk_shapes:
            each = self.chunk_step_ns / 1e6 / max(self.prefills, 1)
            prefills = f"{self.prefills} steps with prompt chunks, {each:.1f} ms each"
        return (
            f"{self.steps} decode steps, {self.decode_ns / 1e6 / steps:.1f} ms and {mean_batch:.1f} "
            f"sequences each; {prefills}"
        )

    def close(self) -> None:
        """Stop the thread; running and waiting sequences end as cancelled."""
        with self.lock:
            self.closed = True
            self.lock.notify()
        self.thread.join()

    def _loop(self) -> None:
        while True:
            with self.lock:
                while not (self.closed or self.waiting or self.running or self.prefilling):
                    self.lock.wait()
                if self.closed:
                    break
                joining = self._admit()
            if self.step.chunk_shapes:
                for sequence in joining:
                    self._start_prompt(sequence)
                self._mixed()
                continue
            for group in range(0, len(joining), PREFILL_GROUP):
                self._prefill(joining[group : group + PREFILL_GROUP])
            self._decode()
        for sequence in self.running + self.prefilling + self.waiting:
            self._finish(sequence, StopReason.CANCELLED)

    def _admit(self) -> list[BatchedRequest]:
        """Give waiting sequences a row (their session's, a free one, or the longest idle)."""
        joining = []
        for sequence in list(self.waiting):
            row = place_session(self.rows, sequence.session, self.step.swap_rows)
            if row is None:
                break  # every row is generating: wait for one to finish
            self.waiting.remove(sequence)
            sequence.row = row
            self.rows[row].busy = True
            joining.append(sequence)
        return joining

    def _prefill(self, joining: list[BatchedRequest]) -> None:
        """Prefill newcomers after their cached prefix: one forward for all (one alone: batch-1)."""
        live: list[tuple[BatchedRequest, list[int], int]] = []
        for sequence in joining:
            if sequence.cancelled.is_set():
                self._finish(sequence, StopReason.CANCELLED)
                continue
            reuse = self._reuse_prefix(sequence)
            live.append((sequence, sequence.prompt_ids[reuse:], reuse))
        if not live:
            return
        self.prefills += 1
        self.prefill_sizes.append(len(live))
        try:
            if len(live) == 1:
                sequence, tokens, start = live[0]
                logits = self.step.prefill(sequence.row, tokens, start)[None]
            else:
                rows, token_lists, starts = zip(*((s.row, t, p) for s, t, p in live), strict=True)
                logits = self.step.prefill_many(rows, token_lists, starts)
        except Exception as e:  # a failed forward ends these requests, not the server
            for sequence, _, _ in live:
                self._finish(sequence, None, f"prefill failed: {e}")
            return
        for (sequence, _, _), row_logits in zip(live, logits, strict=True):
            self.rows[sequence.row].cached_ids = list(sequence.prompt_ids)
            self._begin(sequence, row_logits)

    def _reuse_prefix(self, sequence: BatchedRequest) -> int:
        """Keep the row's cached prefix of ``sequence``'s prompt (all but its last token at most)."""
        row, ids = self.rows[sequence.row], sequence.prompt_ids
        sequence.reused_tokens = min(common_prefix_len(row.cached_ids, ids), len(ids) - 1)
        row.cached_ids = ids[: sequence.reused_tokens]
        return sequence.reused_tokens

    def _begin(self, sequence: BatchedRequest, logits: torch.Tensor) -> None:
        """The prompt is in the cache: ``sequence`` runs, its first token chosen from ``logits``."""
        sequence.sampler = Sampler(sequence.options)
        sequence.context = list(sequence.prompt_ids)
        self.running.append(sequence)
        self._emit(sequence, self._choose(sequence, logits))

    def _start_prompt(self, sequence: BatchedRequest) -> None:
        """Chunked prefill: the prompt after its cached prefix waits for room in the steps."""
        if sequence.cancelled.is_set():
            self._finish(sequence, StopReason.CANCELLED)
            return
        sequence.prefilled = self._reuse_prefix(sequence)
        self.prefilling.append(sequence)

    def _mixed(self) -> None:
        """One step: every running sequence's next token and the next chunks of waiting prompts."""
        for sequence in [*self.running, *self.prefilling]:
            if sequence.cancelled.is_set():
                self._finish(sequence, StopReason.CANCELLED)
        if not self.prefilling:  # the step's own decode (the eager one attends only the slots in use)
            self._decode()
            return
        running, chunks = list(self.running), []
        remaining = [len(s.prompt_ids) - s.prefilled for s in self.prefilling]
        _, lengths = plan_chunks(remaining, self.step.chunk_shapes)
        for sequence, length in zip(self.prefilling, lengths, strict=False):
            tokens = sequence.prompt_ids[sequence.prefilled : sequence.prefilled + length]
            chunks.append((sequence, Chunk(sequence.row, tokens, sequence.prefilled)))
        rows = [s.row for s in running]
        positions = [len(self.rows[s.row].cached_ids) for s in running]
        start_ns = time.monotonic_ns()
        try:
            logits, last_logits = self.step.mixed(
                rows, [s.last_token for s in running], positions, [c for _, c in chunks]
            )
        except Exception as e:  # a failed forward ends these requests, not the server
            for sequence in [*running, *(s for s, _ in chunks)]:
                self._finish(sequence, None, f"step failed: {e}")
            return
        step_ns = time.monotonic_ns() - start_ns  # the logits' host copy below waits for the device
        if running:
            self._advance(running, logits, step_ns)
        for (sequence, chunk), row_logits in zip(chunks, last_logits, strict=True):
            self.rows[sequence.row].cached_ids.extend(chunk.tokens)
            sequence.prefilled += len(chunk.tokens)
            if sequence.prefilled == len(sequence.prompt_ids):  # its last chunk: the first token
                self.prefilling.remove(sequence)
                self._begin(sequence, row_logits)
        self.prefills += 1
        self.prefill_sizes.append(len(chunks))
        self.chunk_step_ns += time.monotonic_ns() - start_ns

    def _decode(self) -> None:
        running = [s for s in self.running if s.stop_reason is None]
        for sequence in running:
            if sequence.cancelled.is_set():
                self._finish(sequence, StopReason.CANCELLED)
        running = [s for s in self.running if s.stop_reason is None]
        if not running:
            return
        rows = [s.row for s in running]
        positions = [len(self.rows[s.row].cached_ids) for s in running]
        start_ns = time.monotonic_ns()
        try:
            logits = self.step.decode(rows, [s.last_token for s in running], positions)
        except Exception as e:
            for sequence in running:
                self._finish(sequence, None, f"decode step failed: {e}")
            return
        self._advance(running, logits, time.monotonic_ns() - start_ns)

    def _advance(self, running: list[BatchedRequest], logits: torch.Tensor, step_ns: int) -> None:
        """Count a decode step and emit each running sequence's next token from its ``logits`` row."""
        self.steps += 1
        self.decode_ns += step_ns
        self.decoded += len(running)
        self.batch_sizes.append(len(running))
        greedy = self._greedy_ids(running, logits)
        for i, sequence in enumerate(running):
            self.rows[sequence.row].cached_ids.append(sequence.last_token)
            token = greedy[i] if greedy is not None else self._choose(sequence, logits[i])
            self._emit(sequence, token)

    def _greedy_ids(self, running: list[BatchedRequest], logits: torch.Tensor) -> list[int] | None:
        """Every sequence greedy without a penalty: argmax on the device, only ids cross."""
        plain = all(s.options.temperature <= 0 and s.options.repetition_penalty == 1.0 for s in running)
        return [int(t) for t in logits.argmax(-1).tolist()] if plain else None

    def _choose(self, sequence: BatchedRequest, logits: torch.Tensor) -> int:
        assert sequence.sampler is not None
        return sequence.sampler(logits.float().cpu().numpy(), sequence.context)

    def _emit(self, sequence: BatchedRequest, token: int) -> None:
        sequence.generated_tokens += 1
        sequence.last_token = token
        self._put(sequence, (token, time.monotonic_ns()))
        if token in self.eos_token_ids:
            self._finish(sequence, StopReason.EOS)
            return
        sequence.context.append(token)
        if sequence.generated_tokens >= sequence.options.max_new_tokens:
            self._finish(sequence, StopReason.MAX_TOKENS)
        elif len(self.rows[sequence.row].cached_ids) >= self.capacity_tokens:
            self._finish(sequence, StopReason.CONTEXT_FULL)

    def _finish(self, sequence: BatchedRequest, reason: StopReason | None, error: str = "") -> None:
        sequence.stop_reason = reason or StopReason.CANCELLED
        sequence.error = error
        if sequence in self.running:
            self.running.remove(sequence)
        if sequence in self.prefilling:
            self.prefilling.remove(sequence)
        if sequence.row >= 0:
            row = self.rows[sequence.row]
            row.busy = False
            row.last_used_ns = time.monotonic_ns()
            if error:
                row.cached_ids = []  # unknown state: prefill everything next time
        self._put(sequence, None)

    def _put(self, sequence: BatchedRequest, item: tuple[int, int] | None) -> None:
        sequence.out.put(item)
        if self.outbox is not None:
            self.outbox.put(sequence)
