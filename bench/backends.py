"""The backends ``bench/decoder.py`` times, each behind one ``generate(ids, n) -> Timeline``.

A backend is built from a model folder; with ``--random-weights`` that folder is written first
(seeded random weights of a real shape, saved as safetensors). Every runner produces exactly
``n`` new tokens, ignoring EOS, so all rows do the same work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from time import monotonic_ns as now
from typing import Any, Protocol

import torch

from engines.base import GenerationOptions
from engines.cuda_graph import CudaGraphStep, GraphOptions
from engines.driver import DecoderDriver
from engines.torch_backend import TorchBackendOptions, load_torch_decoder
from models.config import DecoderConfig
from models.weights import load_decoder

# Hugging Face config.json fields of the real models (what matters for timing: the shapes).
_LLAMA = dict(model_type="llama", tie_word_embeddings=True, rms_norm_eps=1e-5)
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        _LLAMA,
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        eos_token_id=0,
    ),
    "smollm2-135m": dict(
        _LLAMA,
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        eos_token_id=2,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2",
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        eos_token_id=151645,
    ),
    "llama-3.2-1b": dict(
        _LLAMA,
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        eos_token_id=128009,
        rope_scaling=dict(
            rope_type="llama3",
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
    ),
}


def write_random_model(shape: str, folder: Path, device: torch.device) -> None:
    """Save seeded random weights of ``shape`` (fp32 safetensors + config.json) in ``folder``."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    hf = SHAPES[shape]
    config = transformers.AutoConfig.for_model(**hf)
    torch.manual_seed(0)
    with torch.device(device):  # initialising a 1B model on the GPU takes a second, not ten
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)


@dataclass
class Timeline:
    """One request: when it was submitted, when each new token id reached the host, when it ended."""

    t_submit_ns: int
    token_ns: list[int]
    token_ids: list[int]
    t_done_ns: int


class Runner(Protocol):
    """A backend under test."""

    name: str

    def generate(self, ids: list[int], new_tokens: int) -> Timeline:
        """Run one request from an empty cache and stamp every new token."""
        ...


class NoTokenizer:
    """Stands in for a tokenizer with random weights: ids become letters."""

    eos_token_id = None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(65 + i % 26) for i in ids)


class DriverRunner:
    """Our backends: a :class:`DecoderDriver`, timed by its own ``GenerationStats`` stamps."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.name = driver.name

    def generate(self, ids: list[int], new_tokens: int) -> Timeline:
        d = self.driver
        d.reset()
        eos, d.eos_token_ids = d.eos_token_ids, frozenset()  # exactly new_tokens every run
        try:
            gen = d.generate(ids, GenerationOptions(max_new_tokens=new_tokens))
            chunks = [c for c in gen if c.token_id >= 0]
        finally:
            d.eos_token_ids = eos
        s = gen.stats
        return Timeline(s.t_submit_ns, [c.t_ns for c in chunks], [c.token_id for c in chunks], s.t_done_ns)


class Stamps:
    """A generate() streamer that records when each new token id reaches the host."""

    def __init__(self) -> None:
        self.prompt_seen = False
        self.t_ns: list[int] = []
        self.ids: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        if self.prompt_seen:  # generate's first put is the prompt itself; later ones are on the CPU
            self.t_ns.append(now())
            self.ids.append(int(value.reshape(-1)[0]))
        self.prompt_seen = True

    def end(self) -> None:
        pass


class HFRunner:
    """transformers ``generate`` (greedy), timed by a streamer; min_new_tokens masks EOS.

    ``static``: a static KV cache, which makes ``generate`` compile the decoding forward
    (``torch.compile`` mode ``reduce-overhead``: CUDA graphs) on CUDA; prefill stays eager.
    """

    def __init__(self, model: Any, device: torch.device, static: bool = False) -> None:
        self.model = model
        self.device = device
        self.extra: dict[str, Any] = {"cache_implementation": "static"} if static else {}
        precision = {torch.float32: "fp32", torch.float16: "fp16"}.get(model.dtype, str(model.dtype))
        kind = " static cache + compile" if static else ""
        self.name = f"transformers generate{kind} {device.type} {precision}"

    def generate(self, ids: list[int], new_tokens: int) -> Timeline:
        x, stamps = torch.tensor([ids], dtype=torch.long, device=self.device), Stamps()
        extra = {"min_new_tokens": new_tokens} if new_tokens > 1 else {}
        t0 = now()
        self.model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=new_tokens,
            do_sample=False,
            streamer=stamps,
            **extra,
            **self.extra,
        )
        return Timeline(t0, stamps.t_ns, stamps.ids, now())


@dataclass(frozen=True)
class Context:
    """What every backend is built from."""

    model_dir: Path
    tokenizer: Any
    device: torch.device
    capacity_tokens: int
    threads: int


def _ours(
    dtype: str, cuda_graph: str, compile: bool = False, kernels: bool = False, tune: bool = False
) -> Callable[[Context], Runner]:
    def build(ctx: Context) -> Runner:
        options = TorchBackendOptions(
            device=str(ctx.device),
            dtype=dtype,
            capacity_tokens=ctx.capacity_tokens,
            threads=ctx.threads,
            cuda_graph=cuda_graph,
            compile=compile,
            decode_kernels=kernels,
            tune_kernels=tune,
        )
        return DriverRunner(load_torch_decoder(ctx.model_dir, ctx.tokenizer, options))

    return build


def _static(ctx: Context) -> Runner:
    """The CUDA-graph step without capture (eager, static shapes): the graph path's math on any device."""
    config = DecoderConfig.from_dir(ctx.model_dir)
    model = load_decoder(ctx.model_dir, dtype=torch.float32, device=ctx.device)
    step = CudaGraphStep(model, ctx.capacity_tokens, GraphOptions(capture=False))
    return DriverRunner(DecoderDriver(step, ctx.tokenizer, config.eos_token_ids))


