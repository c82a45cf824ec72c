"""TensorRT-RTX engines built on the CPU (no GPU here): real builds, the engine cache, the CLI.

TensorRT-RTX builds ahead of time for a named compute capability, so CI builds a real SM89
engine of the SmolLM2 fp16 export. Cache damage and option handling use a tiny random-weight
model (exports in ~1 s, builds in ~2 s). Nothing here runs an engine: see
``tests/gpu/test_tensorrt_engines_run.py`` (``gpu_tensorrt``).
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import threading

import onnx
import pytest
import torch

from assistant.app import EngineSteps
from assistant.observe.metrics import Metrics
from engines.onnx_export import ExportedDecoder, ExportOptions, export_decoder
from engines.tensorrt import builder, cache, tuning
from engines.tensorrt.builder import build_engine
from engines.tensorrt.compiler import OnnxParseError
from engines.tensorrt.flavour import TensorRTUnavailable, UnsupportedPrecision, load_flavour
from engines.tensorrt.options import EngineOptions, EngineOptionsError
from tests.helpers.cli import run_cli
from tests.helpers.engines import TINY
from tests.helpers.families import qwen2

RTX = load_flavour("tensorrt-rtx")  # a dev dependency: CI has it, so no skip
SM89 = EngineOptions(targets="sm89")


class Events(list):
    def __call__(self, event):
        self.append(event)


def no_builder(*_args, **_kwargs):
    raise AssertionError("the TensorRT builder ran on a cache hit")


@pytest.fixture(scope="module")
def smollm2_engine(smollm2_export, onnx_model_dir):
    """The real SmolLM2 fp16 export built for SM89 into the tmp store's engine cache."""
    events = Events()
    exported = smollm2_export("fp16")
    built = build_engine(exported, SM89, onnx_model_dir.parent.parent / "engines", progress=events)
    print(f"\nSmolLM2 fp16 -> TensorRT-RTX {RTX.version} SM89: built in {built.build_s:.1f} s, "
          f"{built.size_bytes / 1e6:.0f} MB")  # fmt: skip
    return exported, built, events


def test_smollm2_fp16_builds_a_real_sm89_engine_with_progress(smollm2_engine):
    exported, built, events = smollm2_engine
    assert not built.cache_hit and built.build_s > 0
    assert 200e6 < built.size_bytes < 350e6  # fp16 weights (270 MB) once: one profile on RTX
    assert built.path.stat().st_size == built.size_bytes
    r = built.record
    assert (r["flavour"], r["version"], r["targets"], r["precision"]) == (
        "tensorrt-rtx",
        RTX.version,
        ["sm89"],
        "fp16",
    )
    assert r["strongly_typed"] and r["onnx"]["dtype"] == "fp16" and r["verified"] is None
    assert r["profile"]["prefill_max_tokens"] == 512 and r["profile"]["decode_profile"] is False
    assert cache.check_entry(built.path.parent, r) is None
    stages = [e.stage for e in events]
    assert stages[:2] == ["miss", "parse"] and stages[-1] == "done" and "save" in stages
    phases = [e for e in events if e.stage == "build"]
    assert any(e.num_steps > 0 and not e.parent for e in phases)  # TensorRT's own top-level phases
    assert all(a.t_ns <= b.t_ns for a, b in zip(events, events[1:], strict=False))


def test_second_smollm2_build_is_a_cache_hit_without_the_builder(smollm2_engine, monkeypatch):
    exported, first, _ = smollm2_engine
    monkeypatch.setattr(builder, "compile_engine", no_builder)
    mtime = first.path.stat().st_mtime_ns
    events = Events()
    again = build_engine(exported, SM89, first.path.parent.parent, progress=events)
    assert again.cache_hit and again.path == first.path and again.build_s == 0
    assert first.path.stat().st_mtime_ns == mtime
    assert [e.stage for e in events] == ["cached"]


