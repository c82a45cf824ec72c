"""The ONNX export and ONNX Runtime, its CPU twin, against the PyTorch backend (real SmolLM2).

SmolLM2 is exported once per test session (fp32 and fp16, shared with the TensorRT tests) into
a temporary store whose model folder links to the real weights. Cache mechanics (corruption,
external data, stale exports) and the architecture variants SmolLM2 lacks (Qwen2 biases,
Llama 3 RoPE scaling) use tiny random-weight models, which export in about a second.
"""

from __future__ import annotations

import json
import logging
import os
import threading

import numpy as np
import onnx
import pytest
import torch
from onnxruntime import InferenceSession

from assistant.config import DecoderSettings, ModelSettings
from assistant.stages.llm import load_llm
from bench.corpus import PARITY_PROMPTS as PROMPTS
from engines import onnx_export, onnx_trace
from engines.base import StopReason
from engines.onnx_export import (
    INPUT_IDS,
    LAST_LOGITS,
    POSITION_IDS,
    ExportOptions,
    check_export,
    export_decoder,
    past_names,
    present_names,
    weights_sha256,
)
from engines.onnxruntime_backend import OnnxRuntimeOptions, load_onnxruntime_decoder, session_options
from engines.onnxruntime_graph import ORT_GRAPH_FILE, graph_to_load
from engines.torch_backend import TorchBackendOptions, load_torch_decoder
from store.bundled import DEFAULT_LLM
from tests.helpers.cli import run_cli
from tests.helpers.families import llama3_scaled, qwen2
from tests.helpers.llm import greedy, make_dialogue, run_reply

# Shapes and ops that TensorRT's parser rejects or that make shapes depend on data.
FORBIDDEN_OPS = {"NonZero", "Unique", "Loop", "If", "Scan", "ScatterND", "ScatterElements"}


@pytest.fixture(scope="module")
def exports(smollm2_export):
    """fp32 and fp16 exports of the real SmolLM2 (``onnx_model_dir`` and the export are in conftest)."""
    return {dtype: smollm2_export(dtype) for dtype in ("fp32", "fp16")}


def ort_decoder(model_dir, tokenizer, dtype, capacity_tokens=2048):
    options = OnnxRuntimeOptions(dtype=dtype, threads=2, capacity_tokens=capacity_tokens)
    return load_onnxruntime_decoder(model_dir, tokenizer, options)


@pytest.fixture(scope="module")
def ort32(exports, onnx_model_dir, tokenizer):
    return ort_decoder(onnx_model_dir, tokenizer, "fp32")


@pytest.fixture(scope="module")
def ort16(exports, onnx_model_dir, tokenizer):
    return ort_decoder(onnx_model_dir, tokenizer, "fp16")


