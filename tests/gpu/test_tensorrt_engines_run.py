"""TensorRT / TensorRT-RTX engines running on a GPU (``gpu_tensorrt``: needs ``--run-tensorrt``).

None of this can run on the project's machines (no GPU in CI; the H200 is refused by
TensorRT-RTX and full TensorRT is not installable there). Without ``--run-tensorrt`` these
tests are reported as skipped with that reason; with it, a missing TensorRT or GPU FAILS them.
Tiny random-weight model (no model store needed), fp16 engine against PyTorch fp32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engines.selection import choose_backend, probe
from engines.tensorrt.backend import load_tensorrt_decoder
from engines.tensorrt.cuda_mem import gpu_info
from engines.tensorrt.options import EngineOptions
from engines.torch_backend import TorchBackendOptions, load_torch_decoder
from tests.helpers.families import qwen2

pytestmark = pytest.mark.gpu_tensorrt


class NoTokenizer:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(65 + i % 26) for i in ids)


@pytest.fixture(scope="module")
def flavour():
    """The TensorRT flavour this machine runs; fails (never skips) when there is none."""
    if gpu_info() is None:
        pytest.fail("--run-tensorrt given, but cuda-python sees no GPU or driver")
    choice = choose_backend(probe())
    if choice.backend not in ("tensorrt", "tensorrt-rtx"):
        pytest.fail(f"--run-tensorrt given, but no TensorRT runs here: {choice.reason}")
    return choice.backend


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-trt")
    qwen2().save_pretrained(folder)
    return folder


def options(flavour, **changes):
    base = dict(flavour=flavour, targets="auto", prefill_opt_tokens=16, prefill_max_tokens=64,
                context_opt_tokens=64, context_max_tokens=256)  # fmt: skip
    return EngineOptions(**{**base, **changes})


def engine_decoder(tiny_dir, cache_dir, flavour, **changes):
    return load_tensorrt_decoder(
        tiny_dir, NoTokenizer(), options(flavour, **changes), cache_dir, capacity_tokens=256
    )


def reference(tiny_dir):
    opts = TorchBackendOptions(device="cpu", dtype="fp32", capacity_tokens=256, threads=2)
    return load_torch_decoder(tiny_dir, NoTokenizer(), opts)


def run_steps(decoder, first_len=40):
    """Prefill, five decode steps, then a prompt sharing 25 tokens (cuts the cache), two decodes."""
    rng = np.random.default_rng(0)
    first = rng.integers(0, 300, first_len).tolist()
    second = first[:25] + rng.integers(0, 300, 9).tolist()
    decoder.reset()
    out = [decoder.prefill(first)]
    out += [decoder.decode(t) for t in (5, 17, 250, 3, 42)]
    out.append(decoder.prefill(second))
    out += [decoder.decode(t) for t in (8, 9)]
    return out


def rel_err(got, expected):
    return max(float(np.linalg.norm(g - e) / np.linalg.norm(e)) for g, e in zip(got, expected, strict=True))


def test_engine_tracks_pytorch_through_prefill_decode_and_prefix_cut(flavour, tiny_dir, tmp_path):
    engine = engine_decoder(tiny_dir, tmp_path, flavour)
    assert engine.name == f"{flavour} fp16" and engine.step.warmup_ms > 0
    expected = run_steps(reference(tiny_dir))
    got = run_steps(engine)
    print(f"\n{flavour} fp16 vs pytorch fp32: max logits rel. error {rel_err(got, expected):.2e}")
    assert rel_err(got, expected) < 2e-2
    assert engine.step.length_tokens == 25 + 9 + 2
    assert all(int(np.argmax(g)) == int(np.argmax(e)) for g, e in zip(got, expected, strict=True))


def test_prompt_longer_than_the_profile_is_prefilled_in_chunks(flavour, tiny_dir, tmp_path):
    engine = engine_decoder(tiny_dir, tmp_path, flavour, prefill_max_tokens=16, prefill_opt_tokens=8)
    assert engine.step.prefill_max == 16
    assert rel_err(run_steps(engine, first_len=100), run_steps(reference(tiny_dir), first_len=100)) < 2e-2


def test_second_start_reuses_the_engine_and_runtime_cache(flavour, tiny_dir, tmp_path, monkeypatch):
    first = engine_decoder(tiny_dir, tmp_path, flavour)
    first.step.close()
    from engines.tensorrt import builder

    def no_build(*_a, **_k):
        raise AssertionError("rebuilt on the second start")

    monkeypatch.setattr(builder, "compile_engine", no_build)
    second = engine_decoder(tiny_dir, tmp_path, flavour)
    if flavour == "tensorrt-rtx":
        assert second.step.handle is not None and second.step.handle.loaded  # runtime cache reused
    print(f"\nwarm-up: first start {first.step.warmup_ms:.0f} ms, second {second.step.warmup_ms:.0f} ms")


def test_cuda_graph_decode_matches_plain_decode(flavour, tiny_dir, tmp_path):
    plain = run_steps(engine_decoder(tiny_dir, tmp_path, flavour))
    graphs = engine_decoder(tiny_dir, tmp_path, flavour, cuda_graphs=True)
    first = run_steps(graphs)
    cache = graphs.step.graphs  # full TensorRT's own capture (None on RTX: built-in strategy)
    replays = cache.replays if cache is not None else 0
    again = run_steps(graphs)  # the second pass replays captured shapes
    assert rel_err(first, plain) < 1e-3 and rel_err(again, plain) < 1e-3
    if cache is not None:  # every decode step of the repeated conversation is a replay
        assert cache.replays - replays == 7
