"""Build TensorRT / TensorRT-RTX engines from the ONNX export, once per identity, into the cache.

``build_engine`` parses the export (every parser error is reported with its node), sets the
precision (strongly typed from the graph's dtype, or builder flags + INT8 calibration on full
TensorRT 10.x: ``flavour.export_dtype``), the workspace limit, the compute-capability targets
(RTX) and two optimization profiles (prefill and decode, ``options.py``), reports TensorRT's progress as
:class:`~engines.progress.EngineProgress` events, reuses the timing cache (full
TensorRT) and stores the engine with its record (``cache.py``). A cached engine whose record
and bytes check out is returned without touching the builder.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.cache_lock import lock_entry
from engines.onnx_export import (
    CONTRACT,
    ExportedDecoder,
    ExportRecord,
)
from engines.progress import Cache, ProgressCallback, RebuildReason, Stage, emit
from engines.tensorrt import cache
from engines.tensorrt.compiler import EngineBuildError, compile_engine
from engines.tensorrt.cuda_mem import GpuInfo, gpu_info
from engines.tensorrt.flavour import (
    Flavour,
    TensorRTUnavailable,
    export_dtype,
    load_flavour,
    rtx_supports,
    target_name,
)
from engines.tensorrt.options import EngineOptions, EngineOptionsError

logger = logging.getLogger(__name__)

CALIBRATION_TOKENS = 128  # length of each INT8 calibration chunk (one shape, empty KV cache)


@dataclass(frozen=True)
class BuiltEngine:
    """An engine in the cache. ``build_s`` is 0 on a cache hit; ``notice`` says why it was rebuilt."""

    path: Path
    record: dict[str, Any]
    cache_hit: bool
    build_s: float = 0.0
    notice: str | None = None

    @property
    def size_bytes(self) -> int:
        """Size of the serialized engine."""
        return int(self.record["engine"]["size"])


def builder_code_sha256() -> str:
    """sha256 of the code that decides what is built, so editing it invalidates cached engines."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in ("builder.py", "compiler.py", "flavour.py", "options.py", "calibration.py"):
        digest.update((here / name).read_bytes())
    return digest.hexdigest()


def onnx_sha256(exported: ExportedDecoder) -> str:
    """One sha256 for the export's files, from the sha256s its ``export.json`` recorded."""
    files = ExportRecord.read(exported.path.parent).files
    return engine_digest({name: files[name][1] for name in sorted(files)})


