"""The soak test (``scripts/soak.py``): a short real run, and its growth verdict on made-up series.

The short run is the CI version of the 200-turn soak in docs/benchmarks.md: the real app on
the virtual sound devices, mostly typed turns and a few spoken ones, sampled every 4 turns.
It is too short to judge growth (the context fills all the way through, which is growth by
design), so its limit is lifted; the verdict itself is tested on series below.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import soak_report  # noqa: E402
from soak import schedule  # noqa: E402

TURNS, EVERY = 20, 4


@pytest.mark.slow
def test_a_short_soak_answers_every_turn_and_the_metrics_count_them(pulse, tmp_path):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "soak.py"), "--turns", str(TURNS), "--typed-ratio", "0.8"]
    cmd += ["--sample-every", str(EVERY), "--max-growth-mb", "100000", "--turn-timeout-s", "60"]
    cmd += ["--work", str(tmp_path / "work"), "--json", str(out), "--", "--max-new-tokens", "8"]
    cmd += ["--tts-rate", "350"]  # short replies, spoken quickly: a turn waits for its playback
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())

    counts = report["counts"]
    assert (counts["asked"], counts["spoken"], counts["typed"]) == (TURNS, 4, 16)
    assert counts["records"] == TURNS and counts["metrics_turns"] == TURNS  # one record per question
    assert not counts["cut"] and not report["errors"] and report["passed"]
    turns = report["turns"]
    assert all(t["ttft_ms"] is not None and not t["cancelled"] for t in turns), turns
    spoken = [t for t in turns if t["spoken"]]
    assert len(spoken) == 4 and all(t["voice_to_voice_ms"] for t in spoken), spoken
    assert all(t["transcript"] for t in spoken), spoken  # heard words, whatever tiny.en made of them
    assert report["latency"]["voice_to_voice_ms"]["n"] == 4
    assert report["latency"]["ttft_ms"]["n"] == TURNS

    samples = report["samples"]
    assert [s["turn"] for s in samples] == list(range(0, TURNS + 1, EVERY))
    for s in samples:  # the counter equals the log at every sample, and RSS is read both ways
        assert s["metrics_turns"] == s["log_records"] == s["turn"], s
        assert s["rss_bytes"] > 100e6 and s["metrics_rss_bytes"] == pytest.approx(s["rss_bytes"], rel=0.1)
    assert samples[-1]["kv_cache_tokens"] > samples[1]["kv_cache_tokens"]  # the conversation grew
    assert report["growth"]["rss"]["samples"] == 4  # turns 8-20: after the first quarter
    assert "| **RSS growth after warm-up** |" in done.stdout and "soak passed: 20 turns" in done.stderr


MB = 1e6
TURN_AXIS = list(range(0, 201, 10))


def a_report(rss_mb: list[float]) -> dict:
    """What soak.py reports, for ``failures``: samples every 10 turns, growth fitted after turn 50."""
    samples = [
        {"turn": t, "rss_bytes": v * MB, "gpu_used_bytes": None, "metrics_turns": t, "log_records": t}
        for t, v in zip(TURN_AXIS, rss_mb, strict=True)
    ]
    warm = soak_report.warmup_turns(200, 0.25)
    growth = {
        "rss": soak_report.growth(TURN_AXIS, [s["rss_bytes"] for s in samples], warm),
        "gpu_memory": soak_report.growth(TURN_AXIS, [None] * len(samples), warm),
    }
    growth = {k: vars(g) if g else None for k, g in growth.items()}
    return {"samples": samples, "growth": growth, "counts": {"cut": {}}, "errors": []}


def test_memory_that_keeps_growing_fails_the_soak():
    rss = [1000 + 0.3 * t for t in TURN_AXIS]  # 0.3 MB a turn: 30 MB per 100 turns
    report = a_report(rss)
    assert report["growth"]["rss"]["per_100_turns_mb"] == pytest.approx(30)
    (problem,) = soak_report.failures(report, max_growth_mb=20)
    assert problem.startswith("RSS grows +30.0 MB per 100 turns after turn 50 (limit 20")


def test_a_start_up_jump_then_flat_memory_passes():
    # Start-up allocation, then the context filling (+180 MB) up to turn 40, then flat with
    # allocator noise of +-1.5 MB: a fit over every sample would call that +60 MB per 100 turns.
    rss = [1000, 1060, 1120, 1150, 1180] + [1180 + (1.5 if i % 2 else -1.5) for i in range(16)]
    report = a_report(rss)
    assert abs(report["growth"]["rss"]["per_100_turns_mb"]) < 2
    assert soak_report.failures(report, max_growth_mb=20) == []
    assert soak_report.growth(TURN_AXIS, [v * MB for v in rss], 0).per_100_turns_mb > 20


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
