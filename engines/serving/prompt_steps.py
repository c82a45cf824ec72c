"""How newcomers' prompts enter the KV cache: between steps, or in chunks inside them."""

from __future__ import annotations

import time

import torch

from engines.base import StopReason
from engines.driver import common_prefix_len
from engines.serving.batched_step import BatchedTorchStep
from engines.serving.mixed_step import Chunk, plan_chunks
from engines.serving.sequences import BatchedRequest, Row, StepCounts


class PromptSteps:
    """:class:`~engines.serving.batching.BatchScheduler`'s prefill: its state, and the calls it makes back."""

    step: BatchedTorchStep
    rows: list[Row]
    running: list[BatchedRequest]
    prefilling: list[BatchedRequest]
    counts: StepCounts

    def _begin(self, sequence: BatchedRequest, logits: torch.Tensor) -> None:
        raise NotImplementedError

    def _finish(self, sequence: BatchedRequest, reason: StopReason | None, error: str = "") -> None:
        raise NotImplementedError

    def _decode(self) -> None:
        raise NotImplementedError

    def _advance(self, running: list[BatchedRequest], logits: torch.Tensor, step_ns: int) -> None:
        raise NotImplementedError

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
        self.counts.prompt_step(len(live))
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
        self.counts.prompt_step(len(chunks), time.monotonic_ns() - start_ns)
