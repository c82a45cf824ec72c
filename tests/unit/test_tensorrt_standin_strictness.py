"""The four holes issue #16 found in the stand-in (``tests/helpers/trt_standin.py``), closed.

Each test here catches a GPU-style mutation of the runtime (``engines/tensorrt/runtime.py``)
that passed the whole suite before (``docs/engines.md``, "Executable specification", lists the
mutations and what catches them). The stand-in is a fake of TensorRT and CUDA executing the
ONNX export on the CPU, since no TensorRT engine can execute on this project's machines.
"""

from __future__ import annotations

import numpy as np
import pytest

from engines.driver import DecoderDriver
from engines.tensorrt.runtime import DECODE, PREFILL
from tests.helpers import trt_standin
from tests.helpers.standin_runtime import (
    REAL_CUDA,
    NoTokenizer,
    assert_matches,
    conversation,
    greedy,
    make_gpu,
    make_reference,
    make_tiny,
    ort_driver,
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


ODD_PROMPT = [7, 3, 250, 11, 42]  # a 5-token turn with 2 decodes: 3 steps, after 4 turns


@pytest.mark.parametrize("lag", ["none", "full"])
def test_graph_replays_after_an_odd_history(tiny, gpu, reference, lag):
    """Hole 1: the conversation, an odd extra turn (a 5-token prompt, 2 decodes), then the
    conversation again, whose decode steps replay the graphs captured the first time.

    The conversation has an even number of steps and turns; an input address that alternates
    between two slots (every step or every turn) lines up again after it by luck, not after
    the odd turn."""
    odd = greedy(ort_driver(tiny), ODD_PROMPT, 2)
    cuda, trt = gpu(lag=lag)
    step = trt_step(tiny, trt, cuda_graphs=True)
    driver = DecoderDriver(step, NoTokenizer(), [])
    assert_matches(conversation(driver), reference)
    driver.reset()
    assert_matches(greedy(driver, ODD_PROMPT, 2), odd)
    launched = cuda.counts["graph_launch"]
    assert_matches(conversation(driver), reference)
    assert cuda.counts["graph_launch"] - launched >= 4 * 5 - 2  # the replays happened
    step.close()


@pytest.mark.parametrize("length", [17, 33])
def test_a_prompt_ending_in_a_one_token_chunk_with_graphs_on_a_lagging_stream(tiny, gpu, length):
    """Hole 2: 17 and 33 tokens are chunks of 16 and a last chunk of one token, a decode-shaped
    graph step that first moves the cache to its parity while the chunk before is still queued.

    The move must be ordered after that chunk on the runtime's stream (the stand-in refuses a
    blocking ``cudaMemcpy`` on the null stream, which a non-blocking stream does not wait for)."""
    prompt = np.random.default_rng(length).integers(0, 300, length).tolist()
    expected = greedy(ort_driver(tiny), prompt, 4)
    cuda, trt = gpu(lag="full")
    step = trt_step(tiny, trt, cuda_graphs=True)
    driver = DecoderDriver(step, NoTokenizer(), [])
    assert_matches(greedy(driver, prompt, 4), expected)
    driver.reset()
    assert_matches(greedy(driver, prompt, 4), expected)  # the decode steps replay their graphs
    assert cuda.counts["graph_launch"] > 0
    step.close()


def test_the_standin_refuses_overlapping_device_copies(gpu):
    """Hole 3: a device-to-device copy whose source and destination overlap is undefined in
    CUDA (an in-place prefix cut is one); the stand-in raises instead of doing a memmove."""
    cuda, _ = gpu()
    _, base = cuda.cudaMalloc(4096)
    _, stream = cuda.cudaStreamCreateWithFlags(cuda.cudaStreamNonBlocking)
    d2d = cuda.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    with pytest.raises(trt_standin.OrderingError, match="overlaps"):
        cuda.cudaMemcpy2DAsync(base, 64, base, 128, 64, 4, d2d, stream)  # compacting rows in place
    with pytest.raises(trt_standin.OrderingError, match="overlaps"):
        cuda.cudaMemcpyAsync(base + 100, base, 200, d2d, stream)
    if not REAL_CUDA:  # the bridge leaves blocking copies to CUDA
        with pytest.raises(trt_standin.OrderingError, match="overlaps"):
            cuda.cudaMemcpy(base + 100, base, 200, d2d)
    # Interleaved rows that never share a byte are fine, as are disjoint ranges.
    assert cuda.cudaMemcpy2DAsync(base + 64, 128, base, 128, 64, 4, d2d, stream) == (cuda.cudaError_t(0),)
    assert cuda.cudaMemcpyAsync(base + 2048, base, 2048, d2d, stream) == (cuda.cudaError_t(0),)


@pytest.mark.skipif(REAL_CUDA, reason="a rule of the CPU stand-in: real CUDA does not report races")
def test_the_standin_refuses_a_blocking_copy_racing_the_non_blocking_stream(gpu):
    """Hole 2's rule on its own: with work still queued on the runtime's non-blocking stream, a
    ``cudaMemcpy`` (legacy null stream) of memory that work uses is a race."""
    cuda, _ = gpu(lag="full")
    _, a = cuda.cudaMalloc(1024)
    _, b = cuda.cudaMalloc(1024)
    _, stream = cuda.cudaStreamCreateWithFlags(cuda.cudaStreamNonBlocking)
    d2d = cuda.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    cuda.cudaMemcpyAsync(b, a, 1024, d2d, stream)  # queued, not run (the stream lags)
    with pytest.raises(trt_standin.OrderingError, match="not ordered after non-blocking stream"):
        cuda.cudaMemcpy(a, b, 1024, d2d)
    cuda.cudaStreamSynchronize(stream)
    assert cuda.cudaMemcpy(a, b, 1024, d2d) == (cuda.cudaError_t(0),)


def test_set_tensor_address_refuses_an_unaligned_pointer(tiny, gpu):
    """Hole 4: TensorRT requires 256-byte aligned tensor addresses and refuses others."""
    cuda, trt = gpu()
    step = trt_step(tiny, trt)
    context, ptr = step.contexts[PREFILL], step.ids.ptr
    assert ptr % trt_standin.ALIGNMENT == 0 and context.set_tensor_address("input_ids", ptr)
    for off in (8, 128, 255):
        assert not context.set_tensor_address("input_ids", ptr + off)
    step.close()


def test_each_execution_context_has_its_own_optimization_profile(tiny, gpu):
    """Hole 5: the prefill context runs profile 0 and the decode context profile 1; TensorRT
    (and the stand-in) refuses a profile another live context of the engine already chose."""
    cuda, trt = gpu()
    step = trt_step(tiny, trt)
    assert [c.profile for c in step.contexts] == [PREFILL, DECODE]
    step.forward(list(range(10)), 0)
    step.forward([3], 10)
    assert step.contexts[PREFILL].ran_with[0] == PREFILL and step.contexts[DECODE].ran_with[0] == DECODE
    other = step.engine.create_execution_context()
    assert not other.set_optimization_profile_async(PREFILL, step.stream.handle)
    step.close()
