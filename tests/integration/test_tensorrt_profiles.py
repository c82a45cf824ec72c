"""Optimization profiles from recorded turns, and backend auto-selection (pure logic + CLI)."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest

from assistant.config import load_settings
from assistant.observe.latency import TurnRecord
from engines.selection import Choice, Probe, choose_backend
from engines.tensorrt.cuda_mem import GpuInfo
from engines.tensorrt.options import EngineOptions
from engines.tensorrt.profiles import TrafficLogError, profile_from_log
from tests.helpers.cli import run_cli


def write_log(path, turns, cancelled=0):
    """Turns as ``assistant run --log`` writes them: (prompt_tokens, reused_tokens, tokens)."""
    records = [TurnRecord(i, prompt_tokens=p, reused_tokens=r, tokens=t) for i, (p, r, t) in enumerate(turns)]
    records += [TurnRecord(100 + i, cancelled="barge_in") for i in range(cancelled)]
    path.write_text("".join(r.to_json() + "\n" for r in records))
    return path


def traffic(n=200, seed=0):
    """A conversation-like log: growing prompts, most of each reused from the previous turn."""
    rng = np.random.default_rng(seed)
    turns = []
    for _ in range(n):
        new = int(rng.integers(20, 90))
        if rng.random() < 0.03:
            new = int(rng.integers(400, 900))  # the rare pasted paragraph
        reused = int(rng.integers(0, 600))
        turns.append((reused + new, reused, int(rng.integers(10, 60))))
    return turns


def test_profile_follows_p99_of_real_turns_not_the_worst_case(tmp_path):
    turns = traffic()
    log = write_log(tmp_path / "turns.jsonl", turns, cancelled=3)
    derived = profile_from_log(log, EngineOptions(), percentile=99)
    o = derived.options
    prefilled = np.array([p - r for p, r, _ in turns])
    context = np.array([p + t for p, _, t in turns])
    assert derived.turns == 200 and derived.skipped == 3 and derived.warning is None
    assert np.percentile(prefilled, 99) <= o.prefill_max_tokens < np.percentile(prefilled, 99) + 32
    assert o.prefill_max_tokens < prefilled.max()  # the rare paragraph is chunked, not reserved for
    assert o.prefill_max_tokens % 32 == 0 and o.context_max_tokens % 64 == 0
    assert np.percentile(context, 99) <= o.context_max_tokens < np.percentile(context, 99) + 64
    assert o.prefill_opt_tokens >= np.median(prefilled) and o.prefill_opt_tokens < np.median(prefilled) + 8
    assert o.prefill_min_tokens == 1 and o.context_opt_tokens < o.context_max_tokens
    p95 = profile_from_log(log, EngineOptions(), percentile=95).options
    assert p95.prefill_max_tokens <= o.prefill_max_tokens


def test_profile_is_capped_by_the_model_and_warns_on_few_turns(tmp_path):
    log = write_log(tmp_path / "few.jsonl", [(3000, 0, 100), (50, 0, 10)])
    derived = profile_from_log(log, EngineOptions(), model_max_tokens=2048)
    assert derived.options.context_max_tokens == 2048 and derived.options.prefill_max_tokens <= 2048
    assert derived.warning and "only 2 turns" in derived.warning


def test_bad_logs_name_the_line_or_the_fix(tmp_path):
    log = tmp_path / "bad.jsonl"
    log.write_text(TurnRecord(1, prompt_tokens=10).to_json() + "\nnot json\n")
    with pytest.raises(TrafficLogError, match="bad.jsonl:2"):
        profile_from_log(log, EngineOptions())
    with pytest.raises(TrafficLogError, match="no turn with a prompt"):
        profile_from_log(write_log(tmp_path / "empty.jsonl", [], cancelled=2), EngineOptions())
    with pytest.raises(TrafficLogError, match="cannot read"):
        profile_from_log(tmp_path / "missing.jsonl", EngineOptions())


def test_cli_profile_prints_settings_that_load_back(tmp_path):
    log = write_log(tmp_path / "turns.jsonl", traffic())
    out = run_cli("engine", "profile", "--from", str(log), "--percentile", "95")
    assert out.returncode == 0, out.stderr
    assert "200 turns" in out.stdout and "p95" in out.stdout
    toml = out.stdout[out.stdout.index("[engine]") :]
    expected = profile_from_log(log, EngineOptions(), percentile=95).options
    assert tomllib.loads(toml)["engine"]["prefill_max_tokens"] == expected.prefill_max_tokens
    config = tmp_path / "config.toml"
    config.write_text(toml)
    assert load_settings(config, env={}).engine == expected
    out = run_cli("engine", "profile", "--from", str(tmp_path / "nope.jsonl"))
    assert out.returncode == 2 and "cannot read" in out.stderr and "Traceback" not in out.stderr


RTX4090 = GpuInfo("NVIDIA GeForce RTX 4090", (8, 9), 24 << 30)
H200 = GpuInfo("NVIDIA H200", (9, 0), 141 << 30)


@pytest.mark.parametrize(
    ("found", "backend", "device", "why"),
    [
        (Probe("10.13", "1.7.1", RTX4090, True, True), "tensorrt", "cuda", "TensorRT 10.13 supports"),
        (Probe(None, "1.7.1", RTX4090, True, True), "tensorrt-rtx", "cuda", "TensorRT-RTX 1.7.1 supports"),
        (Probe("10.13", None, H200, True, True), "tensorrt", "cuda", "compute capability 9.0"),
        (Probe(None, "1.7.1", H200, True, True), "pytorch", "cuda", "does not support NVIDIA H200"),
        (Probe(None, None, RTX4090, True, True), "pytorch", "cuda", "no TensorRT installed"),
        (Probe(None, "1.7.1", None, False, True), "onnxruntime", "cpu", "no CUDA GPU"),
        (Probe(None, "1.7.1", None, False, False), "pytorch", "cpu", "no CUDA GPU"),
    ],
)
def test_backend_auto_selection_order(found, backend, device, why):
    choice = choose_backend(found)
    assert (choice.backend, choice.device) == (backend, device)
    assert why in choice.reason


def test_cli_auto_backend_says_which_and_why(store):
    out = run_cli("chat", "--backend", "auto", "--max-new-tokens", "4", stdin="Hi\n")
    assert out.returncode == 0, out.stderr
    expected: Choice = choose_backend(Probe(None, "1.7.1", None, False, True))  # this machine: no GPU
    assert f"backend auto: onnxruntime ({expected.reason})" in out.stderr
    assert "onnxruntime-cpu" in out.stdout
