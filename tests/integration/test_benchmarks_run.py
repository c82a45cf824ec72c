"""The decoder benchmark in its tiny smoke mode, so it cannot rot unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_decoder_smoke_times_every_cpu_row_and_writes_json_and_markdown(tmp_path):
    out_json = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "bench.decoder", "--smoke", "--json", str(out_json)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "| backend | TTFT@32 p50 / p95 / p99 ms |" in out.stdout
    doc = json.loads(out_json.read_text())
    assert doc["random_weights"] and "RANDOM WEIGHTS" in doc["model"] and "--smoke" in doc["command"]
    rows = {r["key"]: r for r in doc["rows"]}
    assert set(rows) == {"transformers", "eager-fp32", "static-fp32"}
    for row in rows.values():
        assert "error" not in row
        assert all(row["ttft"][n]["median"] > 0 for n in ("32", "128", "512"))
        assert row["decode"]["median"] > 0 and row["turn"]["requests_per_s"] > 0
    # fp32 on the same random weights: our eager step and the graph step's math pick
    # the same greedy tokens as transformers.
    assert rows["eager-fp32"]["greedy_tokens"] == rows["transformers"]["greedy_tokens"]
    assert rows["static-fp32"]["greedy_tokens"] == rows["transformers"]["greedy_tokens"]
    assert doc["floor"]["copy_bandwidth_gbps"] > 0 and doc["floor"]["fp16_ms"] > 0
    assert out_json.with_suffix(".md").read_text().startswith("# Decoder benchmark")


def test_assistant_bench_runs_the_decoder_benchmark_by_default_and_by_name(tmp_path):
    out_json = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "assistant", "bench", "--smoke", "--backends", "eager-fp32"]
    out = subprocess.run(
        [*cmd, "--json", str(out_json)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert [r["key"] for r in json.loads(out_json.read_text())["rows"]] == ["eager-fp32"]
    bench = [sys.executable, "-m", "assistant", "bench"]
    named = subprocess.run([*bench, "list"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert named.returncode == 0 and "decoder" in named.stdout and "soak" in named.stdout
    helped = subprocess.run([*bench, "tts", "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert helped.returncode == 0 and "--piper-threads" in helped.stdout


def test_bench_ui_times_typed_turns_with_and_without_the_ui(tmp_path):
    """bench/ui.py on the real model, one turn per row: a table and its JSON."""
    out_json = tmp_path / "ui.json"
    cmd = [sys.executable, "-m", "bench.ui", "--turns", "1", "--max-new-tokens", "8"]
    cmd += ["--switch-intervals", "0.0002", "--size", "80x24", "--json", str(out_json)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "| pipeline only, no UI |" in out.stdout
    assert "| UI 80x24, GIL switch interval 0.2 ms |" in out.stdout
    doc = json.loads(out_json.read_text())
    # The default backend, auto: ONNX Runtime on this CPU machine.
    assert doc["backend"].startswith("onnxruntime-cpu") and "--turns 1" in doc["command"]
    assert len(doc["rows"]) == 2
    for row in doc["rows"].values():
        assert row["turns"] == 1 and row["ttft_ms_median"] > 0 and row["tokens_per_s_median"] > 0


def test_bench_serve_smoke_runs_both_servers_and_checks_the_replies(tmp_path):
    """bench/serve.py on a tiny random model: a real tritonserver, batched (chunked prefill) and one row."""
    import pytest

    pytest.importorskip("pytriton", reason="Triton comes with the serve extra (scripts/setup.sh --dev)")
    out_json = tmp_path / "serve.json"
    cmd = [
        sys.executable, "-m", "bench.serve", "--random-model", "tiny", "--device", "cpu",
        "--threads", "1", "--sessions", "1,4", "--turns", "2", "--prompt-tokens", "16", "--reply-tokens", "8",
        "--think-ms", "0", "--prefill-chunks", "1024", "--json", str(out_json),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "| server | sessions | requests/s | tokens/s | TTFT P50 / P95 / P99 ms |" in out.stdout
    doc = json.loads(out_json.read_text())
    batched = "batched, prefill chunk 1024"
    assert list(doc["results"]) == [batched, "sequential"]
    for mode in (batched, "sequential"):
        rows = doc["results"][mode]
        assert [r["sessions"] for r in rows] == [1, 4]
        assert all(r["requests"] == r["sessions"] * 2 and r["requests_per_s"] > 0 for r in rows)
        assert all(s["tokens"] == 8 for r in rows for s in r["samples"])  # the end token is off
        assert all(0 < r["server_ttft_p99_ms"] <= r["ttft_p99_ms"] for r in rows)
    check = doc["results"][batched][0]["check"]
    assert check["identical_replies"] == check["replies"] == 4  # fp32: the wire carries the right ids
