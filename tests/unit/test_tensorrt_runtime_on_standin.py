"""The real TensorRT runtime (``engines/tensorrt/runtime.py``, ``cuda_mem.py``) against the stand-in.

No TensorRT engine can execute on this project's machines, so :mod:`tests.helpers.trt_standin`
executes the exported ONNX decoder with ONNX Runtime behind the TensorRT and CUDA calls the
runtime makes, strictly (a lagging stream, poisoned results until synchronised, failed
captures on purpose). The runtime must give exactly the tokens of the ONNX Runtime backend
on the same export. Tiny random-weight Qwen2 model (exports in ~1 s).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from assistant import app as session_module
from assistant.app import Session
from assistant.config import Settings
from assistant.stages.dialogue import Dialogue
from engines.base import GenerationOptions
from engines.driver import DecoderDriver
from engines.onnx_export import INPUT_IDS, POSITION_IDS, ExportOptions, export_decoder
from engines.onnxruntime_backend import OnnxRuntimeStep
from engines.tensorrt import cuda_mem
from engines.tensorrt.flavour import Flavour
from engines.tensorrt.options import EngineOptions
from engines.tensorrt.runtime import EngineIncompatible, EngineRuntimeError
from tests.helpers import trt_standin
from tests.helpers.standin_runtime import (
    CAPACITY,
    NoTokenizer,
    assert_matches,
    conversation,
    make_gpu,
    make_reference,
    make_tiny,
    trt_step,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory)


@pytest.fixture
def gpu(monkeypatch):
    yield from make_gpu(monkeypatch)


@pytest.fixture(scope="module")
def reference(tiny):
    return make_reference(tiny)


@pytest.mark.parametrize("lag", ["none", "random", "full"])
@pytest.mark.parametrize("graphs", [False, True])
def test_runtime_gives_the_onnxruntime_tokens(tiny, gpu, reference, lag, graphs):
    """Prefill, chunked prefill, decode, prefix cut (and graph replays), on an eager or lagging GPU."""
    cuda, trt = gpu(lag=lag)
    step = trt_step(tiny, trt, cuda_graphs=graphs)
    driver = DecoderDriver(step, NoTokenizer(), [])
    assert_matches(conversation(driver), reference)
    assert_matches(conversation(driver), reference)  # again: replays the graphs captured above
    if graphs:
        assert cuda.counts["graph_launch"] > 0
    step.close()
    assert cuda.live() == {"device": 0, "pinned": 0, "streams": 0, "graphs": 0}


def test_fp16_engine_gives_the_onnxruntime_fp16_tokens(tiny, gpu):
    """The fp16 graph TensorRT builds from: half-precision KV buffers, 2-byte rows, same tokens.

    The profile takes every prompt whole, so both sides run the same shapes (exact logits)."""
    folder, config, _, _ = tiny
    path = export_decoder(folder, ExportOptions(dtype="fp16")).path
    whole = EngineOptions(prefill_opt_tokens=16, prefill_max_tokens=128, context_opt_tokens=64)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = conversation(
        DecoderDriver(OnnxRuntimeStep(session, config, CAPACITY, "fp16"), NoTokenizer(), [])
    )
    cuda, trt = gpu(lag="full")
    blob = trt_standin.engine_blob(path, whole, decode_profile=True)
    step = trt_step(tiny, trt, blob=blob, cuda_graphs=True)
    assert step.np_dtype == np.float16 and step.row_bytes == config.head_dim * 2
    driver = DecoderDriver(step, NoTokenizer(), [])
    assert_matches(conversation(driver), expected)
    assert_matches(conversation(driver), expected)
    step.close()


def test_chunked_prefill_gives_each_queued_copy_its_own_host_bytes(tiny, gpu, reference):
    """Defect 1: a 40-token prompt runs as chunks of 16, 16 and 8 with their copies queued."""
    cuda, trt = gpu(lag="full")
    step = trt_step(tiny, trt)
    assert step.prefill_max == 16
    driver = DecoderDriver(step, NoTokenizer(), [])
    assert_matches(conversation(driver), reference)  # base: OrderingError, buffer rewritten


def test_identical_conversations_replay_every_decode_graph(tiny, gpu, reference):
    """Defect 4: the second identical conversation captures nothing and replays every decode."""
    cuda, trt = gpu()
    step = trt_step(tiny, trt, cuda_graphs=True)
    driver = DecoderDriver(step, NoTokenizer(), [])
    conversation(driver)
    captured, launched = cuda.counts["graph_capture"], cuda.counts["graph_launch"]
    assert_matches(conversation(driver), reference)
    assert cuda.counts["graph_capture"] == captured  # nothing new to capture
    assert cuda.counts["graph_launch"] - launched == 4 * 5  # every decode step of the 4 turns
    assert step.graphs is not None and step.graphs.replays == cuda.counts["graph_launch"]


@pytest.mark.parametrize("failure", ["execute", "invalidate"])
def test_a_failed_graph_capture_is_not_replayed(tiny, gpu, reference, failure, caplog):
    """Defect 3: a capture that fails leaves no graph; decoding goes on without graphs."""
    cuda, trt = gpu(fail_capture=failure)
    step = trt_step(tiny, trt, cuda_graphs=True)
    driver = DecoderDriver(step, NoTokenizer(), [])
    assert_matches(conversation(driver), reference)
    assert_matches(conversation(driver), reference)
    assert cuda.counts["graph_launch"] == 0 and cuda.live()["graphs"] == 0
    assert "CUDA graph capture failed" in caplog.text


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("set_input_shape", "set_input_shape(input_ids, (1, 16))"),
        ("set_tensor_address", "set_tensor_address(input_ids"),
    ],
)
def test_a_refused_binding_names_the_call(tiny, gpu, call, message):
    """Defect 8: TensorRT refusing a shape or an address is reported as that, not as a failed run."""
    cuda, trt = gpu()
    step = trt_step(tiny, trt)
    trt.fail_calls.add(call)
    with pytest.raises(EngineRuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        step.forward(list(range(16)), 0)


def test_a_refused_optimization_profile_fails_the_load_and_frees_everything(tiny, gpu):
    """Defects 8 and 9: ``set_optimization_profile_async`` returning False is an error, and the
    half-built step releases its stream and memory."""
    cuda, trt = gpu(fail_calls=("set_optimization_profile_async",))
    with pytest.raises(EngineRuntimeError, match="set_optimization_profile_async"):
        trt_step(tiny, trt)
    assert cuda.live() == {"device": 0, "pinned": 0, "streams": 0, "graphs": 0}


@pytest.mark.parametrize("fail", ["context", "malloc"])
def test_a_partly_failed_init_frees_what_it_allocated(tiny, gpu, fail):
    """Defect 9: no context for the decode profile, or out of GPU memory half-way."""
    options = {"fail_contexts_after": 1} if fail == "context" else {"fail_malloc_after": 5}
    cuda, trt = gpu(**options)
    with pytest.raises((EngineRuntimeError, cuda_mem.CudaError)):
        trt_step(tiny, trt)
    assert cuda.live() == {"device": 0, "pinned": 0, "streams": 0, "graphs": 0}


def test_pinned_array_is_unusable_after_free(gpu):
    """Defect 9: ``PinnedArray.array`` must not outlive ``free()`` (it would point at freed pages)."""
    cuda, _ = gpu()
    pinned = cuda_mem.PinnedArray(4, np.int64)
    pinned.array[:] = 7
    pinned.free()
    assert cuda.live()["pinned"] == 0
    with pytest.raises(ValueError, match="freed"):
        pinned.array[:] = 1


def test_close_is_idempotent_and_a_closed_step_refuses_work(tiny, gpu):
    cuda, trt = gpu()
    step = trt_step(tiny, trt, cuda_graphs=True)
    step.forward([1, 2, 3], 0)
    step.close()
    step.close()
    assert cuda.live() == {"device": 0, "pinned": 0, "streams": 0, "graphs": 0}
    with pytest.raises(EngineRuntimeError, match="closed"):
        step.forward([4], 3)


def test_rtx_runtime_cache_of_a_run_is_saved_on_close_without_warm_up(tiny, gpu, tmp_path):
    """Defect 5 (runtime side): with warm-up off, closing saves what the RTX runtime JIT-compiled."""
    cuda, trt = gpu()
    path = tmp_path / "runtime.bin"
    step = trt_step(tiny, trt, flavour="tensorrt-rtx", runtime_cache=path)
    step.forward(list(range(10)), 0)
    step.forward([3], 10)
    step.close()
    assert path.is_file()
    again = trt_step(tiny, trt, flavour="tensorrt-rtx", runtime_cache=path)
    assert again.handle.loaded and again.handle.cache.kernels == {"0:10", "1:1"}
    again.close()


def test_a_foreign_engine_is_incompatible(tiny, gpu):
    _, trt = gpu()
    with pytest.raises(EngineIncompatible, match="could not deserialize"):
        trt_step(tiny, trt, blob=b"not an engine")
    with pytest.raises(EngineIncompatible, match="malformed_engine"):
        trt_step(tiny, trt, flavour="tensorrt-rtx", blob=b"not an engine")


def rtx_driver(tiny, trt, path):
    step = trt_step(tiny, trt, flavour="tensorrt-rtx", runtime_cache=path)
    return DecoderDriver(step, NoTokenizer(), [])


def test_closing_the_session_closes_the_engine_and_saves_its_runtime_cache(tiny, gpu, tmp_path):
    """Defect 5: quitting the app (``Session.close``) closes the decoder, warm-up or not."""
    cuda, trt = gpu()
    path = tmp_path / "runtime.bin"
    driver = rtx_driver(tiny, trt, path)
    driver.decode(int(np.argmax(driver.prefill(list(range(12))))))
    session = Session(dialogue=Dialogue(driver, NoTokenizer(), "", GenerationOptions()), pipeline=None)
    session.close()
    assert path.is_file() and cuda.live() == {"device": 0, "pinned": 0, "streams": 0, "graphs": 0}
    session.close()  # idempotent


def test_a_failed_session_load_closes_the_loaded_engine(tiny, gpu, tmp_path, monkeypatch):
    """Defect 5: a load that fails after the decoder loaded (here its warm-up) releases it."""
    cuda, trt = gpu()
    driver = rtx_driver(tiny, trt, tmp_path / "runtime.bin")
    monkeypatch.setattr(session_module, "load_llm", lambda *a, **k: (driver, NoTokenizer()))

    def broken_warm_up(self):
        raise RuntimeError("warm-up failed")

    monkeypatch.setattr(Dialogue, "warm_up", broken_warm_up)
    with pytest.raises(RuntimeError, match="warm-up failed"):
        session_module.build_session(Settings(), devices=False, asr=False, tts=False)
    assert cuda.live() == {"device": 0, "pinned": 0, "streams": 0, "graphs": 0}


class IInt8EntropyCalibrator2:
    """Full TensorRT 10's calibrator base (absent from TensorRT-RTX and TensorRT 11)."""

    def __init__(self):
        pass


