"""``--backend auto`` prefers TensorRT, checks the engine with the accuracy gate, and falls back.

The TensorRT side is the CPU stand-in (``tests/helpers/standin_machine.py``): no TensorRT engine can
execute on this project's machines, so the real ``TensorRTStep`` runs over a fake TensorRT-RTX
and CUDA that execute the exported ONNX graph, and the build step writes a stand-in engine blob
(the real builder's engines cannot execute here). The model is a tiny random Qwen2 with a
word-level tokenizer. The machine has no CUDA for PyTorch, so every fallback lands where
``choose_backend`` goes without TensorRT on it: PyTorch on the CPU.
"""

from __future__ import annotations

import json
import logging
import threading

import pytest

from assistant.app import build_session
from assistant.modes.engine import _list
from assistant.stages.llm import load_llm
from engines.tensorrt import backend, cache
from engines.tensorrt.flavour import TensorRTUnavailable
from engines.tensorrt.runtime import EngineIncompatible
from tests.helpers import standin_machine
from tests.helpers.standin_machine import install
from tests.helpers.trt_standin import EngineInvalidityDiagnostics

WITHOUT_TENSORRT = "without TensorRT and PyTorch has no CUDA: PyTorch on the CPU"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return standin_machine.tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))


def load(store, model, notices=None, progress=None, **gate):
    s = standin_machine.settings(store, model, **gate)
    notice = None if notices is None else notices.append
    driver, _ = load_llm(s.models, s.decoder, s.engine, gate=s.gate, notice=notice, progress=progress)
    return driver


def engine_record(store):
    (entry,) = cache.list_entries(store / "engines")
    return entry.record


def test_auto_without_tensorrt_picks_the_next_backend_and_says_why(monkeypatch, tmp_path, model, caplog):
    """No TensorRT installed: the choice itself skips it (no notice: nothing failed), and says so."""
    install(monkeypatch, tensorrt=False)
    notices = []
    with caplog.at_level(logging.INFO, logger="assistant.stages.llm"):
        driver = load(tmp_path, model, notices)
    assert driver.name.startswith("pytorch-cpu") and driver.fallback == "" and notices == []
    assert "backend auto: pytorch (no TensorRT installed and PyTorch has no CUDA" in caplog.text


def test_auto_uses_the_engine_after_the_gate_and_trusts_the_verdict_at_the_next_start(
    monkeypatch, tmp_path, model, capsys
):
    machine = install(monkeypatch)
    events, notices = [], []
    driver = load(tmp_path, model, notices, progress=events.append)
    assert driver.name == "tensorrt-rtx fp32" and notices == [] and driver.fallback == ""
    assert "accuracy gate passed" in driver.cache_status
    assert any(e.message == "accuracy gate: dialogue 3/3" for e in events)  # the default 3 dialogues
    verdict = engine_record(tmp_path)["verified"]
    assert verdict["passed"] and verdict["token_agreement"] == 1.0
    assert verdict["checked_by"] == "start-up gate"
    driver.close()
    assert machine.idle()

    def no_gate(*args, **kwargs):
        raise AssertionError("the gate ran again")

    monkeypatch.setattr(backend, "run_gate", no_gate)
    again = load(tmp_path, model, notices)
    assert again.name == "tensorrt-rtx fp32" and len(machine.builds) == 1
    assert again.cache_status == "engine cache hit, accuracy gate passed before"
    again.close()
    _list(standin_machine.settings(tmp_path, model))
    assert "accuracy gate passed (agreement 100.0%, logits error" in capsys.readouterr().out


def test_a_gate_failure_falls_back_is_recorded_and_not_checked_again(monkeypatch, tmp_path, model, capsys):
    """The issue's case: the engine's logits are wrong (the stand-in negates them). The session
    says why once, its turn records carry it, the engine's record keeps the verdict, and the
    next start falls back without building, loading or gating the engine again."""
    machine = install(monkeypatch)
    machine.trt.wrong_logits = True
    session = build_session(standin_machine.settings(tmp_path, model), devices=False, asr=False, tts=False)
    try:
        (notice,) = session.notices
        assert notice.startswith("tensorrt-rtx not used: accuracy gate failed: token agreement 0.0% < 90%")
        assert notice.endswith(f". Decoding with pytorch instead ({WITHOUT_TENSORRT})")
        assert machine.idle()  # the refused engine was closed before PyTorch loaded
        record = session.pipeline.run_text_turn(1, "What is the capital of France?", None, threading.Event())
        assert record.backend.startswith("pytorch-cpu") and record.backend_fallback == notice
        assert json.loads(record.to_json())["backend_fallback"] == notice
    finally:
        session.close()
    verdict = engine_record(tmp_path)["verified"]
    assert not verdict["passed"] and verdict["token_agreement"] < 0.9

    monkeypatch.setattr(backend, "run_gate", lambda *a, **k: pytest.fail("the gate ran again"))
    monkeypatch.setattr(backend, "TensorRTStep", lambda *a, **k: pytest.fail("the engine was loaded again"))
    notices = []
    driver = load(tmp_path, model, notices)
    assert driver.name.startswith("pytorch-cpu") and len(machine.builds) == 1
    (notice,) = notices
    assert notice.startswith("tensorrt-rtx not used: accuracy gate failed at an earlier start (")
    assert "not checked again): token agreement 0.0% < 90%" in notice and "engine build --force" in notice
    _list(standin_machine.settings(tmp_path, model))
    assert "accuracy gate FAILED (agreement" in capsys.readouterr().out