def test_the_metrics_count_a_real_build_then_a_cache_hit(smollm2_engine, monkeypatch):
    """The Prometheus counters follow the events of the real SM89 build and of its cache hit."""
    exported, first, build_events = smollm2_engine
    metrics = Metrics()
    for event in build_events:
        metrics.engine_event(event)
    monkeypatch.setattr(builder, "compile_engine", no_builder)
    build_engine(exported, SM89, first.path.parent.parent, progress=metrics.engine_event)
    value = metrics.registry.get_sample_value
    assert value("assistant_engine_builds_total") == 1
    assert value("assistant_cache_lookups_total", {"cache": "engine", "result": "miss"}) == 1
    assert value("assistant_cache_lookups_total", {"cache": "engine", "result": "hit"}) == 1
    assert (
        value("assistant_cache_lookups_total", {"cache": "timing_cache", "result": "miss"}) == 0
    )  # RTX: none


# Tiny random-weight model: cache damage, options, parser errors.


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory) -> ExportedDecoder:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-model")
    qwen2().save_pretrained(folder)
    return export_decoder(folder, ExportOptions(dtype="fp16"))


def damage_engine(folder, how):
    engine, record = folder / cache.ENGINE_FILE, folder / cache.RECORD_FILE
    data = bytearray(engine.read_bytes())
    if how == "flipped byte":
        data[len(data) // 2] ^= 0xFF
        engine.write_bytes(bytes(data))
    elif how == "truncated":
        engine.write_bytes(bytes(data[: len(data) // 3]))
    elif how == "no record":  # a build interrupted before its record was written
        record.unlink()
    elif how == "other version":
        r = json.loads(record.read_text())
        record.write_text(json.dumps({**r, "version": "1.6.0.0"}))
    elif how == "other GPU":  # an SM86 engine and its record copied into this slot
        r = json.loads(record.read_text())
        record.write_text(json.dumps({**r, "targets": ["sm86"]}))


@pytest.mark.parametrize("how", ["flipped byte", "truncated", "no record", "other version", "other GPU"])
def test_damaged_or_foreign_engine_is_detected_reported_and_rebuilt(tiny_export, tmp_path, how, caplog):
    first = build_engine(tiny_export, TINY, tmp_path)
    damage_engine(first.path.parent, how)
    assert cache.check_entry(first.path.parent, first.record) is not None
    metrics = Metrics()
    with caplog.at_level(logging.WARNING, logger="engines.tensorrt.builder"):
        again = build_engine(tiny_export, TINY, tmp_path, progress=metrics.engine_event)
    assert not again.cache_hit and again.path == first.path
    value = metrics.registry.get_sample_value
    assert value("assistant_engine_rebuilds_total", {"reason": "unusable"}) == 1
    assert value("assistant_engine_builds_total") == 1
    assert again.notice and "building again" in caplog.text
    expected = {"flipped byte": "corrupt", "truncated": "truncated", "no record": "missing",
                "other version": "foreign", "other GPU": "foreign"}[how]  # fmt: skip
    assert expected in again.notice
    assert cache.check_entry(again.path.parent, again.record) is None
    assert build_engine(tiny_export, TINY, tmp_path).cache_hit


def test_build_key_follows_settings_and_multi_target_builds(tiny_export, tmp_path):
    a = build_engine(tiny_export, TINY, tmp_path)
    b = build_engine(tiny_export, EngineOptions(**{**TINY.__dict__, "prefill_max_tokens": 32}), tmp_path)
    both = build_engine(tiny_export, EngineOptions(**{**TINY.__dict__, "targets": "sm86,sm89"}), tmp_path)
    assert len({a.path, b.path, both.path}) == 3 and not b.cache_hit
    assert both.record["targets"] == ["sm86", "sm89"] and "sm86+sm89" in both.path.parent.name
    assert [e.folder for e in cache.list_entries(tmp_path)] == sorted(p.path.parent for p in (a, b, both))


def test_parser_errors_are_listed_with_node_names(tiny_export, tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(tiny_export.path.parent, folder)
    model = onnx.load(str(folder / "decoder.onnx"))
    victims = [n for n in model.graph.node if n.op_type == "MatMul"][:2]
    for node in victims:
        node.op_type = "NoSuchOperator"
    onnx.save(model, str(folder / "decoder.onnx"))
    broken = ExportedDecoder(folder / "decoder.onnx", False, 0, tiny_export.metadata)
    with pytest.raises(OnnxParseError) as info:
        build_engine(broken, TINY, tmp_path / "engines")
    text = str(info.value)
    assert victims[0].name in text and "NoSuchOperator" in text
    assert info.value.errors and all(line.startswith("node ") for line in info.value.errors)
    # No engine; the failure is kept, so --backend auto does not build it again at every start.
    (entry,) = cache.list_entries(tmp_path / "engines")
    assert entry.problem.startswith("build failed") and "NoSuchOperator" in entry.problem
    assert not entry.engine_path.exists()


def test_cancelled_build_stops_and_leaves_no_entry(tiny_export, tmp_path):
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(builder.EngineBuildError, match="cancelled"):
        build_engine(tiny_export, TINY, tmp_path, cancel=cancel)
    assert not cache.list_entries(tmp_path)


def test_precisions_and_options_are_refused_with_the_fix(tiny_export, tmp_path, monkeypatch):
    with pytest.raises(UnsupportedPrecision, match="weight-only INT8/INT4"):
        build_engine(tiny_export, EngineOptions(**{**TINY.__dict__, "precision": "int8"}), tmp_path)
    for precision in ("fp32", "bf16"):  # each from the export of its own dtype
        with pytest.raises(EngineOptionsError, match=f"built from the {precision} export"):
            build_engine(tiny_export, EngineOptions(**{**TINY.__dict__, "precision": precision}), tmp_path)
    with pytest.raises(EngineOptionsError, match="1024 MiB"):
        build_engine(tiny_export, EngineOptions(**{**TINY.__dict__, "workspace_mib": 512}), tmp_path)
    with pytest.raises(EngineOptionsError, match="min <= opt <= max"):
        build_engine(tiny_export, EngineOptions(**{**TINY.__dict__, "prefill_opt_tokens": 128}), tmp_path)
    with pytest.raises(EngineOptionsError, match="sm90 unknown"):
        build_engine(tiny_export, EngineOptions(**{**TINY.__dict__, "targets": "sm90"}), tmp_path)
    with pytest.raises(EngineOptionsError, match="pass --target"):  # no GPU here to build for
        build_engine(tiny_export, EngineOptions(**{**TINY.__dict__, "targets": "auto"}), tmp_path)
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # full TensorRT absent, as on this machine
    with pytest.raises(TensorRTUnavailable, match="pip install tensorrt"):
        build_engine(tiny_export, TINY, tmp_path, flavour_name="tensorrt")
    assert not cache.list_entries(tmp_path)


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "garbage", "other tag"])
def test_damaged_tuning_cache_is_ignored_with_a_warning(tmp_path, damage, caplog):
    path = tmp_path / "runtime-tensorrt-rtx-1.7-gpu.bin"
    payload = bytes(range(256)) * 40
    tuning.save_blob(path, payload, "runtime")
    assert tuning.load_blob(path, "runtime") == payload and not caplog.records
    data = bytearray(path.read_bytes())
    if damage == "flipped byte":
        data[-100] ^= 0x01
    elif damage == "truncated":
        data = data[: len(data) - 10]
    elif damage == "garbage":
        data = bytearray(b"\x00" * 64)
    path.write_bytes(bytes(data))
    tag = "timing" if damage == "other tag" else "runtime"
    with caplog.at_level(logging.WARNING, logger="engines.tensorrt.tuning"):
        assert tuning.load_blob(path, tag) is None
    assert "ignoring" in caplog.text
    assert tuning.load_blob(tmp_path / "absent.bin", "runtime") is None


# The CLI on the tmp store (last: `engine clear` empties the cache the module built).


def test_cli_build_hit_list_and_clear(smollm2_engine, onnx_model_dir):
    _, built, _ = smollm2_engine
    store = str(onnx_model_dir.parent.parent)
    (built.path.parent.parent / ".half-built-abc").mkdir()  # an interrupted build's leftovers
    out = run_cli("engine", "build", "--store", store, "--target", "sm89")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("cache hit: ") and str(built.path) in out.stdout
    assert "cached: engine cache hit" in out.stderr
    out = run_cli("engine", "list", "--store", store)
    assert out.returncode == 0, out.stderr
    assert built.path.parent.name in out.stdout
    assert f"{built.size_bytes / 1e6:8.1f} MB" in out.stdout
    described = "tensorrt-rtx 1.7.1.116 sm89 fp16, prefill 1/128/512, context 2048, accuracy gate not checked"
    assert described in out.stdout
    out = run_cli("engine", "build", "--store", store, "--target", "sm89", "--precision", "int8")
    assert out.returncode == 2 and "no INT8 calibrator" in out.stderr and "Traceback" not in out.stderr
    damage_engine(built.path.parent, "truncated")
    out = run_cli("engine", "list", "--store", store)
    assert "UNUSABLE" in out.stdout and "truncated" in out.stdout
    out = run_cli("engine", "clear", "--store", store, "--broken")
    assert out.returncode == 0 and f"removed {built.path.parent.name}" in out.stdout
    assert not built.path.parent.exists() and not (built.path.parent.parent / ".half-built-abc").exists()
    out = run_cli("engine", "list", "--store", store)
    assert "no engines in" in out.stdout


def test_triton_repository_for_a_full_tensorrt_engine_and_refusal_for_rtx(tiny_export, tmp_path):
    from engines.tensorrt.triton import TritonExportError, write_repository

    built = build_engine(tiny_export, TINY, tmp_path / "engines")
    with pytest.raises(TritonExportError, match="full TensorRT engines, not tensorrt-rtx"):
        write_repository(tmp_path / "repo", "tiny", built.path, built.record, tiny_export.metadata)
    record = {**built.record, "flavour": "tensorrt"}  # what a full TensorRT build records
    folder = write_repository(tmp_path / "repo", "tiny", built.path, record, tiny_export.metadata)
    assert (folder / "1" / "model.plan").read_bytes() == built.path.read_bytes()
    text = (folder / "config.pbtxt").read_text()
    assert 'platform: "tensorrt_plan"' in text and "max_batch_size: 1" in text
    assert "dynamic_batching { max_queue_delay_microseconds: 100 }" in text
    assert '{ name: "past_key_values.1.value" data_type: TYPE_FP16 dims: [ 2, -1, 16 ] }' in text
    assert '{ name: "last_logits" data_type: TYPE_FP32 dims: [ 300 ] }' in text
    assert text.count("name: ") == 1 + 2 + 4 + 1 + 4  # model, ids, past, logits, present


def test_real_build_events_move_the_ui_load_bar_forward_within_its_span(smollm2_engine):
    """The events of the real SM89 build, as the UI's load bar sees them (session.EngineSteps)."""
    _, _, events = smollm2_engine
    shown: list[tuple[str, float]] = []
    steps = EngineSteps(lambda text, fraction: shown.append((text, fraction)), span=(0.05, 0.45))
    for event in events:
        steps(event)
    fractions = [f for _, f in shown]
    assert fractions == sorted(fractions) and 0.05 <= fractions[0] and fractions[-1] == 0.45
    assert len({f for f in fractions}) > 2  # TensorRT's top-level phases moved it, not only the end
    tops = {e.phase for e in events if e.stage == "build" and not e.parent}
    assert tops and all(any(text.startswith(f"building engine: {p}") for text, _ in shown) for p in tops)
    assert len(shown) < len(events) or len(events) < 50  # repeats within 100 ms are dropped
    # The bar says why it builds (the engine cache missed), then follows the build to its end.
    texts = [text for text, _ in shown]
    assert texts[0].startswith("no engine cached") and texts[1].startswith("parsing")
    assert texts[-1].startswith("built in")
