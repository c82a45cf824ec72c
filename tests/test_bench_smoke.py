"""The decoder benchmark script in its tiny smoke mode, so it cannot rot unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_decoder_smoke_prints_table_and_writes_json(tmp_path):
    out_json = tmp_path / "bench.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_decoder.py"), "--smoke", "--json", str(out_json)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "| metric | ours | transformers | ratio |" in out.stdout
    doc = json.loads(out_json.read_text())
    metrics = {row["metric"]: row["ours"] for row in doc["rows"]}
    ttft = next(v for k, v in metrics.items() if k.startswith("TTFT @128 tokens, median"))
    decode = next(v for k, v in metrics.items() if k.startswith("decode ms/token"))
    assert ttft > 0 and decode > 0
    assert "--smoke" in doc["command"]
