"""Defect 6: a cached engine TensorRT refuses is rebuilt only when a rebuild can help, and once.

Stand-in (``tests/helpers/standin_machine.py``): no TensorRT engine can execute here, so the real
loader (``engines/tensorrt/backend.py``) and ``TensorRTStep`` run over a fake TensorRT-RTX
whose ``get_engine_validity`` reports the diagnostics under test, and the build step writes a
stand-in engine blob (the real builder's engines cannot execute here). Tiny random Qwen2.
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from assistant.observe.metrics import Metrics
from engines.onnx_export import GRAPH_FILE
from engines.tensorrt import cache
from engines.tensorrt.backend import load_tensorrt_decoder
from engines.tensorrt.runtime import EngineIncompatible
from tests.helpers import standin_machine, trt_standin
from tests.helpers.standin_machine import ENGINE, install
from tests.helpers.trt_standin import EngineInvalidityDiagnostics as Why


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return standin_machine.tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))


class NoTokenizer:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return ""


def load(model, store, progress=None):
    options = dataclasses.replace(ENGINE, flavour="tensorrt-rtx", warmup=False)
    return load_tensorrt_decoder(model, NoTokenizer(), options, store, capacity_tokens=256, progress=progress)


def cached_engine(model, store, machine):
    """Build and close the engine once; returns its cache folder."""
    load(model, store).close()
    assert len(machine.builds) == 1 and machine.idle()
    (entry,) = cache.list_entries(store)
    return entry.folder


def replace_engine(folder, blob):
    """A foreign engine in an intact entry: the cache's own checks (size, sha256) pass."""
    (folder / cache.ENGINE_FILE).write_bytes(blob)
    engine = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    cache.update_record(folder, engine=engine)


@pytest.mark.parametrize(
    "why", [Why.OLD_CUDA_DRIVER, Why.UNSUPPORTED_CC, Why.INSUFFICIENT_GPU_MEMORY, Why.CUDA_ERROR]
)
def test_a_refusal_a_rebuild_cannot_fix_keeps_the_engine_and_says_so(monkeypatch, tmp_path, model, why):
    """The old code built again (minutes on a real GPU) for a machine's GPU, driver or memory."""
    machine = install(monkeypatch)
    folder = cached_engine(model, tmp_path, machine)
    before = (folder / cache.ENGINE_FILE).read_bytes()
    machine.trt.invalidity = why
    with pytest.raises(EngineIncompatible, match="cannot fix this") as error:
        load(model, tmp_path)
    assert why.name.lower() in str(error.value) and not error.value.rebuild_helps
    assert len(machine.builds) == 1  # no rebuild
    assert (folder / cache.ENGINE_FILE).read_bytes() == before and machine.idle()


def machine_exports(model):
    """The exported graphs TensorRT builds from (not ONNX Runtime's optimized ones beside them)."""
    return sorted((model / "onnx").rglob(GRAPH_FILE))


def foreign_or_damaged(kind, model):
    """Bytes of an engine TensorRT-RTX refuses: another version wrote it, or it is damaged."""
    if kind == "damaged":
        return b"not an engine at all"
    (onnx,) = machine_exports(model)
    return trt_standin.engine_blob(onnx, ENGINE, decode_profile=False, version="1.6.0.0")


@pytest.mark.parametrize(("kind", "why"), [("damaged", "malformed_engine"), ("foreign", "version_mismatch")])
def test_a_damaged_or_foreign_engine_is_rebuilt_once_and_then_runs(
    monkeypatch, tmp_path, model, kind, why, caplog
):
    machine = install(monkeypatch)
    folder = cached_engine(model, tmp_path, machine)
    replace_engine(folder, foreign_or_damaged(kind, model))
    metrics = Metrics()
    driver = load(model, tmp_path, metrics.engine_event)
    assert len(machine.builds) == 2
    value = metrics.registry.get_sample_value
    assert value("assistant_engine_rebuilds_total", {"reason": "incompatible"}) == 1
    assert value("assistant_cache_lookups_total", {"cache": "engine", "result": "hit"}) == 1  # then refused
    lookups = [
        value("assistant_cache_lookups_total", {"cache": "runtime_cache", "result": r})
        for r in ("hit", "miss")
    ]
    assert sum(lookups) == 1  # the rebuilt engine's context looked its runtime cache up once
    assert f"does not run here (tensorrt-rtx stand-in will not run this engine here: {why})" in caplog.text
    assert driver.step.forward([1, 2, 3], 0).shape == (300,)
    driver.close()


@pytest.mark.parametrize("kind", ["damaged", "foreign"])
def test_an_engine_still_refused_after_its_rebuild_is_not_rebuilt_again(monkeypatch, tmp_path, model, kind):
    """Exactly one rebuild, then the error: no loop."""
    machine = install(monkeypatch)
    folder = cached_engine(model, tmp_path, machine)
    replace_engine(folder, foreign_or_damaged(kind, model))
    machine.build_blob = foreign_or_damaged(kind, model)  # the builder makes no better engine
    with pytest.raises(EngineIncompatible):
        load(model, tmp_path)
    assert len(machine.builds) == 2 and machine.idle()