def rel_err(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


def teacher_forced(decoder, ids, tokens):
    """Logits of ``decoder`` at each step when fed ``tokens`` (the reference continuation)."""
    decoder.reset()
    out = [decoder.prefill(ids)]
    out += [decoder.decode(t) for t in tokens]
    return out


@pytest.fixture(scope="module")
def reference(pytorch_greedy):
    """The PyTorch backend's greedy continuation and logits of every prompt (conftest: run once)."""
    return pytorch_greedy


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_64_tokens_identical_to_pytorch(ort32, reference, prompt):
    ids, expected, _ = reference[prompt]
    tokens, _ = greedy(ort32, ids)
    assert tokens == expected


def test_fp32_logits_match_pytorch_within_1e_4(ort32, reference):
    errors = []
    for ids, tokens, expected in reference.values():
        got = teacher_forced(ort32, ids, tokens)
        errors += [rel_err(g, e) for g, e in zip(got, expected, strict=True)]
    worst, mean = max(errors), float(np.mean(errors))
    print(f"\nfp32 onnxruntime vs pytorch: logits rel. error max {worst:.2e}, mean {mean:.2e}")
    assert max(errors) < 1e-4


def test_fp16_graph_on_cpu_stays_close_and_mostly_agrees(ort16, reference):
    errors, agree, total = [], 0, 0
    for ids, tokens, expected in reference.values():
        got = teacher_forced(ort16, ids, tokens)
        errors += [rel_err(g, e) for g, e in zip(got, expected, strict=True)]
        # Teacher-forced top-1 agreement: does fp16 pick the fp32 token at every step?
        eos = sorted(ort16.eos_token_ids)
        for g, t in zip(got, tokens, strict=False):
            g = g.copy()
            g[eos] = -np.inf
            agree += int(g.argmax()) == t
            total += 1
    print(
        f"\nfp16 graph on onnxruntime-cpu vs pytorch fp32: logits rel. error max {max(errors):.2e}, "
        f"mean {np.mean(errors):.2e}; teacher-forced greedy agreement {agree}/{total} ({agree / total:.1%})"
    )
    assert max(errors) < 1e-2
    assert agree / total >= 0.95


def test_three_turn_conversation_with_prefix_reuse_matches_pytorch(ort32, decoder, tokenizer):
    questions = ["What is the capital of France?", "And what is it famous for?", "Thanks. Bye!"]

    def conversation(backend):
        backend.reset()
        dialogue = make_dialogue(backend, tokenizer, max_new_tokens=40)
        out = []
        for q in questions:
            reply, ids = run_reply(dialogue, q)
            out.append((ids, reply.stats.reused_tokens, reply.stats.prefilled_tokens))
        return out

    got, expected = conversation(ort32), conversation(decoder)
    assert got == expected
    assert all(reused > 0 for _, reused, _ in got[1:])


def test_streaming_and_cancellation_through_the_shared_driver(ort32, tokenizer):
    ort32.reset()
    dialogue = make_dialogue(ort32, tokenizer, max_new_tokens=60)
    cancel = threading.Event()
    reply = dialogue.ask("Tell me a long story about a dragon.", cancel)
    seen = []
    for chunk in reply:
        seen.append(chunk)
        if len(seen) == 3:
            cancel.set()
    assert len(seen) == 3 and reply.stats.stop_reason is StopReason.CANCELLED
    assert "".join(c.text for c in seen) == reply.stats.text != ""


def test_exported_graph_has_the_documented_contract(exports, onnx_model_dir):
    layers = 30
    for dtype, exported in exports.items():
        onnx.checker.check_model(str(exported.path))
        model = onnx.load(str(exported.path), load_external_data=False)
        assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
        cache_type = {"fp32": onnx.TensorProto.FLOAT, "fp16": onnx.TensorProto.FLOAT16}[dtype]

        def spec(values):
            return [
                (
                    v.name,
                    v.type.tensor_type.elem_type,
                    [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
                )
                for v in values
            ]

        inputs, outputs = spec(model.graph.input), spec(model.graph.output)
        int64 = onnx.TensorProto.INT64
        assert inputs[:2] == [
            ("input_ids", int64, ["batch", "sequence"]),
            ("position_ids", int64, ["batch", "sequence"]),
        ]
        assert inputs[2:] == [(n, cache_type, ["batch", 3, "past_sequence", 64]) for n in past_names(layers)]
        assert outputs[0] == ("last_logits", onnx.TensorProto.FLOAT, ["batch", 49152])
        assert outputs[1:] == [
            (n, cache_type, ["batch", 3, "total_sequence", 64]) for n in present_names(layers)
        ]
        assert not {n.op_type for n in model.graph.node} & FORBIDDEN_OPS
        meta = {p.key: p.value for p in model.metadata_props}
        assert meta["assistant.weights_sha256"] == weights_sha256(onnx_model_dir)
        assert meta["assistant.dtype"] == dtype and meta["assistant.opset"] == "17"
        assert meta["assistant.model_id"] == DEFAULT_LLM
        assert meta["assistant.cache_contract"] == onnx_export.CONTRACT
        assert "torch" in meta["assistant.exporter"] and meta["assistant.onnx_version"] == onnx.__version__
        assert exported.metadata == meta
        # The tied embedding is stored once: the file is no larger than the weights.
        weights = (onnx_model_dir / "model.safetensors").stat().st_size
        assert exported.size_bytes < weights * (1.01 if dtype == "fp32" else 0.51)


def test_second_export_is_a_cache_hit_without_running_the_exporter(exports, onnx_model_dir, monkeypatch):
    def no_export(*_args):
        raise AssertionError("the exporter ran on a cache hit")

    monkeypatch.setattr(onnx_trace, "trace_decoder", no_export)
    for dtype, first in exports.items():
        mtime = first.path.stat().st_mtime_ns
        again = export_decoder(onnx_model_dir, ExportOptions(dtype=dtype))
        assert again.cache_hit and again.path == first.path and again.export_s == 0
        assert first.path.stat().st_mtime_ns == mtime


def test_cli_engine_export_reports_the_cache_hit_and_onnxruntime_chat_answers(exports, onnx_model_dir):
    store = str(onnx_model_dir.parent.parent)
    out = run_cli("engine", "export", "--store", store, "--dtype", "fp16")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("cache hit: ") and str(exports["fp16"].path) in out.stdout
    out = run_cli("engine", "export", "--store", store, "--dtype", "bf16")
    assert out.returncode == 2 and "fp32 or fp16" in out.stderr and "Traceback" not in out.stderr
    out = run_cli(
        "chat", "--store", store, "--backend", "onnxruntime", "--max-new-tokens", "24",
        stdin="What is the capital of France?\n",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "onnxruntime-cpu fp32" in out.stdout and "Paris" in out.stdout


def test_onnxruntime_backend_refuses_a_gpu_device(onnx_model_dir):
    models = ModelSettings(store_dir=onnx_model_dir.parent.parent)
    with pytest.raises(ValueError, match="runs on the CPU"):
        load_llm(models, DecoderSettings(backend="onnxruntime", device="cuda"))


# Tiny random-weight models: cache mechanics and architecture variants.


@pytest.fixture
def tiny_dir(tmp_path):
    torch.manual_seed(0)
    qwen2().save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def tiny_prompts():
    rng = np.random.default_rng(0)
    first = rng.integers(0, 300, 40).tolist()
    # Shares 25 tokens with the first prompt: the cache is cut back to them, then extended.
    second = first[:25] + rng.integers(0, 300, 9).tolist()
    return first, second


def run_steps(decoder):
    """Prefill, five decode steps, then a prompt sharing a prefix (truncates the cache)."""
    first, second = tiny_prompts()
    decoder.reset()
    out = [decoder.prefill(first)]
    out += [decoder.decode(t) for t in (5, 17, 250, 3, 42)]
    out.append(decoder.prefill(second))
    out += [decoder.decode(t) for t in (8, 9)]
    return out


@pytest.mark.parametrize("build", [qwen2, llama3_scaled])
def test_variants_through_onnxruntime_match_pytorch_including_prefix_cut(build, tmp_path, tokenizer):
    torch.manual_seed(0)
    reference = build()
    if build is qwen2:
        for layer in reference.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.data.normal_()
    reference.save_pretrained(tmp_path)
    torch_options = TorchBackendOptions(device="cpu", dtype="fp32", capacity_tokens=128, threads=2)
    expected = run_steps(load_torch_decoder(tmp_path, tokenizer, torch_options))
    ort = ort_decoder(tmp_path, tokenizer, "fp32", capacity_tokens=128)
    got = run_steps(ort)
    assert ort.step.length_tokens == len(tiny_prompts()[1]) + 2
    assert max(rel_err(g, e) for g, e in zip(got, expected, strict=True)) < 1e-4


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "no record"])
def test_corrupt_cached_export_is_detected_and_exported_again(tiny_dir, damage, caplog):
    first = export_decoder(tiny_dir, ExportOptions())
    assert not first.cache_hit and check_export(first.path.parent) is None
    data = bytearray(first.path.read_bytes())
    if damage == "flipped byte":
        data[len(data) // 2] ^= 0xFF
        first.path.write_bytes(bytes(data))
    elif damage == "truncated":
        first.path.write_bytes(bytes(data[: len(data) // 3]))
    else:  # an export interrupted before its record was written
        (first.path.parent / onnx_export.SIDECAR).unlink()
    assert check_export(first.path.parent) is not None
    with caplog.at_level(logging.WARNING, logger="engines.onnx_export"):
        again = export_decoder(tiny_dir, ExportOptions())
    assert not again.cache_hit and again.notice and "exporting again" in caplog.text
    assert check_export(again.path.parent) is None
    assert export_decoder(tiny_dir, ExportOptions()).cache_hit


def test_the_weights_sit_beside_the_graph_and_are_checked_like_it(tiny_dir, tokenizer):
    """External data for every model: loads faster than a graph holding its weights, and works
    above protobuf's 2 GB."""
    exported = export_decoder(tiny_dir, ExportOptions(dtype="fp16"))
    data = exported.path.parent / onnx_export.DATA_FILE
    assert data.stat().st_size > exported.path.stat().st_size
    record = json.loads((exported.path.parent / onnx_export.SIDECAR).read_text())
    assert set(record["files"]) == {onnx_export.GRAPH_FILE, onnx_export.DATA_FILE, ORT_GRAPH_FILE}
    onnx.checker.check_model(str(exported.path))
    decoder = ort_decoder(tiny_dir, tokenizer, "fp16", capacity_tokens=64)
    assert np.isfinite(decoder.prefill(list(range(10)))).all()
    with data.open("r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    assert "sha256" in (check_export(exported.path.parent) or "")


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_onnx_runtimes_optimized_graph_is_kept_and_computes_the_same_logits_bit_for_bit(exports, dtype):
    """The graph ONNX Runtime optimized once at export (engines/onnxruntime_graph.py) is what the
    backend loads; it holds no weights of its own and gives the plain graph's logits exactly."""
    folder = exports[dtype].path.parent
    record = json.loads((folder / onnx_export.SIDECAR).read_text())
    assert set(record["files"]) == {onnx_export.GRAPH_FILE, onnx_export.DATA_FILE, ORT_GRAPH_FILE}
    assert graph_to_load(folder) == (folder / ORT_GRAPH_FILE, "optimized graph")
    assert (folder / ORT_GRAPH_FILE).stat().st_size < (folder / onnx_export.DATA_FILE).stat().st_size / 100
    options = session_options(OnnxRuntimeOptions(dtype=dtype, threads=2))
    plain, optimized = (
        InferenceSession(str(folder / name), options, providers=["CPUExecutionProvider"])
        for name in (onnx_export.GRAPH_FILE, ORT_GRAPH_FILE)
    )
    meta = {
        k: int(exports[dtype].metadata[f"assistant.{k}"]) for k in ("num_layers", "num_kv_heads", "head_dim")
    }
    empty = np.zeros(
        (1, meta["num_kv_heads"], 0, meta["head_dim"]), np.float32 if dtype == "fp32" else np.float16
    )
    feeds = {
        "input_ids": np.array([[1, 504, 3458, 282, 4649, 314, 17, 28, 8]], np.int64),
        "position_ids": np.arange(9, dtype=np.int64)[None],
        **dict.fromkeys(past_names(meta["num_layers"]), empty),
    }
    for expected, got in zip(plain.run(None, feeds), optimized.run(None, feeds), strict=True):
        assert np.array_equal(expected, got)


def test_an_optimized_graph_of_another_onnx_runtime_is_not_loaded(tiny_dir, tokenizer):
    exported = export_decoder(tiny_dir, ExportOptions())
    folder = exported.path.parent
    graph = onnx.load(str(folder / ORT_GRAPH_FILE), load_external_data=False)
    props = {p.key: p.value for p in graph.metadata_props}
    onnx.helper.set_model_props(graph, {**props, "assistant.onnxruntime_version": "1.0.0"})
    onnx.save(graph, str(folder / ORT_GRAPH_FILE))
    path, why = graph_to_load(folder)
    assert path == exported.path and "from onnxruntime 1.0.0" in why
    (folder / ORT_GRAPH_FILE).unlink()
    assert graph_to_load(folder)[0] == exported.path


def test_changed_weights_get_a_new_export_and_the_stale_one_is_removed(tiny_dir):
    first = export_decoder(tiny_dir, ExportOptions())
    torch.manual_seed(1)
    qwen2().save_pretrained(tiny_dir)  # new weights in the same folder
    os.utime(tiny_dir / "model.safetensors")
    second = export_decoder(tiny_dir, ExportOptions())
    assert not second.cache_hit and second.path != first.path
    assert not first.path.parent.exists()
    assert second.metadata["assistant.weights_sha256"] == weights_sha256(tiny_dir)


def test_the_export_batches_rows_of_one_length_as_each_alone(exports, tokenizer):
    """The batch axis (docs/serving.md: what a TensorRT profile over it would serve): two prompts of
    equal length in one run give each one's batch-1 logits; rows at different positions are not
    in this contract (one past length for every row)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(exports["fp32"].path), providers=["CPUExecutionProvider"])
    layers = int(exports["fp32"].metadata["assistant.num_layers"])
    kv, head = (int(exports["fp32"].metadata[f"assistant.{k}"]) for k in ("num_kv_heads", "head_dim"))
    rows = [tokenizer.encode(p, add_special_tokens=False)[:5] for p in PROMPTS[:2]]

    def run(ids: list[list[int]]) -> np.ndarray:
        batch, length = len(ids), len(ids[0])
        empty = np.zeros((batch, kv, 0, head), np.float32)
        feeds = {INPUT_IDS: np.array(ids, np.int64), POSITION_IDS: np.tile(np.arange(length), (batch, 1))}
        feeds |= {name: empty for name in past_names(layers)}
        return session.run([LAST_LOGITS], feeds)[0]

    together = run(rows)
    for i, ids in enumerate(rows):
        assert rel_err(together[i], run([ids])[0]) < 1e-5
