"""Session statistics and the latency report: pure functions over turn records."""

from __future__ import annotations

import json

import numpy as np
import pytest

from assistant.observe.latency import STAGES, TurnRecord, percentiles
from assistant.observe.report import export_report


def records(v2v_ms: list[float]) -> list[TurnRecord]:
    """Typed-turn-like records: TTFT on every turn, voice-to-voice as given, no endpointing."""
    return [
        TurnRecord(i, metrics={"ttft_ms": 80.0 + i % 7, "voice_to_voice_ms": v, "endpointing_ms": None})
        for i, v in enumerate(v2v_ms, 1)
    ]


def test_percentiles_have_p999_between_p99_and_max_with_the_sample_count():
    """2,000 turns, one in 200 slow: P99.9 sees the slow tail that P99 misses."""
    v2v = [900.0] * 1990 + [3000.0] * 9 + [5000.0]
    stats = percentiles(records(v2v))
    s = stats["voice_to_voice_ms"]
    assert s["n"] == 2000
    assert s["p99"] == 900.0 and s["max"] == 5000.0
    assert s["p999"] == pytest.approx(np.percentile(v2v, 99.9)) == 3000.0
    assert "endpointing_ms" not in stats  # no turn had it


def test_export_json_carries_p999_per_metric(tmp_path):
    """``e`` in the UI: the JSON report's percentiles have p999 next to p99, for every metric shown."""
    recs = records([1000.0 + i for i in range(10)])
    csv_path, json_path = export_report(recs, tmp_path, "latency-test")
    report = json.loads(json_path.read_text())
    assert report["turns"] == 10
    v2v = report["percentiles"]["voice_to_voice_ms"]
    assert v2v["p999"] == pytest.approx(np.percentile([1000.0 + i for i in range(10)], 99.9))
    assert v2v["n"] == 10
    for key in ("ttft_ms", "voice_to_voice_ms"):
        assert set(report["percentiles"][key]) == {"p50", "p95", "p99", "p999", "max", "n"}
    assert set(report["percentiles"]) <= {*STAGES, "speculated_ms", "tokens_per_s"}
    assert len(csv_path.read_text().splitlines()) == 11
