"""What a decoder is, as data: its identity, its display name, the metrics' labels, fallback words."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from assistant.observe.metrics import Metrics
from assistant.stages.llm import _failure
from engines.base import Backend, BackendIdentity
from engines.onnx_export import ExportError
from engines.tensorrt.compiler import EngineBuildError, OnnxParseError
from engines.tensorrt.cuda_mem import CudaError
from engines.tensorrt.flavour import TensorRTUnavailable
from engines.tensorrt.gate import GateFailed
from engines.tensorrt.runtime import EngineIncompatible, EngineRuntimeError


@pytest.mark.parametrize(
    ("identity", "name", "label"),
    [
        (BackendIdentity(Backend.PYTORCH, "cpu", "fp32"), "pytorch-cpu fp32", "pytorch-cpu"),
        (
            BackendIdentity(Backend.PYTORCH, "cuda", "bf16", "cuda-graph+compile"),
            "pytorch-cuda bf16 cuda-graph+compile",
            "pytorch-cuda",
        ),
        (BackendIdentity(Backend.ONNXRUNTIME, "cpu", "fp16"), "onnxruntime-cpu fp16", "onnxruntime-cpu"),
        (BackendIdentity(Backend.TENSORRT, "cuda", "int8", version="10.13"), "tensorrt int8", "tensorrt"),
        (BackendIdentity(Backend.TENSORRT_RTX, "cuda", "fp32"), "tensorrt-rtx fp32", "tensorrt-rtx"),
        (BackendIdentity(Backend.REMOTE, address="grpc://gpu:8001"), "server grpc://gpu:8001", "server"),
    ],
)
def test_the_display_name_and_the_short_label_come_from_the_identity(identity, name, label):
    """The names read as before the identity existed (records and the UI show them)."""
    assert identity.describe() == name
    assert identity.label == label


class ServedDecoder:
    """A decoder as the protocol describes it, with nothing else (no step, no flavour)."""

    name = "tensorrt-rtx fp16"
    capacity_tokens = 64
    identity = BackendIdentity(Backend.TENSORRT_RTX, "cuda", "fp16", version="1.7.1")
    fallback = ""
    cache_status = "engine cache hit"
    cached_ids = [1, 2, 3]

    def close(self):
        pass


def test_the_metrics_label_a_decoder_by_its_identity_not_by_parsing_its_name():
    """The TensorRT version comes from the identity: the old code dug it out of decoder.step.flavour."""
    metrics = Metrics()
    metrics.attach(ServedDecoder(), "smollm2-135m-instruct", "tiny.en")
    scrape = generate_latest(metrics.registry).decode()
    (info,) = [line for line in scrape.splitlines() if line.startswith("assistant_backend_info{")]
    assert 'backend="tensorrt-rtx"' in info and 'precision="fp16"' in info
    assert 'tensorrt_version="1.7.1"' in info
    assert "assistant_kv_cache_tokens 3.0" in scrape and "assistant_kv_cache_capacity_tokens 64.0" in scrape


def test_a_fallback_is_counted_under_the_backend_used():
    decoder = ServedDecoder()
    decoder.identity = BackendIdentity(Backend.PYTORCH, "cpu", "fp32")
    decoder.fallback = "tensorrt-rtx not used: TensorRT unavailable (no GPU)"
    metrics = Metrics()
    metrics.attach(decoder, "m", "a")
    assert (
        'assistant_backend_fallbacks_total{used="pytorch-cpu"} 1.0'
        in generate_latest(metrics.registry).decode()
    )


class LateOnnxParseError(OnnxParseError):
    """A subclass: mapped as its base (the old name lookup showed the subclass's name)."""


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (TensorRTUnavailable("no libnvinfer"), "TensorRT unavailable (no libnvinfer)"),
        (EngineIncompatible("old driver"), "engine does not run here (old driver)"),
        (OnnxParseError(Path("m.onnx"), ["bad node"]), "ONNX parser refused the export (TensorRT's ONNX"),
        (LateOnnxParseError(Path("m.onnx"), ["bad node"]), "ONNX parser refused the export (TensorRT's ONNX"),
        (EngineBuildError("no memory"), "engine build failed (no memory)"),
        (ExportError("disk full"), "ONNX export failed (disk full)"),
        (EngineRuntimeError("NaN"), "engine failed while running (NaN)"),
        (CudaError("illegal address"), "CUDA error (illegal address)"),
        (OSError("read-only"), "OSError (read-only)"),
        (GateFailed("accuracy gate failed: 3/8 dialogues", {}), "accuracy gate failed: 3/8 dialogues"),
    ],
)
def test_a_fallback_names_what_failed_by_the_exception_class(error, said):
    assert _failure(error).startswith(said)
