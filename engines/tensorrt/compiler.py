"""TensorRT's part of an engine build: parse the ONNX export, configure the builder, build.

:func:`compile_engine` parses the export (every parser error is reported with its node), sets
the workspace limit, optimization level, compute-capability targets (RTX) and precision, one
optimization profile per shape range (``options.py``), the timing cache (full TensorRT) and
the INT8 calibration profile, and returns the serialized engine. Deciding whether to build,
and storing what was built, is :mod:`engines.tensorrt.builder`'s.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from engines.onnx_export import CONTRACT, INPUT_IDS, POSITION_IDS, ExportedDecoder, past_names
from engines.progress import Cache, ProgressCallback, Stage, emit, emit_lookup
from engines.tensorrt import cache, tuning
from engines.tensorrt.cuda_mem import GpuInfo
from engines.tensorrt.flavour import Flavour, network_flags, set_precision_flags, set_targets
from engines.tensorrt.options import EngineOptions, profile_shapes
from engines.tensorrt.progress import make_logger, make_monitor

logger = logging.getLogger(__name__)


class EngineBuildError(RuntimeError):
    """TensorRT could not parse the export or build the engine."""


class OnnxParseError(EngineBuildError):
    """The ONNX parser rejected the export; ``errors`` holds one line per parser error."""

    def __init__(self, path: Path, errors: list[str]) -> None:
        self.errors = errors
        listing = "\n".join(f"  {e}" for e in errors)
        super().__init__(f"TensorRT's ONNX parser rejected {path} with {len(errors)} error(s):\n{listing}")


def _parse(
    flavour: Flavour, trt_logger: Any, builder: Any, path: Path, strongly_typed: bool
) -> tuple[Any, Any]:
    network = builder.create_network(network_flags(flavour, strongly_typed))
    parser = flavour.trt.OnnxParser(network, trt_logger)
    if not parser.parse_from_file(str(path)):
        errors = []
        for i in range(parser.num_errors):
            e = parser.get_error(i)
            errors.append(f"node {e.node()} {e.node_name()!r} ({e.node_operator()}): {e.desc()} [{e.code()}]")
        raise OnnxParseError(path, errors or ["(the parser gave no details)"])
    return network, parser


def compile_engine(
    flavour: Flavour,
    exported: ExportedDecoder,
    options: EngineOptions,
    targets: tuple[str, ...],
    strongly_typed: bool,
    gpu: GpuInfo | None,
    caches_dir: Path,
    progress: ProgressCallback | None,
    cancel: threading.Event | None,
    calibrator: Any,
) -> Any:
    """Parse and build; returns TensorRT's serialized engine (``IHostMemory``).

    Raises:
        OnnxParseError: The parser rejected the export (every error listed).
        EngineBuildError: The export breaks the graph contract, or the build failed or was cancelled.
    """
    trt = flavour.trt
    trt_logger = make_logger(trt)
    builder = trt.Builder(trt_logger)
    emit(progress, Stage.PARSE, f"parsing {exported.path}")
    network, _parser = _parse(flavour, trt_logger, builder, exported.path, strongly_typed)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    config.builder_optimization_level = options.optimization_level
    set_targets(flavour, config, targets)
    set_precision_flags(flavour, config, options.precision, strongly_typed)
    meta = exported.metadata
    num_layers = int(meta["assistant.num_layers"])
    kv_heads, head_dim = int(meta["assistant.num_kv_heads"]), int(meta["assistant.head_dim"])
    ranges = profile_shapes(options, kv_heads, head_dim, flavour.decode_profile(options.decode_profile))
    inputs = {network.get_input(i).name for i in range(network.num_inputs)}
    expected = {INPUT_IDS, POSITION_IDS, *past_names(num_layers)}
    if inputs != expected:
        raise EngineBuildError(
            f"{exported.path} does not follow the {CONTRACT} contract (inputs {sorted(inputs)})"
        )
    profiles = []
    for shapes in ranges:
        profile = builder.create_optimization_profile()
        for name in sorted(inputs):
            r = shapes["ids"] if name in (INPUT_IDS, POSITION_IDS) else shapes["past"]
            profile.set_shape(name, r.min, r.opt, r.max)
        config.add_optimization_profile(profile)
        profiles.append(profile)
    timing_path = None
    if not flavour.is_rtx:  # TensorRT-RTX tunes at run time (runtime cache) instead
        device = cache.slug(gpu.name if gpu else "gpu")
        timing_path = caches_dir / f"timing-{flavour.name}-{flavour.version}-{device}-{targets[0]}.bin"
        blob = tuning.load_blob(timing_path, "timing")
        timing = config.create_timing_cache(blob or b"")
        hit = config.set_timing_cache(timing, False)
        if not hit:
            logger.warning("TensorRT rejected the timing cache %s; tuning from scratch", timing_path)
            config.set_timing_cache(config.create_timing_cache(b""), False)
        hit = bool(hit and blob)
        emit_lookup(
            progress, Cache.TIMING_CACHE, hit, f"timing cache {'hit' if hit else 'empty'}: {timing_path}"
        )
    if calibrator is not None:
        # Calibration runs at one shape: the packed snippet length, with an empty KV cache.
        length = calibrator.length_tokens
        calibration = builder.create_optimization_profile()
        for name in sorted(inputs):
            if name in (INPUT_IDS, POSITION_IDS):
                calibration.set_shape(name, (1, length), (1, length), (1, length))
            else:
                empty = (1, kv_heads, 0, head_dim)
                calibration.set_shape(name, empty, empty, empty)
        config.int8_calibrator = calibrator
        config.set_calibration_profile(calibration)
    monitor = make_monitor(trt, progress, cancel)  # must outlive the build
    config.progress_monitor = monitor
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        if cancel is not None and cancel.is_set():
            raise EngineBuildError("engine build cancelled")
        raise EngineBuildError("TensorRT could not build the engine (its errors are logged above)")
    if timing_path is not None:
        tuning.save_blob(timing_path, bytes(memoryview(config.get_timing_cache().serialize())), "timing")
    return serialized
