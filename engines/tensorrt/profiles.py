"""Derive optimization-profile bounds from recorded turns (``assistant run --log`` JSON lines).

The source article's advice: take the maximum from the P95/P99 of real prompt lengths rather
than reserving for the worst case. Per turn, the prefill length is what the decoder actually
ran (``prompt_tokens - reused_tokens``: prefix reuse keeps the rest in the KV cache) and the
context is ``prompt_tokens + tokens`` (the cache at the end of the reply). Prompts longer
than the derived maximum still work: the runtime prefills them in chunks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from engines.tensorrt.options import EngineOptions

MIN_TURNS = 20  # below this, P99 is mostly the single longest turn


class TrafficLogError(ValueError):
    """A turns log that cannot be read or holds no usable turn."""


@dataclass(frozen=True)
class TrafficStats:
    """Percentiles of one quantity over the recorded turns (tokens)."""

    p50: float
    p95: float
    p99: float
    max: float


@dataclass(frozen=True)
class DerivedProfile:
    """Profile bounds derived from a log, with the statistics they came from."""

    options: EngineOptions
    turns: int
    skipped: int
    prefill: TrafficStats
    context: TrafficStats
    percentile: float
    warning: str | None = None

    def toml(self) -> str:
        """The ``[engine]`` lines to paste into the settings file."""
        o = self.options
        keys = (
            "prefill_min_tokens",
            "prefill_opt_tokens",
            "prefill_max_tokens",
            "context_opt_tokens",
            "context_max_tokens",
        )
        body = "\n".join(f"{k} = {getattr(o, k)}" for k in keys)
        return f"[engine]\n{body}\n"


def read_turns(path: Path) -> tuple[list[tuple[int, int]], int]:
    """``(prefilled_tokens, context_tokens)`` per turn of a JSONL log, and the turns skipped.

    Turns without a prompt (cancelled before the LLM ran) are skipped.

    Raises:
        TrafficLogError: Unreadable file, a line that is not a turn record, or no usable turn.
    """
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise TrafficLogError(f"cannot read the turns log {path}: {e}") from e
    turns, skipped = [], 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            prompt, reused, generated = (int(record[k]) for k in ("prompt_tokens", "reused_tokens", "tokens"))
        except (ValueError, KeyError, TypeError) as e:
            raise TrafficLogError(f"{path}:{number}: not a turn record of 'assistant run --log' ({e})") from e
        if prompt <= 0:
            skipped += 1
            continue
        turns.append((max(prompt - reused, 1), prompt + generated))
    if not turns:
        raise TrafficLogError(f"{path} holds no turn with a prompt; record some with 'assistant run --log'")
    return turns, skipped


def _stats(values: Iterable[int]) -> TrafficStats:
    arr = np.asarray(list(values), dtype=np.float64)
    p50, p95, p99 = (float(np.percentile(arr, q)) for q in (50, 95, 99))
    return TrafficStats(p50, p95, p99, float(arr.max()))


def _round_up(value: float, multiple: int) -> int:
    return max(multiple, int(math.ceil(value / multiple)) * multiple)


def derive_profile(
    turns: list[tuple[int, int]],
    base: EngineOptions,
    *,
    percentile: float = 99.0,
    model_max_tokens: int | None = None,
    skipped: int = 0,
) -> DerivedProfile:
    """Profile bounds for ``turns``: opt at the median, max at ``percentile`` (95 or 99 advised).

    Maxima are rounded up (prefill to 32 tokens, context to 64) and capped by
    ``model_max_tokens``; other options are kept from ``base``.
    """
    if not 50.0 <= percentile <= 100.0:
        raise TrafficLogError(f"percentile {percentile} must be between 50 and 100")
    prefill = _stats(t[0] for t in turns)
    context = _stats(t[1] for t in turns)
    cap = model_max_tokens or base.context_max_tokens
    prefill_q = float(np.percentile([t[0] for t in turns], percentile))
    context_q = float(np.percentile([t[1] for t in turns], percentile))
    context_max = min(_round_up(context_q, 64), cap)
    prefill_max = min(_round_up(prefill_q, 32), context_max)
    prefill_opt = min(_round_up(prefill.p50, 8), prefill_max)
    context_opt = min(_round_up(context.p50, 8), context_max - 1)
    options = replace(
        base,
        prefill_min_tokens=1,
        prefill_opt_tokens=prefill_opt,
        prefill_max_tokens=prefill_max,
        context_opt_tokens=context_opt,
        context_max_tokens=context_max,
    )
    options.validate()
    warning = None
    if len(turns) < MIN_TURNS:
        warning = f"only {len(turns)} turns recorded (< {MIN_TURNS}): the P{percentile:g} bounds are rough"
    return DerivedProfile(options, len(turns), skipped, prefill, context, percentile, warning)


def profile_from_log(
    path: Path, base: EngineOptions, *, percentile: float = 99.0, model_max_tokens: int | None = None
) -> DerivedProfile:
    """:func:`derive_profile` over the turns of a JSONL log (see :func:`read_turns`)."""
    turns, skipped = read_turns(path)
    return derive_profile(
        turns, base, percentile=percentile, model_max_tokens=model_max_tokens, skipped=skipped
    )
