"""The soak test's growth verdict (``bench/soak_report.py``) on made-up series, and its turn schedule."""

from __future__ import annotations

import pytest

from bench import soak_report
from bench.soak import schedule

TURNS, EVERY = 20, 2


MB = 1e6


TURN_AXIS = list(range(0, 201, 10))  # a sample every 10 turns of a 200-turn soak


def a_report(rss_mb: list[float], kv_tokens: list[int] | None = None) -> dict:
    """What soak.py reports, as far as ``failures`` reads it; growth fitted as soak.py fits it."""
    kv_tokens = kv_tokens or [100 * (i + 1) for i in range(len(TURN_AXIS))]  # never trimmed
    samples = [
        {"turn": t, "rss_bytes": v * MB, "gpu_used_bytes": None, "kv_cache_tokens": kv}
        | {"metrics_turns": t, "log_records": t}
        for t, v, kv in zip(TURN_AXIS, rss_mb, kv_tokens, strict=True)
    ]
    start, trim = soak_report.fit_start(samples, 200, 0.25)
    growth = {
        "rss": soak_report.growth(TURN_AXIS, [s["rss_bytes"] for s in samples], start),
        "gpu_memory": soak_report.growth(TURN_AXIS, [None] * len(samples), start),
    }
    return {
        "samples": samples,
        "growth": {k: vars(g) if g else None for k, g in growth.items()},
        "first_trim_turn": trim,
        "counts": {"cut": {}},
        "errors": [],
    }


# The context fills up to turn 75 (KV cache 300 -> 1900 tokens, RSS +3 MB a turn), is trimmed
# to half there (RSS jumps: the re-prefill's peak), then refills and is trimmed every 40 turns.
KV_TOKENS = [300 + 230 * i for i in range(8)] + [1100 + 200 * (i % 4) for i in range(13)]


FILLING_MB = [1350 + 30 * i for i in range(8)]  # turns 0-70


def test_memory_that_keeps_growing_after_the_first_trim_fails_the_soak():
    rss = FILLING_MB + [1700 + 0.3 * (t - 80) for t in TURN_AXIS[8:]]  # then 0.3 MB a turn
    report = a_report(rss, KV_TOKENS)
    assert report["first_trim_turn"] == 80 and report["growth"]["rss"]["first_turn"] == 80
    assert report["growth"]["rss"]["per_100_turns_mb"] == pytest.approx(30)
    (problem,) = soak_report.failures(report, max_growth_mb=20)
    assert problem == (
        "RSS grows +30.0 MB per 100 turns after turn 80, +30.0 over the last half (from turn 140) "
        "(limit 20, --max-growth-mb): a leak, or a cache that keeps growing"
    )


def test_start_up_and_the_context_filling_then_flat_memory_passes():
    # Allocator noise of +-1.5 MB after the trim; a fit from the warm-up share alone (turn 50)
    # would count the filling and the trim's jump, a fit over every sample even more.
    rss = FILLING_MB + [1700 + (1.5 if i % 2 else -1.5) for i in range(13)]
    report = a_report(rss, KV_TOKENS)
    assert abs(report["growth"]["rss"]["per_100_turns_mb"]) < 2
    assert soak_report.failures(report, max_growth_mb=20) == []
    rss_bytes = [v * MB for v in rss]
    assert soak_report.growth(TURN_AXIS, rss_bytes, 50).per_100_turns_mb > 50  # the real run: +88.8
    assert soak_report.growth(TURN_AXIS, rss_bytes, 0).per_100_turns_mb > 100


def test_one_step_then_flat_passes_but_steps_that_go_on_fail():
    """An allocator reaching a new high-water mark once (+42 MB at the second trim, turn 113 of
    the second 200-turn run in docs/benchmarks.md) is no leak; the same step at every trim is."""
    once = FILLING_MB + [1708] * 4 + [1750] * 9  # turns 80-110, then 120-200
    report = a_report(once, KV_TOKENS)
    g = report["growth"]["rss"]
    assert g["per_100_turns_mb"] > 20 and abs(g["last_half_per_100_turns_mb"]) < 1
    assert soak_report.failures(report, max_growth_mb=20) == []
    every_trim = FILLING_MB + [1708 + 42 * (i // 4) for i in range(13)]  # +42 MB every 40 turns
    (problem,) = soak_report.failures(a_report(every_trim, KV_TOKENS), max_growth_mb=20)
    assert problem.startswith("RSS grows +") and "over the last half (from turn 140)" in problem


def test_growth_while_the_context_never_filled_says_so():
    report = a_report([1350 + 0.5 * t for t in TURN_AXIS])
    (problem,) = soak_report.failures(report, max_growth_mb=20)
    assert "after turn 50" in problem and "the context never filled during the run" in problem


def test_counts_that_disagree_and_cut_replies_fail_too():
    report = a_report([1000.0] * len(TURN_AXIS))
    report["samples"][3]["metrics_turns"] = 29
    report["counts"]["cut"] = {"speaker lost": 1}
    problems = soak_report.failures(report, max_growth_mb=20)
    assert problems == [
        "after turn 30: /metrics counts 29 turns, the --log has 30 records",
        "1 replies were cut ({'speaker lost': 1}): the user did not hear them whole",
    ]


def test_too_few_samples_after_the_warm_up_give_no_growth():
    assert soak_report.growth([0, 10, 20], [1e9, 1e9, 1e9], warmup_turns=10) is None


def test_typed_and_spoken_turns_are_spread_by_the_ratio():
    assert schedule(8, 0.75) == [False, False, False, True] * 2
    assert schedule(10, 0.8) == [False, False, False, False, True] * 2
    assert schedule(5, 1.0) == [False] * 5 and schedule(3, 0.0) == [True] * 3
