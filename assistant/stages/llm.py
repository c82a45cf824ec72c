"""Resolve the configured LLM to a folder, load its tokenizer and build the decoder backend."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from assistant.config import DecoderSettings, ModelSettings
from assistant.stages.tokenizer import load_tokenizer
from engines.driver import DecoderDriver
from engines.progress import EngineProgress, ProgressCallback, Stage, emit
from engines.tensorrt.options import EngineOptions
from engines.verify import GateOptions
from store.bundled import ModelStore
from store.gguf_import import convert_into_store, stored_gguf_dir
from store.records import repair_hints
from store.resolve import ResolvedLlm, resolve_llm, resolve_llm_path

if TYPE_CHECKING:
    from engines.selection import Probe

logger = logging.getLogger(__name__)

BACKENDS = ("pytorch", "onnxruntime", "tensorrt", "tensorrt-rtx", "auto")


def resolve_llm_dir(settings: ModelSettings, progress: ProgressCallback | None = None) -> Path:
    """Folder of the configured LLM (:func:`store.resolve.resolve_llm_path`), checked.

    A GGUF is converted once into the store (:mod:`store.gguf_import`); ``progress`` hears
    that as ``convert`` events (``cached`` when it was converted already).

    Raises:
        ModelNotFound: Nothing usable under that name, with the command that fixes it.
        CorruptModel, UnsupportedModel, FetchError: A GGUF that cannot be converted, or a store
            that cannot take it (each names the fix).
    """
    store = ModelStore(settings.store_dir)
    return resolve_llm_path(store, settings.llm, lambda gguf, s: _gguf_dir(gguf, s, progress))


def resolve_llm_config(settings: ModelSettings, progress: ProgressCallback | None = None) -> ResolvedLlm:
    """:func:`resolve_llm_dir` with its ``config.json`` read and its sizes checked against the weights.

    For the commands that use the folder before :func:`load_llm` (the context check's tokenizer,
    ``engine``, ``serve``): a config that does not fit its weights is named before anything
    trips on it (:func:`models.shapes.check_sizes`).

    Raises:
        ModelNotFound, CorruptModel, UnsupportedModel, FetchError: As :func:`resolve_llm_dir`.
        InvalidConfig: ``config.json`` is unreadable, or its sizes do not fit the weights.
    """
    store = ModelStore(settings.store_dir)
    return resolve_llm(store, settings.llm, lambda gguf, s: _gguf_dir(gguf, s, progress))


def _gguf_dir(gguf: Path, store: ModelStore, progress: ProgressCallback | None) -> Path:
    """The store folder of ``gguf``, converting it first if needed.

    ``progress`` hears a ``cached`` event when it was converted before, else ``convert``
    events (``step`` of 100) while it converts.
    """

    def step(what: str, fraction: float) -> None:
        logger.info("%s: %s", gguf.name, what)
        if progress is not None:
            done = fraction >= 1.0
            event = EngineProgress(Stage.CONVERT, what, "convert GGUF", "", round(100 * fraction), 100, done)
            progress(dataclasses.replace(event, t_ns=time.monotonic_ns()))

    stored = stored_gguf_dir(gguf, store, step)
    if stored is not None:
        emit(progress, Stage.CACHED, f"{gguf.name}: converted already ({stored.name})")
        return stored
    return convert_into_store(gguf, store, step)


def onnx_dtype(dtype: str) -> str:
    """The ONNX export dtype for a ``decoder.dtype`` setting: ``auto`` is fp32 (the CPU twin)."""
    if dtype == "auto":
        return "fp32"
    if dtype not in ("fp32", "fp16"):
        raise ValueError(f"ONNX graphs are exported in fp32 or fp16, not {dtype!r}")
    return dtype


def engine_cache_dir(models: ModelSettings) -> Path:
    """Where TensorRT engines and their tuning caches are kept (``<store>/engines``)."""
    return Path(models.store_dir).expanduser() / "engines"


def compile_cache_dir(models: ModelSettings, model_dir: Path) -> Path:
    """Where ``torch.compile`` keeps this model's compiled code: ``<store>/torch-compile/<name>-<key>``.

    In the store, never in the model folder (Inductor loads the pickles it finds in its
    cache, and a model folder may be a download); keyed by the model folder's real path, so
    two models never share one.
    """
    real = model_dir.expanduser().resolve()
    key = hashlib.sha256(str(real).encode()).hexdigest()[:16]
    return Path(models.store_dir).expanduser() / "torch-compile" / f"{real.name}-{key}"


def load_llm(
    models: ModelSettings,
    decoder: DecoderSettings,
    engine: EngineOptions | None = None,
    *,
    gate: GateOptions | None = None,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    notice: Callable[[str], None] | None = None,
    store: ModelStore | None = None,
) -> tuple[DecoderDriver, Any]:
    """Build the configured decoder backend and its tokenizer.

    ``backend = "auto"`` prefers TensorRT (:func:`resolve_auto_backend`): the engine is built
    or reused, warmed up and checked by the accuracy gate before its first use. When any of
    that fails, the failure is logged and said once through ``notice``, kept in the decoder's
    ``fallback``, and the next backend loads (PyTorch, with CUDA graphs on a GPU). An explicit
    TensorRT backend raises instead.

    Args:
        models: Which model, and the store.
        decoder: Backend, device, precision, context.
        engine: TensorRT build options.
        gate: The accuracy gate of an engine ``auto`` picked (``[gate]`` settings).
        progress: Hears of ONNX exports, engine cache hits, build phases and the gate (any thread).
        cancel: Set it to stop a TensorRT engine build at its next step.
        notice: Hears, in one line, why ``auto`` did not use the TensorRT it picked.
        store: The start's model store (the caller's, so one is built a start); else made here.
    """
    store = store or ModelStore(models.store_dir)
    llm = resolve_llm(store, models.llm, lambda gguf, s: _gguf_dir(gguf, s, progress))
    with repair_hints(llm.path):  # models/ names the damaged file; the store adds the fix
        return _load_llm(llm, models, decoder, engine, gate, progress, cancel, notice)


def _load_llm(
    llm: ResolvedLlm,
    models: ModelSettings,
    decoder: DecoderSettings,
    engine: EngineOptions | None,
    gate: GateOptions | None,
    progress: ProgressCallback | None,
    cancel: threading.Event | None,
    notice: Callable[[str], None] | None,
) -> tuple[DecoderDriver, Any]:
    """:func:`load_llm` for the resolved LLM (its config read once, passed to the backend)."""
    model_dir, config = llm.path, llm.config  # a damaged config.json named before the tokenizer trips on it
    tokenizer = load_tokenizer(model_dir)
    if decoder.server:
        from engines.serving.remote import RemoteDecoder
        from engines.serving.wire import tokenizer_sha256

        sha = tokenizer_sha256(model_dir)
        return RemoteDecoder(decoder.server, tokenizer, config.eos_token_ids, sha), tokenizer
    if decoder.backend not in BACKENDS:
        raise ValueError(f"backend {decoder.backend!r} unknown; available: {', '.join(BACKENDS)}")
    load = _Loader(llm, tokenizer, models, engine or EngineOptions(), progress, cancel)
    if decoder.backend != "auto":
        return load(decoder), tokenizer
    from engines.selection import probe

    found = probe()
    chosen, reason = resolve_auto_backend(decoder, found)
    logger.info("backend auto: %s (%s)", chosen.backend, reason)
    if chosen.backend not in ("tensorrt", "tensorrt-rtx"):
        return load(chosen), tokenizer
    from engines.tensorrt.backend import FALLBACK_ERRORS

    gate = gate or GateOptions()
    try:
        return load(chosen, gate if gate.startup else None, auto=True), tokenizer
    except FALLBACK_ERRORS as e:
        if cancel is not None and cancel.is_set():
            raise  # the user stopped the build: no fallback
        fallback, fallback_reason = resolve_auto_backend(decoder, found, without_tensorrt=True)
        why = f"{chosen.backend} not used: {_failure(e)}. Decoding with {fallback.backend} instead"
        why += f" ({fallback_reason})"
    if notice is not None:
        logger.info("backend auto: %s", why)
        notice(why)
    else:
        logger.warning("backend auto: %s", why)
    driver = load(fallback)
    driver.fallback = why
    return driver, tokenizer


def _failure(error: Exception) -> str:
    """What failed, in words: ``engine build failed (<the error>)``; a gate failure says it itself.

    The classes are imported here, not at the top: only a TensorRT that failed needs them (and
    :func:`load_llm` has imported their modules by then).
    """
    from engines.onnx_export import ExportError
    from engines.tensorrt.compiler import EngineBuildError, OnnxParseError
    from engines.tensorrt.cuda_mem import CudaError
    from engines.tensorrt.flavour import TensorRTUnavailable
    from engines.tensorrt.gate import GateFailed
    from engines.tensorrt.runtime import EngineIncompatible, EngineRuntimeError

    if isinstance(error, GateFailed):
        return str(error)
    kinds: tuple[tuple[type[Exception], str], ...] = (  # a subclass before its base
        (TensorRTUnavailable, "TensorRT unavailable"),
        (EngineIncompatible, "engine does not run here"),
        (OnnxParseError, "ONNX parser refused the export"),
        (EngineBuildError, "engine build failed"),
        (ExportError, "ONNX export failed"),
        (EngineRuntimeError, "engine failed while running"),
        (CudaError, "CUDA error"),
    )
    what = next((words for kind, words in kinds if isinstance(error, kind)), type(error).__name__)
    return f"{what} ({error})"


class _Loader:
    """Loads one concrete backend (not ``auto``) for :func:`load_llm`."""

    def __init__(
        self,
        llm: ResolvedLlm,
        tokenizer: Any,
        models: ModelSettings,
        engine: EngineOptions,
        progress: ProgressCallback | None,
        cancel: threading.Event | None,
    ) -> None:
        self.llm, self.tokenizer, self.models, self.engine = llm, tokenizer, models, engine
        self.progress, self.cancel = progress, cancel

    def __call__(
        self, decoder: DecoderSettings, gate: GateOptions | None = None, *, auto: bool = False
    ) -> DecoderDriver:
        """The decoder of ``decoder.backend``.

        ``auto``: the TensorRT that ``--backend auto`` picked; a build of it that failed at an
        earlier start is not tried again.
        """
        model_dir, tokenizer, config = self.llm.path, self.tokenizer, self.llm.config
        if decoder.backend == "onnxruntime":
            return _load_onnxruntime(self.llm, tokenizer, decoder, self.progress)
        if decoder.backend in ("tensorrt", "tensorrt-rtx"):
            from engines.tensorrt.backend import load_tensorrt_decoder

            return load_tensorrt_decoder(
                model_dir,
                tokenizer,
                dataclasses.replace(self.engine, flavour=decoder.backend),
                engine_cache_dir(self.models),
                capacity_tokens=decoder.context_tokens,
                progress=self.progress,
                cancel=self.cancel,
                gate=gate,
                retry_failed_build=not auto,
                config=config,
            )
        from engines.torch_backend import TorchBackendOptions, load_torch_decoder

        options = TorchBackendOptions(
            device=decoder.device,
            dtype=decoder.dtype,
            capacity_tokens=decoder.context_tokens,
            threads=decoder.threads,
            cuda_graph=decoder.cuda_graph,
            compile=decoder.compile,
            compile_cache_dir=compile_cache_dir(self.models, model_dir),
        )
        return load_torch_decoder(model_dir, tokenizer, options, self.progress, config=config)


def _load_onnxruntime(
    llm: ResolvedLlm, tokenizer: Any, decoder: DecoderSettings, progress: ProgressCallback | None
) -> DecoderDriver:
    from engines.onnxruntime_backend import OnnxRuntimeOptions, load_onnxruntime_decoder

    if decoder.device not in ("auto", "cpu"):
        raise ValueError(f"the onnxruntime backend runs on the CPU; drop --device {decoder.device}")
    options = OnnxRuntimeOptions(
        dtype=onnx_dtype(decoder.dtype), threads=decoder.threads, capacity_tokens=decoder.context_tokens
    )
    return load_onnxruntime_decoder(llm.path, tokenizer, options, progress, config=llm.config)


def resolve_auto_backend(
    decoder: DecoderSettings, found: Probe | None = None, *, without_tensorrt: bool = False
) -> tuple[DecoderSettings, str]:
    """``backend = "auto"`` made concrete for this machine, and the reason in words.

    Args:
        decoder: The settings with ``backend = "auto"``.
        found: What this machine offers (probed now when ``None``).
        without_tensorrt: The choice after TensorRT failed here (:func:`load_llm`'s fallback).
    """
    from engines.selection import choose_backend, probe

    choice = choose_backend(found or probe(), without_tensorrt=without_tensorrt)
    if choice.backend == "onnxruntime" and decoder.dtype not in ("auto", "fp32", "fp16"):
        # The ONNX export is fp32 or fp16 only; PyTorch runs the asked-for dtype.
        why = f"{choice.reason}; but --dtype {decoder.dtype} is not exported to ONNX: PyTorch on the CPU"
        return dataclasses.replace(decoder, backend="pytorch", device="cpu"), why
    device = decoder.device if decoder.device != "auto" or choice.backend != "pytorch" else choice.device
    return dataclasses.replace(decoder, backend=choice.backend, device=device), choice.reason
