"""A machine with a GPU TensorRT-RTX supports, as far as the app can tell: the CPU stand-in wired in.

Why a stand-in: no TensorRT engine can execute on this project's machines (no GPU in CI,
TensorRT-RTX refuses the H200; ``tests/helpers/trt_standin.py``). :func:`install` makes ``--backend
auto`` see an RTX 4090 and TensorRT-RTX (a patched probe and ``gpu_info``), runs the real
:class:`~engines.tensorrt.runtime.TensorRTStep` over :class:`~tests.trt_standin.FakeTensorRT`
and :class:`~tests.trt_standin.FakeCuda`, and makes the build step write a stand-in engine
blob (the exported ONNX graph and the profile shapes) instead of calling the TensorRT-RTX
builder: the real builder works on this CPU, but its engines cannot execute here. Everything
around the build (export, cache entry, record, lock, rebuild decisions, warm-up, the gate)
is the real code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import PreTrainedTokenizerFast

from assistant.config import DecoderSettings, ModelSettings, Settings
from engines import selection, verify
from engines.selection import Probe
from engines.tensorrt import backend, builder, cuda_mem
from engines.tensorrt.cuda_mem import GpuInfo
from engines.tensorrt.flavour import Flavour
from engines.tensorrt.options import EngineOptions
from tests.helpers import trt_standin
from tests.helpers.families import COMMON, qwen2

GPU = GpuInfo("stand-in RTX 4090", (8, 9), 24 << 30)
# fp32: the stand-in runs the fp32 export, so the gate compares like with like.
ENGINE = EngineOptions(
    precision="fp32",
    prefill_opt_tokens=8,
    prefill_max_tokens=32,
    context_opt_tokens=64,
    context_max_tokens=256,
)
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)


def tiny_chat_model(folder: Path) -> Path:
    """A tiny random-weight Qwen2 with a word-level tokenizer that knows the gate's dialogues."""
    torch.manual_seed(0)
    texts = (*verify.DIALOGUE, verify.SYSTEM_PROMPT, "system user assistant")
    words = sorted({w for text in texts for w in re.findall(r"\w+|[^\w\s]+", text)})
    tokens = ["<unk>", "<eos>", *words]
    tokens += [f"w{i}" for i in range(COMMON["vocab_size"] - len(tokens))]
    tokenizer = Tokenizer(WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    model = qwen2()
    model.config.eos_token_id = 1
    model.save_pretrained(folder)
    return folder


@dataclass
class Machine:
    """The stand-in GPU: its fake CUDA and TensorRT, and the engine builds made so far.

    ``build_blob`` replaces what the next builds write (a damaged engine, say); with
    ``build_error`` they fail with that message instead.
    """

    cuda: trt_standin.FakeCuda
    trt: trt_standin.FakeTensorRT
    builds: list[Path] = field(default_factory=list)
    build_blob: bytes | None = None
    build_error: str | None = None

    def idle(self) -> bool:
        """No GPU memory, stream or graph is held (every engine was closed)."""
        return self.cuda.live() == {"device": 0, "pinned": 0, "streams": 0, "graphs": 0}


def install(monkeypatch: pytest.MonkeyPatch, *, tensorrt: bool = True) -> Machine:
    """Make this process see :data:`GPU` with TensorRT-RTX (``tensorrt=False``: none installed)."""
    cuda = trt_standin.FakeCuda()
    trt = trt_standin.FakeTensorRT(cuda)
    machine = Machine(cuda, trt)
    flavour = Flavour("tensorrt-rtx", trt, "stand-in")
    found = Probe(None, "stand-in" if tensorrt else None, GPU, False, True)
    monkeypatch.setattr(cuda_mem, "cudart", lambda: cuda)
    monkeypatch.setattr(selection, "probe", lambda: found)
    monkeypatch.setattr(backend, "find_gpu", lambda: GPU)
    monkeypatch.setattr(backend, "load_flavour", lambda name: flavour)
    monkeypatch.setattr(builder, "load_flavour", lambda name: flavour)

    def stand_in_build(flavour: Flavour, exported: Any, options: EngineOptions, *rest: Any) -> bytes:
        machine.builds.append(exported.path)
        if machine.build_error is not None:
            raise builder.EngineBuildError(machine.build_error)
        if machine.build_blob is not None:
            return machine.build_blob
        return trt_standin.engine_blob(exported.path, options, flavour.decode_profile(options.decode_profile))

    monkeypatch.setattr(builder, "compile_engine", stand_in_build)
    return machine


def settings(store: Path, model: Path, backend_name: str = "auto", **gate: Any) -> Settings:
    """Settings for ``model`` with its engines under ``store``, one CPU thread, :data:`ENGINE`."""
    return Settings(
        models=ModelSettings(store_dir=store, llm=str(model)),
        decoder=DecoderSettings(backend=backend_name, threads=1, context_tokens=256),
        engine=ENGINE,
        gate=verify.GateOptions(**gate),
    )