def _transformers(ctx: Context) -> Runner:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(ctx.model_dir, dtype=torch.float32)
    return HFRunner(model.to(ctx.device).eval(), ctx.device)


def _transformers_static(ctx: Context) -> Runner:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(ctx.model_dir, dtype=torch.float16)
    return HFRunner(model.to(ctx.device).eval(), ctx.device, static=True)


def _onnxruntime(ctx: Context) -> Runner:
    from engines.onnxruntime_backend import OnnxRuntimeOptions, load_onnxruntime_decoder

    # Fill the options we know by name; whatever else the backend has keeps its default.
    wanted: dict[str, Any] = {"capacity_tokens": ctx.capacity_tokens, "threads": 0}
    known = {f.name for f in dataclasses.fields(OnnxRuntimeOptions)}
    options = OnnxRuntimeOptions(**{k: v for k, v in wanted.items() if k in known})
    return DriverRunner(load_onnxruntime_decoder(ctx.model_dir, ctx.tokenizer, options))


@dataclass(frozen=True)
class Backend:
    """One row of the table: what it is, where it can run, how to build it."""

    describe: str
    needs_cuda: bool
    build: Callable[[Context], Runner]
    cpu_only: bool = False


BACKENDS: dict[str, Backend] = {
    "transformers": Backend(
        "transformers generate, eager fp32 (the article's 'PyTorch FP32')", False, _transformers
    ),
    "eager-fp32": Backend("ours, eager fp32", False, _ours("fp32", "off")),
    "eager-fp16": Backend("ours, eager fp16", True, _ours("fp16", "off")),
    "graph-fp16": Backend("ours, CUDA graphs fp16", True, _ours("fp16", "on")),
    "graph-bf16": Backend("ours, CUDA graphs bf16", True, _ours("bf16", "on")),
    "graph-compile-fp16": Backend("ours, CUDA graphs + torch.compile fp16", True, _ours("fp16", "on", True)),
    "graph-kernels-fp16": Backend(
        "ours, CUDA graphs fp16, Triton decode kernels", True, _ours("fp16", "on", kernels=True)
    ),
    "graph-kernels-tuned-fp16": Backend(
        "ours, CUDA graphs fp16, Triton decode kernels, tiles autotuned",
        True,
        _ours("fp16", "on", kernels=True, tune=True),
    ),
    "graph-kernels-compile-fp16": Backend(
        "ours, CUDA graphs fp16, Triton decode kernels, compiled prefill",
        True,
        _ours("fp16", "on", True, kernels=True),
    ),
    "transformers-static-compile": Backend(
        "transformers generate fp16, static cache + torch.compile (reduce-overhead)",
        True,
        _transformers_static,
    ),
    "static-fp32": Backend("ours, the graph step without capture, fp32 (checks its math)", False, _static),
    "onnxruntime": Backend(
        "onnxruntime CPU (engines.onnxruntime_backend)", False, _onnxruntime, cpu_only=True
    ),
}
AUTO_CUDA = (
    "transformers",
    "eager-fp32",
    "eager-fp16",
    "graph-fp16",
    "graph-bf16",
    "graph-compile-fp16",
    "onnxruntime",
)
AUTO_CPU = ("eager-fp32", "transformers", "onnxruntime")  # ours first: its chat sets the turn-2 ids
SMOKE = ("transformers", "eager-fp32", "static-fp32")


def unavailable(key: str, device: torch.device) -> str | None:
    """Why backend ``key`` cannot run here (``None``: it can)."""
    backend = BACKENDS[key]
    if backend.needs_cuda and device.type != "cuda":
        return f"{key}: skipped, needs a CUDA device (running on {device})"
    if key == "onnxruntime":
        try:
            import engines.onnxruntime_backend  # noqa: F401
        except ImportError as e:
            return f"onnxruntime: skipped, engines.onnxruntime_backend is not importable ({e})"
    return None
