"""NVIDIA TensorRT and TensorRT for RTX: every API difference between them lives here.

- GPUs: TensorRT runs on any NVIDIA GPU it supports; TensorRT-RTX on RTX-class compute
  capabilities 8.0, 8.6, 8.9, 12.0, 12.1 (it refuses 9.0, the H100/H200).
- Where engines are built: TensorRT on the target GPU (autotuning runs there); TensorRT-RTX
  ahead of time without a GPU, for the compute capabilities named at build time.
- Precision: TensorRT 10.x takes builder flags on an fp32 graph (BF16, INT8 with a
  calibrator) or a strongly typed graph. TensorRT 11 removed the flags and the calibrator
  (``BuilderFlag.FP16/BF16/INT8``, ``IInt8EntropyCalibrator2``, ``int8_calibrator``,
  ``set_calibration_profile``): like TensorRT-RTX it is strongly typed only (the ONNX dtypes
  decide), with INT8 only from a graph whose weights are already quantized (Q/DQ), which the
  export does not write. :func:`export_dtype` decides from the imported module itself.
- Tuning results: TensorRT's timing cache (``ITimingCache``) at build time; TensorRT-RTX's
  runtime cache of JIT-compiled kernels (``IRuntimeCache``) at run time.
- CUDA graphs: captured by our runtime per shape on TensorRT; built into TensorRT-RTX
  (``IRuntimeConfig.cuda_graph_strategy``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from engines.tensorrt.options import EngineOptionsError
from engines.tensorrt.versions import RTX_RUNNABLE

# ComputeCapability members of TensorRT-RTX 1.7 (SM75 builds, but 1.7's runtime lists 8.0+).
RTX_TARGETS = {
    "sm75": "SM75",
    "sm80": "SM80",
    "sm86": "SM86",
    "sm89": "SM89",
    "sm120": "SM120",
    "sm121": "SM121",
}
INSTALL_HINT = {
    "tensorrt": "pip install tensorrt (its wheel fetches the libraries from NVIDIA's package index)",
    "tensorrt-rtx": "pip install 'local-voice-assistant[tensorrt-rtx]' "
    "(tensorrt-rtx-cu13-libs + tensorrt-rtx-cu13-bindings 1.7.1.116)",
}


class TensorRTUnavailable(RuntimeError):
    """The requested TensorRT flavour cannot be imported or used on this machine."""


class UnsupportedPrecision(EngineOptionsError):
    """The flavour cannot build this precision from the ONNX export (yet)."""


@dataclass(frozen=True)
class Flavour:
    """One TensorRT flavour: its module and what it can do."""

    name: str
    trt: Any  # the imported module (``tensorrt`` or ``tensorrt_rtx``)
    version: str

    @property
    def is_rtx(self) -> bool:
        """TensorRT for RTX (strongly typed, ahead-of-time, runtime cache)."""
        return self.name == "tensorrt-rtx"

    def decode_profile(self, requested: bool | None) -> bool:
        """Whether engines get a separate decode profile (``None``: this flavour's default)."""
        return (not self.is_rtx) if requested is None else requested

    @property
    def builds_without_gpu(self) -> bool:
        """Whether engines can be built on a machine without a GPU."""
        return self.is_rtx

    @property
    def label(self) -> str:
        """``TensorRT 11.4`` or ``TensorRT-RTX 1.7``: the name and version users install by."""
        name = "TensorRT-RTX" if self.is_rtx else "TensorRT"
        return f"{name} {'.'.join(self.version.split('.')[:2])}"

    @property
    def weakly_typed(self) -> bool:
        """Whether the builder takes precision flags (``BuilderFlag.FP16/BF16/INT8``).

        Full TensorRT 10.x only: TensorRT 11 removed them and TensorRT-RTX never had them.
        Decided from the module: its major version and the flags being there.
        """
        if self.is_rtx or _major(self.version) >= 11:
            return False
        flags = getattr(self.trt, "BuilderFlag", None)
        return all(hasattr(flags, name) for name in ("FP16", "BF16", "INT8"))

    @property
    def int8_calibrator(self) -> bool:
        """Whether the builder calibrates INT8 itself (``IInt8EntropyCalibrator2``; TensorRT 10.x)."""
        config = getattr(self.trt, "IBuilderConfig", None)
        return (
            self.weakly_typed
            and hasattr(self.trt, "IInt8EntropyCalibrator2")
            and all(hasattr(config, name) for name in ("int8_calibrator", "set_calibration_profile"))
        )


def _major(version: str) -> int:
    """``11`` for ``11.4.0.106``; 0 when the version does not start with a number."""
    head = version.split(".")[0]
    return int(head) if head.isdigit() else 0


def load_flavour(name: str) -> Flavour:
    """Import ``tensorrt`` or TensorRT-RTX.

    Raises:
        TensorRTUnavailable: Not installed (or broken), with the install command.
    """
    modules = {"tensorrt": ("tensorrt",), "tensorrt-rtx": ("tensorrt_rtx", "tensorrt_rtx_bindings")}
    if name not in modules:
        raise TensorRTUnavailable(f"TensorRT flavour {name!r} unknown; use {' or '.join(modules)}")
    errors = []
    for module_name in modules[name]:
        try:
            module = importlib.import_module(module_name)
        except (ImportError, OSError) as e:  # OSError: a wheel whose shared libraries fail to load
            errors.append(f"{module_name}: {e}")
            continue
        return Flavour(name, module, str(module.__version__))
    raise TensorRTUnavailable(f"{name} is not usable here ({'; '.join(errors)}); {INSTALL_HINT[name]}")


def resolve_flavour_name(requested: str) -> str:
    """``auto`` -> ``tensorrt`` when importable, else ``tensorrt-rtx``."""
    if requested != "auto":
        return requested
    try:
        load_flavour("tensorrt")
    except TensorRTUnavailable:
        return "tensorrt-rtx"
    return "tensorrt"


def export_dtype(flavour: Flavour, precision: str) -> tuple[str, bool]:
    """The ONNX export dtype a precision is built from, and whether the network is strongly typed.

    fp32, fp16 and bf16 come from the graph of that dtype, strongly typed, except that full
    TensorRT 10.x keeps building bf16 from the fp32 graph with its BF16 flag (weakly typed). INT8
    needs TensorRT 10.x's calibrator (fp32 graph, INT8 + FP16 flags, post-training calibration).
    Call it before exporting anything: a refusal costs no work.

    Raises:
        UnsupportedPrecision: INT8 on TensorRT 11 or TensorRT-RTX, naming what to do instead.
    """
    return precision_plan(flavour.label, flavour.weakly_typed, flavour.int8_calibrator, precision)


def precision_plan(label: str, weakly_typed: bool, int8_calibrator: bool, precision: str) -> tuple[str, bool]:
    """:func:`export_dtype` from the facts about the builder (pure, so every case is testable).

    Args:
        label: ``TensorRT 11.4`` / ``TensorRT-RTX 1.7`` (:attr:`Flavour.label`), for the message.
        weakly_typed: The builder takes precision flags (:attr:`Flavour.weakly_typed`).
        int8_calibrator: The builder calibrates INT8 (:attr:`Flavour.int8_calibrator`).
        precision: ``fp32``, ``fp16``, ``bf16`` or ``int8``.

    Raises:
        UnsupportedPrecision: INT8 without a calibrator, naming what to do instead.
    """
    if precision in ("fp16", "fp32") or (precision == "bf16" and not weakly_typed):
        return precision, True
    if precision == "bf16" or int8_calibrator:
        return "fp32", False
    quantized = (
        "weight-only INT8/INT4 from a graph whose weights are already quantized (Q/DQ or MatMulNBits)"
        if label.startswith("TensorRT-RTX")
        else "INT8 from a quantized (Q/DQ) ONNX graph"
    )
    raise UnsupportedPrecision(
        f"{label} has no INT8 calibrator: it builds {quantized}, which 'assistant engine export' "
        "does not write yet; build --precision fp16 (or bf16), or use full TensorRT 10.x "
        "(--flavour tensorrt, pip install 'tensorrt>=10.4,<11') for calibrated INT8"
    )


def network_flags(flavour: Flavour, strongly_typed: bool) -> int:
    """``create_network`` flags (explicit batch is the only mode since TensorRT 10)."""
    if not strongly_typed:
        return 0
    return 1 << int(flavour.trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)


def set_precision_flags(flavour: Flavour, config: Any, precision: str, strongly_typed: bool) -> None:
    """Builder flags of a weakly typed build (TensorRT 10.x only; int8 keeps fp16 fallbacks).

    Raises:
        UnsupportedPrecision: A weakly typed build on a TensorRT without the flags (11.x, RTX).
    """
    if strongly_typed:
        return
    if not flavour.weakly_typed:  # export_dtype never plans this; a clear error all the same
        raise UnsupportedPrecision(f"{flavour.label} has no precision flags; build strongly typed")
    flag = flavour.trt.BuilderFlag
    names = {"fp32": [], "fp16": ["FP16"], "bf16": ["BF16"], "int8": ["INT8", "FP16"]}[precision]
    for name in names:
        config.set_flag(getattr(flag, name))


def set_targets(flavour: Flavour, config: Any, targets: tuple[str, ...]) -> None:
    """Tell the builder which GPUs the engine is for (TensorRT-RTX only; TensorRT uses its GPU).

    Raises:
        EngineOptionsError: A target TensorRT-RTX does not know.
    """
    if not flavour.is_rtx:
        return
    unknown = [t for t in targets if t not in RTX_TARGETS]
    if unknown or not targets:
        raise EngineOptionsError(
            f"TensorRT-RTX targets {', '.join(unknown) or '(none)'} unknown; use {', '.join(RTX_TARGETS)}"
        )
    config.num_compute_capabilities = len(targets)
    for index, target in enumerate(targets):
        if not config.set_compute_capability(
            getattr(flavour.trt.ComputeCapability, RTX_TARGETS[target]), index
        ):
            raise EngineOptionsError(f"TensorRT-RTX {flavour.version} rejected target {target}")


def target_name(capability: tuple[int, int]) -> str:
    """``(8, 9)`` -> ``sm89``; ``(12, 0)`` -> ``sm120``."""
    return f"sm{capability[0]}{capability[1]}"


def rtx_supports(capability: tuple[int, int]) -> bool:
    """Whether TensorRT-RTX runs engines on a GPU of this compute capability."""
    return capability in RTX_RUNNABLE


def runtime_config(flavour: Flavour, engine: Any, runtime_cache_blob: bytes | None, cuda_graphs: bool) -> Any:
    """TensorRT-RTX's runtime config with its runtime cache and CUDA-graph strategy (else ``None``).

    The runtime cache is loaded from ``runtime_cache_blob`` when TensorRT-RTX accepts it (it
    checks version, GPU and driver itself); otherwise it starts empty and ``loaded`` is False.
    ``attached`` is False when the config refused the cache (nothing compiled is then kept).
    """
    if not flavour.is_rtx:
        return None
    trt = flavour.trt
    config = engine.create_runtime_config()
    cache = config.create_runtime_cache()
    loaded = bool(runtime_cache_blob) and bool(cache.deserialize(runtime_cache_blob))
    attached = bool(config.set_runtime_cache(cache))
    strategy = trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE if cuda_graphs else trt.CudaGraphStrategy.DISABLED
    config.cuda_graph_strategy = strategy
    return RuntimeCacheHandle(cache, config, loaded and attached, attached)


def create_context(engine: Any, handle: RuntimeCacheHandle | None) -> Any:
    """An execution context, through the RTX runtime config when there is one."""
    if handle is None:
        return engine.create_execution_context()
    return engine.create_execution_context(handle.config)


@dataclass
class RuntimeCacheHandle:
    """A TensorRT-RTX runtime config and cache in use, and whether the saved cache loaded.

    ``attached`` is False when the config refused the cache (then nothing is saved).
    """

    cache: Any
    config: Any
    loaded: bool
    attached: bool = True

    def serialize(self) -> bytes:
        """The cache's current contents (kernels JIT-compiled so far)."""
        return bytes(memoryview(self.cache.serialize()))


# EngineInvalidityDiagnostics a rebuild of the engine fixes: another TensorRT-RTX version wrote
# it, or the file is damaged. The others (UNSUPPORTED_CC: the rebuild targets the same compute
# capabilities; OLD_CUDA_DRIVER, OLD_CUDA_RUNTIME, INSUFFICIENT_GPU_MEMORY, CUDA_ERROR) are
# about this machine, and a new engine would be refused for the same reason.
REBUILD_FIXES = frozenset({"VERSION_MISMATCH", "MALFORMED_ENGINE"})


@dataclass(frozen=True)
class Invalidity:
    """Why TensorRT-RTX refuses an engine here, and whether building it again can help."""

    problem: str
    rebuild_helps: bool


def validity_problem(flavour: Flavour, runtime: Any, blob: bytes) -> Invalidity | None:
    """Why TensorRT-RTX will not run this engine on this GPU, or ``None`` when it will (or can't tell).

    ``rebuild_helps`` is true only when every reason TensorRT-RTX gives is one a new engine
    fixes (:data:`REBUILD_FIXES`), or when it gives none (an unknown refusal: one rebuild).
    """
    if not flavour.is_rtx:
        return None
    validity, diagnostics = runtime.get_engine_validity(blob)
    if validity != flavour.trt.EngineValidity.INVALID:
        return None
    reasons = [
        m for m in flavour.trt.EngineInvalidityDiagnostics.__members__.values() if int(diagnostics) & int(m)
    ]
    if not reasons:
        return Invalidity("invalid engine", True)
    problem = ", ".join(r.name.lower() for r in reasons)
    return Invalidity(problem, all(r.name in REBUILD_FIXES for r in reasons))