def engine_digest(value: Any) -> str:
    """sha256 of a JSON-able value (canonical form)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def resolve_targets(flavour: Flavour, options: EngineOptions, gpu: GpuInfo | None) -> tuple[str, ...]:
    """The compute capabilities the engine is built for.

    Raises:
        EngineOptionsError: ``auto`` without a GPU, or RTX on a GPU it does not support.
        TensorRTUnavailable: Full TensorRT without a GPU (it builds on the GPU it targets).
    """
    targets = options.target_list()
    if not flavour.is_rtx:
        if gpu is None:
            raise TensorRTUnavailable(
                "full TensorRT builds engines on the GPU they run on, and there is none here"
            )
        return (target_name(gpu.capability),)
    if targets != ("auto",):
        return targets
    if gpu is None:
        raise EngineOptionsError("no GPU here to build for: pass --target (sm80, sm86, sm89, sm120, sm121)")
    if not rtx_supports(gpu.capability):
        raise EngineOptionsError(
            f"TensorRT-RTX does not run on {gpu.name} (compute capability "
            f"{gpu.capability[0]}.{gpu.capability[1]}); use full TensorRT (--flavour tensorrt)"
        )
    return (target_name(gpu.capability),)


def engine_identity(
    flavour: Flavour,
    options: EngineOptions,
    targets: tuple[str, ...],
    exported: ExportedDecoder,
    gpu: GpuInfo | None,
) -> dict[str, Any]:
    """Everything that shapes the engine; its hash is the cache key."""
    _, strongly_typed = export_dtype(flavour, options.precision)
    identity = {
        "flavour": flavour.name,
        "version": flavour.version,
        "targets": list(targets),
        "device": "" if flavour.is_rtx or gpu is None else gpu.name,
        "precision": options.precision,
        "strongly_typed": strongly_typed,
        "onnx_sha256": onnx_sha256(exported),
        "contract": CONTRACT,
        "profile": {
            **options.profile_record(),
            "decode_profile": flavour.decode_profile(options.decode_profile),
        },
        "workspace_mib": options.workspace_mib,
        "optimization_level": options.optimization_level,
        "builder_code_sha256": builder_code_sha256(),
    }
    return {**identity, "key": engine_digest(identity)}


def entry_folder(cache_dir: Path, model_id: str, identity: dict[str, Any]) -> Path:
    """``<model>-<flavour>-<targets>-<precision>-<key12>`` under ``cache_dir``."""
    name = "-".join(
        [
            model_id,
            identity["flavour"],
            "+".join(identity["targets"]),
            identity["precision"],
            identity["key"][:12],
        ]
    )
    return cache_dir / cache.slug(name)


def calibration_cache_name(
    flavour: Flavour, identity: dict[str, Any], ids: list[list[int]], length_tokens: int
) -> str:
    """``calibration-<onnx sha>-<snippets sha>-<length>tok-<flavour>-<version>.bin``.

    Scales measured on chunks of another length, or by another TensorRT version, are other
    scales: each gets its own file instead of being reused.
    """
    onnx, snippets = identity["onnx_sha256"][:16], engine_digest(ids)[:12]
    return (
        cache.slug(f"calibration-{onnx}-{snippets}-{length_tokens}tok-{flavour.name}-{flavour.version}")
        + ".bin"
    )


def build_engine(
    exported: ExportedDecoder,
    options: EngineOptions,
    cache_dir: Path,
    *,
    flavour_name: str = "tensorrt-rtx",
    progress: ProgressCallback | None = None,
    force: bool = False,
    cancel: threading.Event | None = None,
    calibration_ids: list[list[int]] | None = None,
    gpu: GpuInfo | None = None,
    retry_failed: bool = True,
) -> BuiltEngine:
    """The engine for ``exported`` and ``options``: from the cache, or built now.

    A build that fails (not a cancelled one) is recorded in the entry's folder; with
    ``retry_failed=False`` (``--backend auto`` at start-up) a recorded failure is raised again
    at once instead of spending the build's minutes again at every start.

    Args:
        exported: The ONNX export; its dtype must be the one the precision needs
            (:func:`~engines.tensorrt.flavour.export_dtype`).
        options: Precision, targets, workspace, profiles.
        cache_dir: The engine cache folder.
        flavour_name: ``tensorrt`` or ``tensorrt-rtx`` (resolve ``auto`` first).
        progress: Receives :class:`~engines.progress.EngineProgress` events.
        force: Build even when a usable engine is cached.
        cancel: Set it to stop a build at TensorRT's next step.
        calibration_ids: Token ids of representative snippets (required for ``int8``).
        gpu: The GPU to build for; probed with cuda-python when ``None``.
        retry_failed: Build even when this build failed before (an explicit ``engine build``).

    Raises:
        EngineOptionsError: Bad options, or a precision the flavour cannot build.
        TensorRTUnavailable: The flavour is not installed, or needs a GPU that is not here.
        OnnxParseError: The parser rejected the export (every error listed).
        EngineBuildError: The build failed or was cancelled.
    """
    options.validate()
    flavour = load_flavour(flavour_name)
    dtype, strongly_typed = export_dtype(flavour, options.precision)
    if exported.metadata.get("assistant.dtype") != dtype:
        raise EngineOptionsError(
            f"{options.precision} engines are built from the {dtype} export, not "
            f"{exported.metadata.get('assistant.dtype')} ({exported.path})"
        )
    gpu = gpu or gpu_info()
    targets = resolve_targets(flavour, options, gpu)
    identity = engine_identity(flavour, options, targets, exported, gpu)
    model_id = exported.metadata.get("assistant.model_id", "decoder")
    folder = entry_folder(cache_dir, model_id, identity)
    try:
        lock = lock_entry(folder, cancel, on_wait=lambda m: emit(progress, Stage.WAIT, m))
    except InterruptedError as e:
        raise EngineBuildError(f"build cancelled: {e}") from e
    # Held from the cache check until the engine is in place and reported: `engine clear`
    # skips this entry meanwhile, and a second build of it waits, then hits the cache.
    with lock:
        failure = None if force or retry_failed else cache.read_failure(folder)
        if failure is not None:
            raise EngineBuildError(
                f"the engine build failed at an earlier start ({str(failure.get('failed_at'))[:10]}; not "
                f"tried again): {failure.get('reason')}; 'assistant engine build' tries again"
            )
        notice = "forced" if force else None
        if folder.exists() and not force:
            problem = cache.check_entry(folder, identity)
            if problem is None:
                emit(progress, Stage.CACHED, f"engine cache hit: {folder}", cache=Cache.ENGINE)
                return BuiltEngine(folder / cache.ENGINE_FILE, cache.read_record(folder), True)
            notice = f"cached engine unusable, building again: {problem}"
            logger.warning("%s", notice)
            emit(progress, Stage.REBUILD, notice, cache=Cache.ENGINE, reason=RebuildReason.UNUSABLE)
        emit(
            progress,
            Stage.MISS,
            notice or "no engine cached for this model, GPU and options",
            cache=Cache.ENGINE,
        )
        start = time.monotonic()
        caches_dir = cache_dir / cache.CACHES_DIR
        calibrator = None
        if options.precision == "int8":
            from engines.tensorrt.calibration import make_calibrator

            if not calibration_ids:
                raise EngineOptionsError("int8 needs calibration snippets (calibration_ids)")
            length = min(options.prefill_opt_tokens, CALIBRATION_TOKENS)
            cache_path = caches_dir / calibration_cache_name(flavour, identity, calibration_ids, length)
            calibrator = make_calibrator(flavour.trt, calibration_ids, cache_path, length)
        try:
            serialized = compile_engine(
                flavour,
                exported,
                options,
                targets,
                strongly_typed,
                gpu,
                caches_dir,
                progress,
                cancel,
                calibrator,
            )
        except EngineBuildError as e:
            if not (cancel is not None and cancel.is_set()):
                cache.write_failure(folder, str(e))
            raise
        finally:
            if calibrator is not None:
                calibrator.free()  # its device buffers
        build_s = time.monotonic() - start
        emit(progress, Stage.SAVE, f"writing {folder}")
        record = {
            **identity,
            "model_id": model_id,
            "onnx": {"path": str(exported.path), "dtype": dtype},
            "built_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "build_s": round(build_s, 2),
            "verified": None,
        }
        try:
            record = cache.write_entry(folder, memoryview(serialized), record)
        except OSError as e:
            raise EngineBuildError(f"cannot write the engine under {cache_dir}: {e}") from e
        logger.info("built %s in %.1f s (%d MB)", folder, build_s, record["engine"]["size"] // 10**6)
        emit(
            progress,
            Stage.DONE,
            f"built in {build_s:.1f} s: {folder / cache.ENGINE_FILE}",
            cache=Cache.ENGINE,
        )
        return BuiltEngine(folder / cache.ENGINE_FILE, record, False, build_s, notice)
