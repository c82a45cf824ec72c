"""What the runtime-on-stand-in tests share: the tiny model, the stand-in GPU, the conversation.

Each test module wraps :func:`make_tiny`, :func:`make_gpu` and :func:`make_reference` in its
own fixtures (named ``tiny``, ``gpu``, ``reference``).

The runtime (``engines/tensorrt/runtime.py``) runs against the CPU stand-in of TensorRT and
CUDA (``tests/helpers/trt_standin.py``: a fake, since no TensorRT engine can execute on this
project's machines), and must give exactly the tokens of the ONNX Runtime backend on the same
export of a tiny random-weight Qwen2 model.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import onnxruntime as ort
import pytest
import torch

from engines.driver import DecoderDriver
from engines.onnx_export import ExportOptions, export_decoder
from engines.onnxruntime_backend import OnnxRuntimeStep
from engines.tensorrt import cuda_mem
from engines.tensorrt.flavour import Flavour
from engines.tensorrt.options import EngineOptions
from engines.tensorrt.runtime import TensorRTStep
from models.config import DecoderConfig
from tests.helpers import trt_standin
from tests.helpers.families import qwen2

REAL_CUDA = os.environ.get("STANDIN_CUDA") == "real"
CAPACITY = 256
PROFILE = EngineOptions(
    prefill_opt_tokens=8, prefill_max_tokens=16, context_opt_tokens=64, context_max_tokens=CAPACITY
)


class NoTokenizer:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return ""


def make_tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The tiny model's folder, config, fp32 export and a stand-in engine blob of it."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-standin")
    qwen2().save_pretrained(folder)
    exported = export_decoder(folder, ExportOptions(dtype="fp32"))
    blob = trt_standin.engine_blob(exported.path, PROFILE, decode_profile=True)
    return folder, DecoderConfig.from_dir(folder), exported.path, blob


def make_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """``gpu(**FakeCuda options)`` -> (cuda, trt): the stand-in, patched into ``cuda_mem``.

    With ``STANDIN_CUDA=real`` (on a machine with an NVIDIA GPU) the CUDA half is the real
    ``cuda.bindings.runtime`` (``tests/helpers/standin_real_cuda.py``): the same tests then run
    ``cuda_mem``'s memory, stream, copy and graph code on the GPU.
    """
    made = []

    def make(fail_calls=(), fail_contexts_after=-1, **cuda_options):
        if REAL_CUDA:
            from tests.helpers.standin_real_cuda import RealCuda

            cuda = RealCuda(**cuda_options)
        else:
            cuda = trt_standin.FakeCuda(**cuda_options)
        made.append(cuda)
        monkeypatch.setattr(cuda_mem, "cudart", lambda: cuda)
        return cuda, trt_standin.FakeTensorRT(cuda, fail_calls, fail_contexts_after)

    yield make
    for cuda in made:
        if REAL_CUDA:
            cuda.rt.cudaDeviceSynchronize()
            cuda.free_staging()
            assert not cuda.errors, cuda.errors


def trt_step(tiny, trt, flavour="tensorrt", blob=None, **options):
    _, config, _, default_blob = tiny
    return TensorRTStep(Flavour(flavour, trt, "stand-in"), blob or default_blob, config, CAPACITY, **options)


def ort_driver(tiny: tuple) -> DecoderDriver:
    """The ONNX Runtime backend on the tiny model's fp32 export: the reference."""
    _, config, path, _ = tiny
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return DecoderDriver(OnnxRuntimeStep(session, config, CAPACITY, "fp32"), NoTokenizer(), [])


def make_reference(tiny: tuple) -> tuple:
    """The ONNX Runtime backend's greedy run of :func:`conversation` (tokens, logits)."""
    return conversation(ort_driver(tiny))


def greedy(driver: DecoderDriver, prompt: list[int], new_tokens: int) -> tuple[list[int], list]:
    """One greedy turn: the prompt, then ``new_tokens`` decodes; the tokens and their logits."""
    tokens, logits = [], []
    out = driver.prefill(prompt)
    for _ in range(new_tokens):
        tokens.append(int(np.argmax(out)))
        logits.append(out)
        out = driver.decode(tokens[-1])
    return tokens, logits


def conversation(driver, new_tokens=5):
    """Greedy turns: a 40-token prompt (chunked: > 2 x the prefill max of 16), a prompt that
    cuts the cache back to 25 tokens, one that continues the whole history, and a 70-token
    prompt from scratch. Returns every chosen token and the logits it came from."""
    rng = np.random.default_rng(0)
    first = rng.integers(0, 300, 40).tolist()
    tokens, logits, history = [], [], []

    def turn(prompt):
        nonlocal history
        out = driver.prefill(prompt)
        history = list(prompt)
        for _ in range(new_tokens):
            token = int(np.argmax(out))
            tokens.append(token)
            logits.append(out)
            out = driver.decode(token)
            history.append(token)

    driver.reset()
    turn(first)
    turn(first[:25] + rng.integers(0, 300, 9).tolist())
    turn(history + rng.integers(0, 300, 3).tolist())
    turn(rng.integers(0, 300, 70).tolist())
    return tokens, logits


def assert_matches(got, reference):
    tokens, logits = got
    assert tokens == reference[0]
    for g, e in zip(logits, reference[1], strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)
