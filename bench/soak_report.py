"""The soak test's arithmetic (``bench/soak.py``): growth per 100 turns, percentiles, verdict, table.

Pure: samples and turn records in, numbers and lines out (unit-tested in tests/unit/test_soak_verdict.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MB = 1e6
LATENCIES = ("voice_to_voice_ms", "ttft_ms")  # voice-to-voice: spoken turns only; TTFT: every turn
CUT_REASONS = ("speaker lost", "microphone lost", "interrupted")  # a reply the user did not get whole


@dataclass(frozen=True)
class Growth:
    """Least-squares lines through the samples after the warm-up, in MB per 100 turns.

    ``last_half_per_100_turns_mb`` is the line through the second half of those turns (None
    with fewer than 3 samples there): memory that leaks is still growing there, while a
    one-off step (an allocator reaching a new high-water mark) is behind it.
    """

    per_100_turns_mb: float
    samples: int  # how many samples the line was fitted to
    first_turn: int  # the first turn of the fitted window
    start_mb: float  # the fitted line at the window's first and last turn
    end_mb: float
    last_half_per_100_turns_mb: float | None = None
    last_half_from_turn: int | None = None


def _slope(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    slope, intercept = np.polyfit([p[0] for p in points], [p[1] for p in points], 1)
    return float(slope), float(intercept)


def growth(turns: Sequence[int], values_bytes: Sequence[float | None], warmup_turns: int) -> Growth | None:
    """The slope of ``values`` over ``turns`` from ``warmup_turns`` on, or None with < 3 samples.

    Samples before the warm-up (start-up allocation, the context filling for the first time)
    do not count; a missing value (``None``: no GPU, a failed read) is skipped.
    """
    points = [
        (t, v / MB) for t, v in zip(turns, values_bytes, strict=True) if t >= warmup_turns and v is not None
    ]
    if len(points) < 3:
        return None
    slope, intercept = _slope(points)
    first, last = points[0][0], points[-1][0]
    half = [p for p in points if p[0] >= (first + last) / 2]
    tail = _slope(half)[0] * 100 if len(half) >= 3 else None
    return Growth(
        slope * 100,
        len(points),
        int(first),
        intercept + slope * first,
        intercept + slope * last,
        tail,
        int(half[0][0]) if tail is not None else None,
    )


def warmup_turns(turns: int, share: float) -> int:
    """The first turn that counts for the growth (the first ``share`` of the turns do not)."""
    return math.ceil(turns * share)


def first_trim(samples: Sequence[dict]) -> int | None:
    """The first sample after the context was first trimmed (its KV cache holds fewer tokens).

    Until then the conversation fills the context, and memory grows with it by design (35-110
    KB a token on the CPU backend); the trim's re-prefill of half the context then sets the
    peak that later trims reuse. None when the context never filled during the run.
    """
    for before, after in zip(samples, samples[1:], strict=False):
        if (after.get("kv_cache_tokens") or 0) < (before.get("kv_cache_tokens") or 0):
            return int(after["turn"])
    return None


def fit_start(samples: Sequence[dict], turns: int, share: float) -> tuple[int, int | None]:
    """The first turn of the growth fit: after the warm-up share and the first trim; and the trim."""
    trim = first_trim(samples)
    return max(warmup_turns(turns, share), trim or 0), trim


def latency(records: Sequence[dict], key: str) -> dict[str, float] | None:
    """Median, P95, P99, max and count of one record metric over the turns that have it."""
    values = np.array([r["metrics"][key] for r in records if r["metrics"].get(key) is not None])
    if not values.size:
        return None
    return {
        "p50": float(np.median(values)),
        "p95": float(np.percentile(values, 95)),
        "p99": float(np.percentile(values, 99)),
        "max": float(values.max()),
        "n": int(values.size),
    }


def failures(report: dict, max_growth_mb: float) -> list[str]:
    """Why the soak failed, one clear line each (empty: it passed).

    A run that stopped early (``errors``: the app died, a turn timed out) fails for that
    alone: its other numbers are partial, and stopping it cut the reply in progress.
    """
    if report.get("errors"):
        return list(report["errors"])
    out: list[str] = []
    for name, label in (("rss", "RSS"), ("gpu_memory", "GPU memory")):
        g = report["growth"].get(name)
        if g is None or g["per_100_turns_mb"] <= max_growth_mb:
            continue
        tail = g["last_half_per_100_turns_mb"]
        if tail is not None and tail <= max_growth_mb:
            continue  # a step, then flat: a high-water mark, not a leak
        why = "a leak, or a cache that keeps growing"
        if report.get("first_trim_turn") is None:
            why = (
                "the context never filled during the run, so this includes the conversation "
                "filling it: run more turns or a smaller context (-- --context-tokens 512)"
            )
        still = (
            "" if tail is None else f", {tail:+.1f} over the last half (from turn {g['last_half_from_turn']})"
        )
        out.append(
            f"{label} grows {g['per_100_turns_mb']:+.1f} MB per 100 turns after turn "
            f"{g['first_turn']}{still} (limit {max_growth_mb:g}, --max-growth-mb): {why}"
        )
    if report["growth"].get("rss") is None:
        out.append("RSS: fewer than 3 samples after the warm-up; raise --turns or lower --sample-every")
    for sample in report["samples"]:
        if sample["metrics_turns"] != sample["log_records"]:
            out.append(
                f"after turn {sample['turn']}: /metrics counts {sample['metrics_turns']} turns, "
                f"the --log has {sample['log_records']} records"
            )
    cut = report["counts"]["cut"]
    if cut:
        out.append(f"{sum(cut.values())} replies were cut ({cut}): the user did not hear them whole")
    return out


def table(report: dict, max_growth_mb: float) -> str:
    """The soak's result as a markdown table."""
    c = report["counts"]

    def fmt_growth(name: str) -> str:
        g = report["growth"].get(name)
        if g is None:
            return "n/a (no GPU)" if name == "gpu_memory" else "n/a (too few samples)"
        trim = report.get("first_trim_turn")
        return (
            f"{g['per_100_turns_mb']:+.1f} MB / 100 turns (limit {max_growth_mb:g}; fit over turns "
            f"{g['first_turn']}-{c['asked']}, {g['samples']} samples: {g['start_mb']:.0f} -> "
            f"{g['end_mb']:.0f} MB; context first trimmed by turn {trim if trim is not None else '-'}); "
            + (
                f"last half (turns {g['last_half_from_turn']}-{c['asked']}): "
                f"{g['last_half_per_100_turns_mb']:+.1f}"
                if g["last_half_per_100_turns_mb"] is not None
                else "last half: too few samples"
            )
        )

    rss = [s["rss_bytes"] / MB for s in report["samples"]]
    minutes = report["duration_s"] / 60
    rows = [
        ("turns asked (spoken / typed)", f"{c['asked']} ({c['spoken']} / {c['typed']})"),
        ("turn records / /metrics turn counter", f"{c['records']} / {c['metrics_turns']}"),
        ("spoken turns not understood (no words)", str(c["no_words"])),
        ("replies cut / playback underruns (ALSA)", f"{sum(c['cut'].values())} / {c.get('underruns', 0)}"),
        (
            "RSS at start / at the growth fit's start / end",
            f"{rss[0]:.0f} / {report['rss_fit_start_mb']:.0f} / {rss[-1]:.0f} MB",
        ),
        ("**RSS growth after the warm-up**", f"**{fmt_growth('rss')}**"),
        ("**GPU memory growth after the warm-up**", f"**{fmt_growth('gpu_memory')}**"),
    ]
    for key in LATENCIES:
        q = report["latency"].get(key)
        value = (
            f"{q['p50']:.0f} / {q['p95']:.0f} / {q['p99']:.0f} (max {q['max']:.0f}, n {q['n']})"
            if q
            else "n/a"
        )
        rows.append((f"{key} P50 / P95 / P99", value))
    cut = report["trims"]
    ttfts = [t["ttft_ms"] for t in cut if t["ttft_ms"] is not None]
    rows.append(
        (
            "context trims (the prompt prefilled whole)",
            f"{len(cut)}"
            + (
                f": turns {', '.join(str(t['turn_id']) for t in cut)}; TTFT "
                f"{min(ttfts):.0f}-{max(ttfts):.0f} ms"
                if ttfts
                else ""
            ),
        )
    )
    for key, label in (("ttft_ms", "TTFT"), ("voice_to_voice_ms", "voice-to-voice")):
        drift = report["drift"].get(key)
        if drift:
            rows.append((f"{label} median, first / last quarter", f"{drift[0]:.0f} / {drift[1]:.0f} ms"))
    rows.append(
        (
            "duration",
            f"{minutes:.1f} min ({c['asked'] / max(minutes, 1e-9):.1f} turns/min)",
        )
    )
    return "\n".join(["| measure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def trims(records: Sequence[dict]) -> list[dict]:
    """The turns whose prompt was cut to fit the context (fewer prompt tokens than the turn before).

    Their prompt no longer starts like the cached one, so it is prefilled whole: their TTFT is
    the tail of the TTFT percentiles.
    """
    return [
        {"turn_id": r["turn_id"], "prompt_tokens": r["prompt_tokens"], "ttft_ms": r["metrics"].get("ttft_ms")}
        for before, r in zip(records, records[1:], strict=False)
        if r["prompt_tokens"] < before["prompt_tokens"]
    ]


def drift(records: Sequence[dict], key: str) -> tuple[float, float] | None:
    """The median of ``key`` in the first and in the last quarter of the turns that have it."""
    values = [r["metrics"][key] for r in records if r["metrics"].get(key) is not None]
    quarter = len(values) // 4
    if quarter < 2:
        return None
    return float(np.median(values[:quarter])), float(np.median(values[-quarter:]))
