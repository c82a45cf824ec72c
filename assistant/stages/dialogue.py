"""Conversation state, the chat template, the context budget and prefix reuse across turns."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from assistant.stages.tokenizer import render_chat
from engines.base import Decoder, GenerationOptions, GenerationStats, TokenChunk
from models.files import CorruptModel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Turn:
    """One exchange: what the user said and what the assistant replied."""

    user: str
    assistant: str


@dataclass(frozen=True)
class PromptPlan:
    """The prompt for the next reply and what had to go to make it fit.

    ``dropped_turns`` oldest turns were left out; ``user_tokens_cut`` tokens were removed
    from the start of an over-long user message.
    """

    ids: list[int]
    dropped_turns: int = 0
    user_tokens_cut: int = 0
    user_text: str = ""

    def notices(self) -> list[str]:
        """Human-readable lines saying what was trimmed (empty when nothing was)."""
        out = []
        if self.dropped_turns:
            out.append(f"context full: left out the {self.dropped_turns} oldest turn(s) of the conversation")
        if self.user_tokens_cut:
            out.append(
                f"message too long for the context: kept its last part, "
                f"cut {self.user_tokens_cut} tokens from its start"
            )
        return out


@dataclass
class Reply:
    """A reply being generated. Lazy: iterate it to run; the turn is recorded at the end.

    A ``held`` reply (speculative: the user may not be done) enters the conversation only
    once :meth:`confirm` is called, before or after it finished; :meth:`discard` drops it.
    """

    user_text: str
    plan: PromptPlan
    _chunks: Iterator[TokenChunk]
    stats: GenerationStats
    _on_done: Any = field(repr=False)
    done: bool = False
    held: bool = False
    discarded: bool = False

    def __iter__(self) -> Iterator[TokenChunk]:
        """Stream the reply's tokens; interrupting it still records the partial reply."""
        if self.done:
            return
        try:
            yield from self._chunks
        finally:
            self.done = True
            if not (self.held or self.discarded):
                self._on_done(self)

    def confirm(self) -> None:
        """The turn is the user's: record the reply (now if it is finished, else at its end)."""
        if self.held and not self.discarded:
            self.held = False
            if self.done:
                self._on_done(self)

    def discard(self) -> None:
        """The user went on speaking: this reply never enters the conversation."""
        self.discarded = True


REFILL_SHARE = 0.5  # a full context is cut down to this share of the prompt budget


class Dialogue:
    """A conversation with the decoder, kept within its context.

    The prompt is re-rendered each turn with the tokenizer's chat template; the decoder
    reuses the KV cache of the longest common prefix, so only new tokens are prefilled.
    """

    def __init__(
        self,
        decoder: Decoder,
        tokenizer: Any,
        system_prompt: str,
        options: GenerationOptions,
    ) -> None:
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.options = options
        self.turns: list[Turn] = []  # the turns still in context
        self.transcript: list[Turn] = []  # every turn of the session, trimmed or not

    def _render(self, turns: list[Turn], user: str) -> list[int]:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for turn in turns:
            messages += [
                {"role": "user", "content": turn.user},
                {"role": "assistant", "content": turn.assistant},
            ]
        messages.append({"role": "user", "content": user})
        text = render_chat(self.tokenizer, messages)  # ChatTemplateError names the template's file
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @property
    def prompt_budget_tokens(self) -> int:
        """Tokens a prompt may use: the KV cache minus room for a full reply."""
        return max(self.decoder.capacity_tokens - self.options.max_new_tokens, 1)

    def plan(self, user_text: str) -> PromptPlan:
        """Render the prompt for ``user_text``, dropping oldest turns (never the system prompt).

        When the conversation no longer fits, oldest turns are dropped until the prompt takes
        at most half the budget (:data:`REFILL_SHARE`), not just until it fits: dropping one
        turn per turn would change the prompt right after the system prompt every turn, and the
        KV cache could then reuse only the system prompt (a 200-turn session went from 120 ms
        to 4.7 s TTFT). After one large drop the following turns append to a stable prefix
        again. The newest exchange is kept whenever it fits on its own.
        """
        budget = self.prompt_budget_tokens
        ids = self._render(self.turns, user_text)
        if len(ids) <= budget:
            return PromptPlan(ids, 0, 0, user_text)
        fits: PromptPlan | None = None
        for dropped in range(1, len(self.turns) + 1):
            ids = self._render(self.turns[dropped:], user_text)
            if len(ids) > budget:
                continue
            fits = PromptPlan(ids, dropped, 0, user_text)
            if len(ids) <= budget * REFILL_SHARE or dropped == len(self.turns) - 1:
                return fits  # down to the share, or only the newest exchange is left
        if fits is not None:
            return fits
        # Even alone the message is too long: keep its end, which is usually the question.
        user_ids = self.tokenizer.encode(user_text, add_special_tokens=False)
        overhead = len(self._render([], ""))
        keep = max(budget - overhead - 1, 1)
        cut = max(len(user_ids) - keep, 0)
        while True:
            text = self.tokenizer.decode(user_ids[cut:], skip_special_tokens=True)
            ids = self._render([], text)
            if len(ids) <= budget or cut >= len(user_ids) - 1:
                return PromptPlan(ids, len(self.turns), cut, text)
            cut += max(len(ids) - budget, 1)

    def warm_up(self) -> float:
        """Run the decoder once (prefill and a decode step) so the first turn is not cold.

        The system prompt stays in the KV cache, so the first real turn reuses it. Returns ms.

        Raises:
            CorruptModel: The logits hold NaN or Inf (damaged weights or engine).
        """
        start = time.monotonic_ns()
        ids = self._render([], "Hello")
        logits = self.decoder.prefill(ids)
        after = self.decoder.decode(int(logits.argmax()))
        if not (np.isfinite(logits).all() and np.isfinite(after).all()):
            # Else every reply would be max_new_tokens of token 0: empty text, no error.
            raise CorruptModel(
                f"the LLM ({self.decoder.name}) gives NaN/Inf logits: its weights or engine are "
                "damaged; run 'assistant models fetch --force' (a bundled model) and "
                "'assistant engine clear' (an engine)"
            )
        return (time.monotonic_ns() - start) / 1e6

    def ask(self, user_text: str, cancel: threading.Event | None = None, held: bool = False) -> Reply:
        """Start the reply to ``user_text``; lazy: iterate the result to generate.

        ``held``: speculative; it joins the conversation only when confirmed (see :class:`Reply`).
        """
        plan = self.plan(user_text)
        for line in plan.notices():
            logger.info("%s", line)
        generation = self.decoder.generate(plan.ids, self.options, cancel)
        return Reply(user_text, plan, iter(generation), generation.stats, self._record, held=held)

    def revise_last_reply(self, heard_text: str) -> None:
        """Replace the last reply with the part the user actually heard (after a barge-in)."""
        if self.turns:
            self.turns[-1] = Turn(self.turns[-1].user, heard_text)
            self.transcript[-1] = Turn(self.transcript[-1].user, heard_text)

    def forget_last_exchange(self) -> None:
        """Drop the last exchange: its question goes on in the next one (a continuation)."""
        if self.turns:
            self.turns.pop()
        if self.transcript:
            self.transcript.pop()

    def _record(self, reply: Reply) -> None:
        kept = self.turns[reply.plan.dropped_turns :]
        answer = reply.stats.text.strip()
        self.turns = [*kept, Turn(reply.plan.user_text, answer)]
        # The session transcript keeps what the user really said, even if the prompt cut it.
        self.transcript.append(Turn(reply.user_text, answer))