def test_other_thresholds_check_a_failed_engine_again(monkeypatch, tmp_path, model):
    """A verdict holds for the thresholds it was made with; looser ones re-run the gate."""
    machine = install(monkeypatch)
    machine.trt.wrong_logits = True
    assert load(tmp_path, model, []).fallback
    machine.trt.wrong_logits = False
    driver = load(tmp_path, model, [], min_token_agreement=0.5)
    assert driver.name == "tensorrt-rtx fp32" and engine_record(tmp_path)["verified"]["passed"]
    driver.close()


def refuse_import(machine, monkeypatch):
    def missing(name):
        raise TensorRTUnavailable("tensorrt-rtx is not usable here (libnvinfer: cannot open shared object)")

    monkeypatch.setattr(backend, "load_flavour", missing)


def refuse_every_engine(machine, monkeypatch):
    machine.trt.invalidity = EngineInvalidityDiagnostics.OLD_CUDA_DRIVER


def fail_at_warm_up(machine, monkeypatch):
    machine.trt.fail_calls.add("set_input_shape")


@pytest.mark.parametrize(
    ("break_it", "said"),
    [
        (refuse_import, "TensorRT unavailable (tensorrt-rtx is not usable here (libnvinfer"),
        (refuse_every_engine, "engine does not run here (tensorrt-rtx stand-in will not run this "
         "engine here: old_cuda_driver)"),
        (fail_at_warm_up, "engine failed while running (TensorRT refused set_input_shape"),
    ],
)  # fmt: skip
def test_any_tensorrt_failure_falls_back_once_with_one_notice(monkeypatch, tmp_path, model, break_it, said):
    machine = install(monkeypatch)
    break_it(machine, monkeypatch)
    notices = []
    driver = load(tmp_path, model, notices)
    (notice,) = notices
    assert notice.startswith(f"tensorrt-rtx not used: {said}"), notice
    assert notice.endswith(f". Decoding with pytorch instead ({WITHOUT_TENSORRT})")
    assert driver.name.startswith("pytorch-cpu") and driver.fallback == notice
    assert machine.idle() and len(machine.builds) <= 1  # no rebuild for any of them


def test_a_failed_build_is_not_tried_again_at_the_next_start_but_engine_build_tries(
    monkeypatch, tmp_path, model, capsys
):
    """A build that fails costs its minutes once: later starts fall back at once and say why."""
    machine = install(monkeypatch)
    machine.build_error = "out of workspace memory while building"
    for _ in range(2):
        notices = []
        load(tmp_path, model, notices).close()
        (notice,) = notices
        assert "engine build failed" in notice and "out of workspace memory" in notice, notice
    assert "earlier start" in notice and "'assistant engine build' tries again" in notice
    assert len(machine.builds) == 1  # the second start did not build
    _list(standin_machine.settings(tmp_path, model))
    assert "UNUSABLE: build failed" in capsys.readouterr().out
    machine.build_error = None
    s = standin_machine.settings(tmp_path, model, backend_name="tensorrt-rtx")
    driver, _ = load_llm(s.models, s.decoder, s.engine)  # asked for explicitly: built again
    driver.close()
    assert len(machine.builds) == 2 and not engine_record(tmp_path)["verified"]


def test_an_explicit_tensorrt_backend_still_fails_loudly(monkeypatch, tmp_path, model):
    machine = install(monkeypatch)
    machine.trt.invalidity = EngineInvalidityDiagnostics.OLD_CUDA_DRIVER
    s = standin_machine.settings(tmp_path, model, backend_name="tensorrt-rtx")
    with pytest.raises(EngineIncompatible, match="old_cuda_driver"):
        load_llm(s.models, s.decoder, s.engine, gate=s.gate, notice=lambda line: pytest.fail(line))
