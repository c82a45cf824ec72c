"""The generation loop shared by every backend: prefix reuse, sampling, streaming, stops.

Backends differ only in their :class:`~engines.base.StepModel`; everything a user can observe
about generation (which tokens, when they stream, why it stopped) is decided here once.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar

import numpy as np

from engines.base import (
    ContextOverflow,
    GenerationOptions,
    GenerationStats,
    StepModel,
    StopReason,
    TokenChunk,
    TokenStepModel,
)
from engines.sampling import Sampler

Out = TypeVar("Out")


class Detokenizer(Protocol):
    """The part of a tokenizer the driver needs."""

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str:
        """Turn ids into text."""
        ...


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


# C0 controls but tab and newline, DEL, and C1 controls (U+0080-U+009F, CSI among them). A token
# can decode to ESC or BEL (a rogue --llm-server sends ids of its choosing): sent on, a reply
# retitled and cleared the terminal. Stripped here, where all text leaves the decoder, so the
# chat, the headless reporter, the UI, TTS and the conversation history all get clean text.
CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def strip_controls(text: str) -> str:
    """``text`` without control characters, except newline and tab (see :data:`CONTROL_CHARS`)."""
    return CONTROL_CHARS.sub("", text)


class TextStream:
    """Incremental detokenization that never splits a character or leaks a stop string.

    What it releases holds no control characters but newline and tab (:func:`strip_controls`).
    """

    def __init__(self, tokenizer: Detokenizer, stop_strings: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""  # emitted so far
        self.pending = ""  # decoded but held back (could start a stop string)
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add a token; return the newly printable text ('' when nothing is safe to show)."""
        self.ids.append(token_id)
        # Decode a short window so a token is printed only once its characters are complete.
        window = self.tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        if window.endswith("\ufffd"):
            return ""
        before = self.tokenizer.decode(
            self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True
        )
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.pending += strip_controls(window[len(before) :])
        return self._release()

    def _release(self) -> str:
        candidate = self.text + self.pending
        hits = [candidate.find(s, 0) for s in self.stop_strings]
        hits = [h for h in hits if h >= 0]
        if hits:
            self.stopped = True
            out = candidate[: min(hits)][len(self.text) :]
            self.text += out
            self.pending = ""
            return out
        hold = 0
        for s in self.stop_strings:
            for k in range(min(len(s) - 1, len(candidate)), 0, -1):
                if candidate.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        hold = min(hold, len(self.pending))
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out) :]
        self.text += out
        return out

    def flush(self) -> str:
        """Release held-back text at the end of a generation that hit no stop string."""
        out, self.pending = self.pending, ""
        self.text += out
        return out