class BuilderFlag:
    """Full TensorRT 10's precision flags (absent from TensorRT-RTX and TensorRT 11)."""

    FP16, BF16, INT8 = 1, 2, 3


class IBuilderConfig:
    """Full TensorRT 10's calibration members of the builder config (gone in TensorRT 11)."""

    int8_calibrator = None

    def set_calibration_profile(self, profile):
        pass


def test_int8_build_frees_the_calibrators_gpu_buffers(tiny, gpu, tmp_path, monkeypatch):
    """Defect 9: the calibrator's device buffers are released after the build (or its failure)."""
    from engines.tensorrt import builder, calibration

    folder, _, path, _ = tiny
    cuda, trt = gpu()
    # int8 is calibrated on TensorRT 10.x only: the stand-in gets 10.x's names and version.
    trt.IInt8EntropyCalibrator2 = IInt8EntropyCalibrator2
    trt.BuilderFlag, trt.IBuilderConfig = BuilderFlag, IBuilderConfig
    monkeypatch.setattr(calibration, "cudart", lambda: cuda)
    monkeypatch.setattr(builder, "load_flavour", lambda name: Flavour("tensorrt", trt, "10.13.3.9"))
    batches = []

    def fake_build(*args):
        calibrator = args[-1]
        while (
            pointers := calibrator.get_batch([INPUT_IDS, POSITION_IDS, "past_key_values.0.key"])
        ) is not None:
            batches.append(cuda.device_view(pointers[0], 8 * calibrator.length_tokens).view(np.int64).copy())
        return b"stand-in engine"

    monkeypatch.setattr(builder, "compile_engine", fake_build)
    exported = export_decoder(folder, ExportOptions(dtype="fp32"))
    options = EngineOptions(flavour="tensorrt", precision="int8", prefill_opt_tokens=8)
    gpu_facts = cuda_mem.GpuInfo("stand-in", (9, 0), 8 << 30)
    ids = [list(range(i, i + 12)) for i in range(3)]
    built = builder.build_engine(
        exported, options, tmp_path, flavour_name="tensorrt", calibration_ids=ids, gpu=gpu_facts
    )
    assert built.path.read_bytes() == b"stand-in engine"
    assert [b.tolist() for b in batches][0] == list(range(8))  # the snippets reached the device
    assert cuda.live()["device"] == 0


def test_a_refused_runtime_cache_is_reported_and_not_saved(tiny, gpu, tmp_path, caplog):
    """Defect 8 (RTX): ``set_runtime_cache`` returning False is a warning, not a silent loss."""
    cuda, trt = gpu(fail_calls=("set_runtime_cache",))
    path = tmp_path / "runtime.bin"
    step = trt_step(tiny, trt, flavour="tensorrt-rtx", runtime_cache=path)
    assert not step.handle.attached and "refused set_runtime_cache" in caplog.text
    step.forward([1, 2, 3], 0)
    step.close()
    assert not path.exists()
