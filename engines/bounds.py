"""Allowed ranges of numeric options, kept next to each field as dataclass field metadata.

``field(default=0.5, metadata=bounds(min=0.0, max=1.0))`` is the one definition of a
range: the settings loader (``assistant.config``) checks every value it reads against it,
and an options class may check itself with :func:`check_bounds`. Pure: no I/O, no imports
beyond the standard library, so every layer can use it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any


def bounds(
    *, min: float | None = None, above: float | None = None, max: float | None = None
) -> dict[str, float]:
    """Field metadata for a range: ``min``/``max`` inclusive, ``above`` an exclusive lower bound."""
    limits = {"min": min, "above": above, "max": max}
    return {k: v for k, v in limits.items() if v is not None}


def _fmt(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def describe(metadata: Mapping[str, Any]) -> str | None:
    """The range in words (``0 to 2``, ``above 0 up to 1``, ``1 or more``); ``None``: unbounded."""
    lo, above, hi = metadata.get("min"), metadata.get("above"), metadata.get("max")
    if lo is not None:
        return f"{_fmt(lo)} to {_fmt(hi)}" if hi is not None else f"{_fmt(lo)} or more"
    if above is not None:
        return f"above {_fmt(above)} up to {_fmt(hi)}" if hi is not None else f"above {_fmt(above)}"
    return f"up to {_fmt(hi)}" if hi is not None else None


def out_of_bounds(value: float, metadata: Mapping[str, Any]) -> str | None:
    """What is wrong with ``value`` for a field with this metadata, or ``None`` when it is allowed.

    NaN and infinities are never allowed (a comparison with NaN is always false).
    """
    if isinstance(value, float) and not math.isfinite(value):
        return "is not a finite number"
    lo, above, hi = metadata.get("min"), metadata.get("above"), metadata.get("max")
    if (
        (lo is not None and value < lo)
        or (above is not None and value <= above)
        or (hi is not None and value > hi)
    ):
        return f"is out of range: allowed {describe(metadata)}"
    return None


def check_bounds(options: Any) -> None:
    """Raise ``ValueError`` naming the first field of the dataclass ``options`` outside its range."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            problem = out_of_bounds(value, f.metadata)
            if problem:
                raise ValueError(f"{type(options).__name__}.{f.name} = {value!r} {problem}")
