"""PyTorch backend: the ``models/`` decoder on CPU (fp32, eager) or CUDA (fp16/bf16).

On CUDA it replays CUDA graphs by default (:mod:`engines.cuda_graph`); ``cuda_graph="off"``
runs every step eagerly (:class:`TorchStep`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engines.base import Backend, BackendIdentity, StepModel
from engines.cuda_graph import PRECISION, CudaGraphStep, GraphOptions
from engines.driver import DecoderDriver, Detokenizer
from engines.progress import Cache, ProgressCallback, emit_lookup
from models.config import DecoderConfig
from models.decoder import Decoder as DecoderModel
from models.decoder import KVCache
from models.weights import load_decoder

logger = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
CUDA_GRAPH_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class TorchBackendOptions:
    """Where and how the PyTorch backend runs.

    ``device`` / ``dtype`` ``"auto"`` mean CUDA fp16 when a GPU is present, else CPU fp32.
    ``threads`` 0 means one per core, at most 4: more oversubscribes small CPUs.
    ``cuda_graph``: ``"auto"`` replays CUDA graphs when the device is CUDA, ``"on"`` insists
    (an error elsewhere), ``"off"`` runs eagerly. ``compile`` adds ``torch.compile`` to the
    graphs (see :class:`~engines.cuda_graph.GraphOptions`); Inductor then keeps its compiled
    code in ``compile_cache_dir`` (unless ``TORCHINDUCTOR_CACHE_DIR`` is set; None leaves
    Inductor's default under ``/tmp``), so a second start skips most of the compile. Never
    point it into a model folder: the cache holds pickles that Inductor loads, and a model
    folder may come from anyone. ``prefill_buckets`` are the prompt lengths and
    ``decode_windows`` the KV lengths that get their own graph.
    """

    device: str = "auto"
    dtype: str = "auto"
    capacity_tokens: int = 2048
    threads: int = 0
    cuda_graph: str = "auto"
    compile: bool = False
    compile_cache_dir: Path | None = None
    prefill_buckets: tuple[int, ...] = GraphOptions.prefill_buckets
    decode_windows: tuple[int, ...] = GraphOptions.decode_windows
    decode_kernels: bool = False
    tune_kernels: bool = False  # with decode_kernels: time tiles per product at start (GraphOptions)


def resolve_device(options: TorchBackendOptions) -> tuple[torch.device, torch.dtype]:
    """Turn ``auto`` settings into a concrete device and dtype."""
    device = options.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = options.dtype
    if dtype == "auto":
        dtype = "fp16" if device.startswith("cuda") else "fp32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} unknown; use one of {', '.join(DTYPES)} or auto")
    return torch.device(device), DTYPES[dtype]


def use_cuda_graph(options: TorchBackendOptions, device: torch.device) -> bool:
    """Whether ``options.cuda_graph`` asks for CUDA graphs on ``device``.

    Raises:
        ValueError: An unknown mode, or ``"on"`` for a device that is not CUDA.
    """
    mode = options.cuda_graph
    if mode not in CUDA_GRAPH_MODES:
        raise ValueError(f"cuda_graph {mode!r} unknown; use one of {', '.join(CUDA_GRAPH_MODES)}")
    if mode == "on" and device.type != "cuda":
        raise ValueError(f"cuda_graph 'on' needs a CUDA device, not {device}; use auto or off")
    return mode != "off" and device.type == "cuda"


class TorchStep:
    """Eager step function: one forward of ``models.decoder.Decoder`` per call."""

    def __init__(self, model: DecoderModel, capacity_tokens: int) -> None:
        param = next(model.parameters())
        self.model = model
        self.device = param.device
        self.dtype = param.dtype
        self.capacity_tokens = capacity_tokens
        self.cache = KVCache.allocate(model.config, capacity_tokens, dtype=self.dtype, device=self.device)
        self.identity = BackendIdentity(Backend.PYTORCH, self.device.type, PRECISION[self.dtype])
        self.name = self.identity.describe()

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        """Run ``token_ids`` at ``start_pos`` and return the last token's logits (fp32)."""
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        end = start_pos + len(token_ids)
        positions = torch.arange(start_pos, end, device=self.device)
        logits = self.model(ids, positions, self.cache, kv_len=end, last_only=True)
        # .cpu() synchronizes the device, so the caller's clock reads after the GPU finished.
        return logits[0, -1].cpu().numpy()

    def close(self) -> None:
        """Nothing to release beyond memory (the cache goes with the step)."""


def configure_threads(threads: int) -> None:
    """Set torch's intra-op threads; 0 picks min(cores, 4)."""
    count = threads or min(os.cpu_count() or 1, 4)
    torch.set_num_threads(count)


def use_compile_cache(folder: Path) -> None:
    """Point Inductor's on-disk caches at ``folder`` unless the user set ``TORCHINDUCTOR_CACHE_DIR``.

    Inductor reads only this environment variable; it holds compiled graphs (FX graph and
    AOT caches, pickled) and Triton kernels. Importing ``torch._dynamo`` (loading the weights
    does) sets the variable to Inductor's default under ``/tmp`` when it is unset, so that
    value counts as unset. The folder is made private to this user. A process that already
    compiled something keeps its first cache folder.
    """
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is not None and current != _inductor_default_cache_dir():
        logger.info("torch.compile cache: %s (TORCHINDUCTOR_CACHE_DIR)", current)
        return
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder.resolve())
    logger.info("torch.compile cache: %s", folder)


def _inductor_default_cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())


def load_torch_decoder(
    model_dir: Path,
    tokenizer: Detokenizer,
    options: TorchBackendOptions,
    progress: ProgressCallback | None = None,
    *,
    config: DecoderConfig | None = None,
) -> DecoderDriver:
    """Load the model in ``model_dir`` and wrap it in the shared generation driver.

    ``config``: the model's, when the caller read it already (else read here).

    ``progress`` hears whether torch.compile's cache had this model's kernels (with ``compile``).
    """
    configure_threads(options.threads)
    device, dtype = resolve_device(options)
    config = config or DecoderConfig.from_dir(model_dir)
    capacity = min(options.capacity_tokens, config.max_position_embeddings)
    graphs = use_cuda_graph(options, device)
    model = load_decoder(model_dir, dtype=dtype, device=device, config=config)
    step: StepModel
    status = "eager, nothing to cache"
    if graphs:
        status = "CUDA graphs captured at start"
        if options.compile:
            if options.compile_cache_dir is not None:
                use_compile_cache(options.compile_cache_dir)
            cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            warm = cache is not None and any(Path(cache).glob("*"))
            status = "compile cache hit" if warm else "compile cache empty: compiled at start"
            emit_lookup(progress, Cache.COMPILE_CACHE, warm, f"{status}: {cache}")
        graph_options = GraphOptions(
            options.prefill_buckets,
            options.decode_windows,
            capture=True,
            compile=options.compile,
            decode_kernels=options.decode_kernels,
            tune_kernels=options.tune_kernels,
        )
        step = CudaGraphStep(model, capacity, graph_options)
    else:
        if options.decode_kernels:
            raise ValueError("decode_kernels needs CUDA graphs (a CUDA device and cuda_graph auto or on)")
        step = TorchStep(model, capacity)
    logger.info("loaded %s as %s, KV cache %d tokens", model_dir, step.name, capacity)
    return DecoderDriver(step, tokenizer, config.eos_token_ids, status, config.rope_switch_tokens)
