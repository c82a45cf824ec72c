"""The soak test (``bench/soak.py``): a short real run of the app on the virtual sound devices.

The short run is the CI version of the 200-turn soak in docs/benchmarks.md: the real app on
the virtual sound devices, 16 typed turns and 4 spoken ones, sampled every 2 turns, with a
256-token context so that the conversation is trimmed within the run (the growth is fitted
after the first trim, as in a long soak). Six samples over ten turns are too few to judge
growth (one allocator step is +50 MB per 100 turns there), so its limit is lifted; the
verdict itself is tested on series in tests/unit/test_soak_verdict.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


TURNS, EVERY = 20, 2


@pytest.mark.slow
def test_a_short_soak_answers_every_turn_and_the_metrics_count_them(pulse, tmp_path):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "bench.soak", "--turns", str(TURNS), "--typed-ratio", "0.8"]
    cmd += ["--sample-every", str(EVERY), "--max-growth-mb", "100000", "--turn-timeout-s", "60"]
    cmd += ["--work", str(tmp_path / "work"), "--json", str(out), "--", "--max-new-tokens", "8"]
    # Short replies spoken quickly (a turn waits for its playback); a context small enough to
    # be trimmed within the run, so the growth is fitted after the trim as in a long soak.
    cmd += ["--tts-rate", "350", "--context-tokens", "256"]
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
    # The conversation filled the 256 tokens and was trimmed; the growth is fitted from then on.
    trim = report["first_trim_turn"]
    assert trim is not None and report["trims"] and trim - EVERY < report["trims"][0]["turn_id"] <= trim
    assert report["growth"]["rss"]["first_turn"] == report["fit_from_turn"] == max(trim, 5)
    assert "| **RSS growth after the warm-up** |" in done.stdout and "soak passed: 20 turns" in done.stderr