class DecoderDriver:
    """A :class:`~engines.base.Decoder` over any :class:`~engines.base.StepModel`.

    It remembers which token ids the KV cache holds, so a new prompt that starts with the
    previous conversation only prefills the tokens after the common prefix.

    ``rope_switch_tokens`` (longrope models, :attr:`DecoderConfig.rope_switch_tokens`): a
    sequence longer than it uses RoPE's long factors at every position, a shorter one the short
    factors (the step picks them by the call's last position). When the sequence crosses that
    length either way, the cached keys were rotated with the other factors, so the whole
    sequence runs again from position 0, as transformers' ``generate`` does.
    """

    def __init__(
        self,
        step: StepModel,
        tokenizer: Detokenizer,
        eos_token_ids: Sequence[int],
        cache_status: str = "",
        rope_switch_tokens: int | None = None,
    ) -> None:
        self.step = step
        self.rope_switch_tokens = rope_switch_tokens
        # What start-up reused or had to make (``engine cache hit``, ``ONNX exported in 14 s``).
        self.cache_status = cache_status
        # Why ``--backend auto`` runs this backend and not the TensorRT it picked ('' when it did not
        # fall back); turn records carry it.
        self.fallback = ""
        self.tokenizer = tokenizer
        # The tokenizer's own end token counts too (chat models often end turns with it).
        tokenizer_eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids = frozenset(eos_token_ids) | (
            frozenset() if tokenizer_eos is None else {tokenizer_eos}
        )
        self.name = step.name
        self.identity = step.identity
        self.capacity_tokens = step.capacity_tokens
        self.cached_ids: list[int] = []
        self.busy = False  # a generation is being iterated

    def reset(self) -> None:
        """Forget the cached prefix (the cache memory itself is reused)."""
        self.cached_ids = []

    def close(self) -> None:
        """Release the step's resources (idempotent).

        A TensorRT step frees its GPU memory and saves the TensorRT-RTX runtime cache (the
        kernels compiled while the app ran), so the next start does not compile them again.
        """
        self.step.close()

    def prefill(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """Make the cache hold ``prompt_ids``; return the last token's logits.

        Raises:
            ContextOverflow: The prompt does not fit in ``capacity_tokens``.
        """
        return self._prefill_with(self.step.forward, prompt_ids)

    def decode(self, token_id: int) -> np.ndarray:
        """Append one token at the end of the cache; return its logits."""
        return self._append_with(self.step.forward, token_id)

    def _prefill_with(self, run: Callable[[Sequence[int], int], Out], prompt_ids: Sequence[int]) -> Out:
        if not prompt_ids:
            raise ValueError("empty prompt")
        if len(prompt_ids) > self.capacity_tokens:
            raise ContextOverflow(
                f"prompt of {len(prompt_ids)} tokens exceeds the KV cache of "
                f"{self.capacity_tokens}; raise the context size or shorten the prompt"
            )
        # At least the last token runs, so its logits are fresh.
        reuse = min(common_prefix_len(self.cached_ids, prompt_ids), len(prompt_ids) - 1)
        if self._long_rope(len(self.cached_ids)) != self._long_rope(len(prompt_ids)):
            reuse = 0  # the cached keys carry the other RoPE factors
        self.cached_ids = list(prompt_ids[:reuse])
        out = run(prompt_ids[reuse:], reuse)
        self.cached_ids = list(prompt_ids)
        return out

    def _append_with(self, run: Callable[[Sequence[int], int], Out], token_id: int) -> Out:
        if len(self.cached_ids) >= self.capacity_tokens:
            raise ContextOverflow(f"KV cache full ({self.capacity_tokens} tokens)")
        length = len(self.cached_ids)
        if self._long_rope(length) != self._long_rope(length + 1):
            # Crossing longrope's switch: every cached key must get the long factors.
            out = run([*self.cached_ids, token_id], 0)
        else:
            out = run([token_id], length)
        self.cached_ids.append(token_id)
        return out

    def _long_rope(self, length_tokens: int) -> bool:
        switch = self.rope_switch_tokens
        return switch is not None and length_tokens > switch

    def choosers(
        self, options: GenerationOptions, context: list[int]
    ) -> tuple[Callable[[Sequence[int]], int], Callable[[int], int]]:
        """How one generation gets its tokens: ``(first(prompt_ids), next(last_token))``.

        On the device when the step can apply ``options`` there (only the id is read back),
        else from host logits through :class:`~engines.sampling.Sampler`, which reads
        ``context`` (the caller appends each token to it) for the repetition penalty.
        """
        step = self.step
        if isinstance(step, TokenStepModel) and step.begin_choosing(options):
            return (
                lambda ids: self._prefill_with(step.forward_token, ids),
                lambda token: self._append_with(step.forward_token, token),
            )
        sampler = Sampler(options)
        return (
            lambda ids: sampler(self.prefill(ids), context),
            lambda token: sampler(self.decode(token), context),
        )

    def generate(
        self,
        prompt_ids: Sequence[int],
        options: GenerationOptions,
        cancel: threading.Event | None = None,
    ) -> StreamingGeneration:
        """Return a lazy generation; iterating it runs prefill and decoding."""
        return StreamingGeneration(self, list(prompt_ids), options, cancel)


class StreamingGeneration:
    """Iterate to run; ``stats`` fills in as it goes and is final when iteration ends."""

    def __init__(
        self,
        driver: DecoderDriver,
        prompt_ids: list[int],
        options: GenerationOptions,
        cancel: threading.Event | None,
    ) -> None:
        self.driver = driver
        self.prompt_ids = prompt_ids
        self.options = options
        self.cancel = cancel or threading.Event()
        self.stats = GenerationStats(prompt_tokens=len(prompt_ids))

    def choosers(self, context: list[int]) -> tuple[Callable[[Sequence[int]], int], Callable[[int], int]]:
        """Where this generation's tokens come from (the driver's :meth:`DecoderDriver.choosers`)."""
        return self.driver.choosers(self.options, context)

    def __iter__(self) -> Iterator[TokenChunk]:
        """Run the generation, yielding a chunk per token."""
        d, opts, stats = self.driver, self.options, self.stats
        if d.busy:
            raise RuntimeError(f"{d.name}: a generation is still running; finish or close it first")
        d.busy = True
        try:
            stats.t_submit_ns = time.monotonic_ns()
            stats.reused_tokens = min(
                common_prefix_len(d.cached_ids, self.prompt_ids), len(self.prompt_ids) - 1
            )
            stats.prefilled_tokens = len(self.prompt_ids) - max(stats.reused_tokens, 0)
            text = TextStream(d.tokenizer, opts.stop_strings)
            context = list(self.prompt_ids)
            first, following = self.choosers(context)
            reason: StopReason | None = None
            try:
                token = -1
                for index in range(opts.max_new_tokens):
                    if self.cancel.is_set():
                        reason = StopReason.CANCELLED
                        break
                    token = first(self.prompt_ids) if index == 0 else following(token)
                    t_ns = time.monotonic_ns()
                    if index == 0:
                        stats.t_first_token_ns = t_ns
                    stats.generated_tokens += 1
                    if token in d.eos_token_ids:
                        reason = StopReason.EOS
                        break
                    context.append(token)
                    piece = text.push(token)
                    yield TokenChunk(index, token, piece, t_ns)
                    if text.stopped:
                        reason = StopReason.STOP_STRING
                        break
                    if index + 1 == opts.max_new_tokens:
                        reason = StopReason.MAX_TOKENS
                        break
                    if len(d.cached_ids) >= d.capacity_tokens:
                        reason = StopReason.CONTEXT_FULL
                        break
                if reason in (StopReason.EOS, StopReason.MAX_TOKENS, StopReason.CONTEXT_FULL):
                    rest = text.flush()
                    if rest:
                        yield TokenChunk(stats.generated_tokens, -1, rest, time.monotonic_ns())
            finally:
                # Also reached when the consumer stops iterating or Ctrl-C lands mid-step.
                stats.t_done_ns = time.monotonic_ns()
                stats.stop_reason = reason or StopReason.CANCELLED
                stats.text = text.text
        finally:
            d.busy = False
