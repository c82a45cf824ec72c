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
from collections.abc import Sequence
from typing import Any

import torch

from engines.base import GenerationOptions, StopReason
from engines.sampling import Sampler
from engines.serving.batched_step import BatchedTorchStep
from engines.serving.prompt_steps import PromptSteps
from engines.serving.sequences import BatchedRequest, RequestError, Row, StepCounts, place_session

PREFILL_GROUP = 16  # newcomers prefilled in one forward (left-padded to the longest)


class BatchScheduler(PromptSteps):
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
        self.rows = [Row() for _ in range(step.rows)]
        self.waiting: list[BatchedRequest] = []
        self.running: list[BatchedRequest] = []
        self.prefilling: list[BatchedRequest] = []  # chunked prefill: prompts partly in the cache
        self.lock = threading.Condition()
        self.closed = False
        self.counts = StepCounts()
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
        return self.counts.summary(bool(self.step.chunk_shapes))

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

    def _begin(self, sequence: BatchedRequest, logits: torch.Tensor) -> None:
        """The prompt is in the cache: ``sequence`` runs, its first token chosen from ``logits``."""
        sequence.sampler = Sampler(sequence.options)
        sequence.context = list(sequence.prompt_ids)
        self.running.append(sequence)
        self._emit(sequence, self._choose(sequence, logits))

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
        self.counts.decode_step(len(running), step_ns)
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
