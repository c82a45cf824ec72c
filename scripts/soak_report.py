"""The soak test's arithmetic (``scripts/soak.py``): growth per 100 turns, percentiles, verdict, table.

Pure: samples and turn records in, numbers and lines out (unit-tested in tests/test_soak.py).
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
    """A least-squares line through the samples after the warm-up: MB per 100 turns."""

    per_100_turns_mb: float
    samples: int  # how many samples the line was fitted to
    first_turn: int  # the first turn of the fitted window
    start_mb: float  # the fitted line at the window's first and last turn
    end_mb: float


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
    x = np.array([p[0] for p in points], dtype=np.float64)
    y = np.array([p[1] for p in points], dtype=np.float64)
    slope, intercept = np.polyfit(x, y, 1)
    return Growth(
        float(slope * 100),
        len(points),
        int(x[0]),
        float(intercept + slope * x[0]),
        float(intercept + slope * x[-1]),
    )


def warmup_turns(turns: int, share: float) -> int:
    """The first turn that counts for the growth (the first ``share`` of the turns do not)."""
    return math.ceil(turns * share)


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
    """Why the soak failed, one clear line each (empty: it passed)."""
    out = list(report.get("errors", []))
    for name, label in (("rss", "RSS"), ("gpu_memory", "GPU memory")):
        g = report["growth"].get(name)
        if g is not None and g["per_100_turns_mb"] > max_growth_mb:
            out.append(
                f"{label} grows {g['per_100_turns_mb']:+.1f} MB per 100 turns after turn {g['first_turn']} "
                f"(limit {max_growth_mb:g}, --max-growth-mb): a leak, or a cache that keeps growing"
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
        return (
            f"{g['per_100_turns_mb']:+.1f} MB / 100 turns (limit {max_growth_mb:g}; fit over turns "
            f"{g['first_turn']}-{c['asked']}, {g['samples']} samples: "
            f"{g['start_mb']:.0f} -> {g['end_mb']:.0f} MB)"
        )

    rss = [s["rss_bytes"] / MB for s in report["samples"]]
    rows = [
        ("turns asked (spoken / typed)", f"{c['asked']} ({c['spoken']} / {c['typed']})"),
        ("turn records / /metrics turn counter", f"{c['records']} / {c['metrics_turns']}"),
        ("spoken turns not understood (no words)", str(c["no_words"])),
        ("replies cut", str(sum(c["cut"].values()))),
        (
            "RSS at start / after warm-up / end",
            f"{rss[0]:.0f} / {report['rss_after_warmup_mb']:.0f} / {rss[-1]:.0f} MB",
        ),
        ("**RSS growth after warm-up**", f"**{fmt_growth('rss')}**"),
        ("**GPU memory growth after warm-up**", f"**{fmt_growth('gpu_memory')}**"),
    ]
    for key in LATENCIES:
        q = report["latency"].get(key)
        value = (
            f"{q['p50']:.0f} / {q['p95']:.0f} / {q['p99']:.0f} (max {q['max']:.0f}, n {q['n']})"
            if q
            else "n/a"
        )
        rows.append((f"{key} P50 / P95 / P99", value))
    for key, label in (("ttft_ms", "TTFT"), ("voice_to_voice_ms", "voice-to-voice")):
        drift = report["drift"].get(key)
        if drift:
            rows.append((f"{label} median, first / last quarter", f"{drift[0]:.0f} / {drift[1]:.0f} ms"))
    rows.append(
        (
            "duration",
            f"{report['duration_s'] / 60:.1f} min ({c['asked'] / report['duration_s'] * 60:.1f} turns/min)",
        )
    )
    return "\n".join(["| measure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def drift(records: Sequence[dict], key: str) -> tuple[float, float] | None:
    """The median of ``key`` in the first and in the last quarter of the turns that have it."""
    values = [r["metrics"][key] for r in records if r["metrics"].get(key) is not None]
    quarter = len(values) // 4
    if quarter < 2:
        return None
    return float(np.median(values[:quarter])), float(np.median(values[-quarter:]))
