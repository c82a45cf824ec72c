"""``--backend tensorrt`` / ``tensorrt-rtx``: export, build (both cached), load, warm up.

Everything a first start does is reported as :class:`~engines.progress.EngineProgress`
(export, engine cache hit or build phases, warm-up time), so the UI can show why the first
launch takes longer and that the next one does not.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path

from engines.driver import DecoderDriver, Detokenizer
from engines.onnx_export import ExportOptions, export_decoder
from engines.progress import Cache, ProgressCallback, RebuildReason, Stage, emit, emit_lookup
from engines.tensorrt.builder import BuiltEngine, build_engine
from engines.tensorrt.cuda_mem import GpuUnusable, find_gpu
from engines.tensorrt.flavour import (
    TensorRTUnavailable,
    export_dtype,
    load_flavour,
    resolve_flavour_name,
    rtx_supports,
)
from engines.tensorrt.gate import GateFailed, prior_verdict, run_gate
from engines.tensorrt.options import EngineOptions, EngineOptionsError
from engines.tensorrt.runtime import EngineIncompatible, TensorRTStep, runtime_cache_path
from engines.verify import GateOptions
from models.config import DecoderConfig

logger = logging.getLogger(__name__)

# What makes ``--backend auto`` leave TensorRT for the next backend: TensorRT missing or not for
# this GPU, a failed export, build, deserialize, warm-up or gate (all RuntimeError:
# TensorRTUnavailable, ExportError, EngineBuildError, EngineIncompatible, EngineRuntimeError,
# CudaError, GateFailed; also PyTorch running out of memory for the gate's reference), options
# the flavour cannot build (EngineOptionsError) and a cache that cannot be written (OSError).
FALLBACK_ERRORS: tuple[type[Exception], ...] = (RuntimeError, EngineOptionsError, OSError)


def load_tensorrt_decoder(
    model_dir: Path,
    tokenizer: Detokenizer,
    options: EngineOptions,
    cache_dir: Path,
    *,
    capacity_tokens: int = 2048,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    gate: GateOptions | None = None,
    retry_failed_build: bool = True,
    config: DecoderConfig | None = None,
) -> DecoderDriver:
    """The model in ``model_dir`` as a TensorRT engine on this machine's GPU.

    ``config``: the model's, when the caller read it already (else read here).

    Exports ONNX and builds the engine when the caches lack them. A cached engine TensorRT
    refuses is rebuilt once, and only when a rebuild can help (another TensorRT version wrote
    it, or it is damaged or foreign; not for a GPU, driver or memory the engine cannot use).
    Warm-up runs the profile's typical shapes and its time is reported (``step.warmup_ms``)
    and kept out of any turn's statistics. With ``gate``, the engine then passes the accuracy
    gate (:func:`~engines.tensorrt.gate.run_gate`) unless its record holds a verdict for these
    thresholds. Setting ``cancel`` stops an engine build at TensorRT's next step
    (``EngineBuildError``). On any failure after the engine loaded, it is closed first. With
    ``retry_failed_build=False`` a build that failed before is not tried again (``EngineBuildError``).

    Raises:
        TensorRTUnavailable: No TensorRT of that flavour, no GPU, or a GPU it does not support.
        EngineIncompatible: The engine does not run here, and a rebuild cannot help or did not.
        EngineRuntimeError: TensorRT failed during warm-up or the gate.
        GateFailed: The engine missed the gate's thresholds, now or at an earlier start.
    """
    flavour = load_flavour(resolve_flavour_name(options.flavour))
    gpu = find_gpu()
    if isinstance(gpu, GpuUnusable):
        raise TensorRTUnavailable(f"a TensorRT engine runs on an NVIDIA GPU: {gpu.reason}")
    if gpu is None:
        raise TensorRTUnavailable(
            "a TensorRT engine runs on an NVIDIA GPU and none is usable here (cuda-python sees no "
            "device or driver); use --backend pytorch or onnxruntime"
        )
    if flavour.is_rtx and not rtx_supports(gpu.capability):
        major, minor = gpu.capability
        raise TensorRTUnavailable(
            f"TensorRT-RTX does not run on {gpu.name} (compute capability {major}.{minor}); "
            "use --backend tensorrt (full TensorRT) or pytorch"
        )
    if flavour.is_rtx and options.targets == "auto":
        options = replace(options, targets=f"sm{gpu.capability[0]}{gpu.capability[1]}")
    dtype, _ = export_dtype(flavour, options.precision)
    exported = export_decoder(model_dir, ExportOptions(dtype=dtype), progress=progress)
    calibration = None
    if options.precision == "int8":
        from engines.tensorrt.calibration import calibration_ids

        calibration = calibration_ids(tokenizer)

    def build(force: bool) -> BuiltEngine:
        return build_engine(
            exported,
            options,
            cache_dir,
            flavour_name=flavour.name,
            progress=progress,
            force=force,
            cancel=cancel,
            calibration_ids=calibration,
            gpu=gpu,
            retry_failed=retry_failed_build,
        )

    config = config or DecoderConfig.from_dir(model_dir)
    built = build(False)
    if gate is not None:
        _refuse_failed_engine(built, gate)
    rc_path = runtime_cache_path(cache_dir, flavour, gpu) if flavour.is_rtx else None
    try:
        step = TensorRTStep(
            flavour, built.path.read_bytes(), config, capacity_tokens,
            cuda_graphs=options.cuda_graphs, runtime_cache=rc_path, precision=options.precision,
        )  # fmt: skip
    except EngineIncompatible as e:
        if not built.cache_hit:
            raise  # just built, and still refused: building again would loop
        if not e.rebuild_helps:
            raise EngineIncompatible(
                f"{e}; building the engine again cannot fix this (it is this machine's GPU, driver "
                "or memory), so the cached engine is kept",
                rebuild_helps=False,
            ) from e
        logger.warning("cached engine %s does not run here (%s); building it again", built.path, e)
        emit(
            progress,
            Stage.REBUILD,
            f"cached engine does not run here ({e}); building again",
            cache=Cache.ENGINE,
            reason=RebuildReason.INCOMPATIBLE,
        )
        built = build(True)
        step = TensorRTStep(
            flavour, built.path.read_bytes(), config, capacity_tokens,
            cuda_graphs=options.cuda_graphs, runtime_cache=rc_path, precision=options.precision,
        )  # fmt: skip
    step.engine_path = built.path
    if step.handle is not None:  # TensorRT-RTX: kernels compiled at run time, kept between runs
        hit = step.handle.loaded
        emit_lookup(
            progress, Cache.RUNTIME_CACHE, hit, f"runtime cache {'hit' if hit else 'empty'}: {rc_path}"
        )
    driver = DecoderDriver(
        step, tokenizer, config.eos_token_ids, rope_switch_tokens=config.rope_switch_tokens
    )
    try:
        if options.warmup:
            warmup_ms = step.warm_up(options.prefill_opt_tokens, options.context_opt_tokens)
            emit(progress, Stage.WARMUP, f"warm-up {warmup_ms:.0f} ms")
            logger.info("%s: warm-up %.0f ms", step.name, warmup_ms)
        verdict = None if gate is None else prior_verdict(built.record, gate)
        if gate is not None and verdict is None:  # not checked yet (else it passed before)
            run_gate(driver, model_dir, tokenizer, gate, engine_folder=built.path.parent, progress=progress)
    except BaseException:
        driver.close()  # the GPU memory goes back before anything else (a fallback) needs it
        raise
    logger.info(
        "%s: %s (%s), KV cache %d tokens on %s",
        step.name, built.path, "cached" if built.cache_hit else f"built in {built.build_s:.1f} s",
        step.capacity_tokens, gpu.name,
    )  # fmt: skip
    status = "engine cache hit" if built.cache_hit else f"engine built in {built.build_s:.0f} s"
    if built.notice:
        status += f" ({built.notice})"
    if gate is not None:
        status += ", accuracy gate passed" + (" before" if verdict is not None else "")
    driver.cache_status = status
    return driver


def _refuse_failed_engine(built: BuiltEngine, gate: GateOptions) -> None:
    """Raise :class:`GateFailed` when the engine failed the gate at an earlier start (same thresholds)."""
    verdict = prior_verdict(built.record, gate)
    if verdict is not None and not verdict.get("passed"):
        failures = "; ".join(str(f) for f in verdict.get("failures") or ()) or "see 'assistant engine list'"
        raise GateFailed(
            f"accuracy gate failed at an earlier start ({str(verdict.get('checked_at', '?'))[:10]}; not "
            f"checked again): {failures}; 'assistant engine verify' checks {built.path.parent.name} "
            "again, 'assistant engine build --force' rebuilds it",
            verdict,
        )
