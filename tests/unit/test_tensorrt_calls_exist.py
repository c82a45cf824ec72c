"""Every TensorRT-RTX call of the runtime and the builder exists in the installed bindings.

By introspection (no GPU): each method in :data:`CALLS` must have an overload in
``tensorrt_rtx`` (pybind11 signatures in the docstrings) that takes the arguments the code
passes, with compatible types; properties the code sets must be settable; enum members must
exist. An AST scan of ``engines/tensorrt/`` keeps the table complete, and the CPU stand-in
(``tests/helpers/trt_standin.py``) is held to the same signatures, so the runtime tests cannot pass
on an API TensorRT-RTX lacks.

CI gets TensorRT-RTX from the ``dev`` extra: ``tensorrt-rtx-cu13-bindings`` (module
``tensorrt_rtx_bindings``, which :func:`~engines.tensorrt.flavour.load_flavour` falls back to
when the ``tensorrt_rtx`` alias package is not installed) and ``tensorrt-rtx-cu13-libs``.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engines.tensorrt.flavour import REBUILD_FIXES, RTX_TARGETS, load_flavour
from tests.helpers import trt_standin

RTX = load_flavour("tensorrt-rtx").trt  # a dev dependency: CI has it, so no skip
ROOT = Path(__file__).resolve().parents[2] / "engines" / "tensorrt"
SCANNED = (
    "runtime.py",
    "bindings.py",
    "flavour.py",
    "builder.py",
    "compiler.py",
    "progress.py",
    "calibration.py",
)


@dataclass(frozen=True)
class Obj:
    """An argument that is an instance of the TensorRT class ``name``."""

    name: str


PROPERTY, SETTABLE = "property", "settable"
# (class or "" for the module, member, the arguments as the code passes them, or a marker)
CALLS: list[tuple[str, str, Any]] = [
    # runtime.py, bindings.py
    ("Runtime", "__init__", (Obj("ILogger"),)),
    ("Runtime", "get_engine_validity", (b"engine",)),
    ("Runtime", "deserialize_cuda_engine", (b"engine",)),
    ("ICudaEngine", "num_optimization_profiles", PROPERTY),
    ("ICudaEngine", "get_tensor_profile_shape", ("input_ids", 0)),
    ("ICudaEngine", "get_tensor_dtype", ("past_key_values.0.key",)),
    ("ICudaEngine", "create_execution_context", ()),
    ("ICudaEngine", "create_execution_context", (Obj("IRuntimeConfig"),)),
    ("ICudaEngine", "create_runtime_config", ()),
    ("IRuntimeConfig", "create_runtime_cache", ()),
    ("IRuntimeConfig", "set_runtime_cache", (Obj("IRuntimeCache"),)),
    ("IRuntimeConfig", "cuda_graph_strategy", SETTABLE),
    ("IRuntimeCache", "deserialize", (b"cache",)),
    ("IRuntimeCache", "serialize", ()),
    ("IExecutionContext", "set_optimization_profile_async", (0, 0x1000)),
    ("IExecutionContext", "set_input_shape", ("input_ids", (1, 16))),
    ("IExecutionContext", "set_tensor_address", ("input_ids", 0x7F0000000000)),
    ("IExecutionContext", "execute_async_v3", (0x1000,)),
    ("", "nptype", (Obj("DataType"),)),
    ("ILogger", "__init__", ()),
    ("ILogger", "log", (Obj("ILogger.Severity"), "message")),  # overridden by make_logger
    # builder.py, compiler.py, flavour.py, progress.py
    ("Builder", "__init__", (Obj("ILogger"),)),
    ("Builder", "create_network", (1,)),
    ("Builder", "create_builder_config", ()),
    ("Builder", "create_optimization_profile", ()),
    ("Builder", "build_serialized_network", (Obj("INetworkDefinition"), Obj("IBuilderConfig"))),
    ("OnnxParser", "__init__", (Obj("INetworkDefinition"), Obj("ILogger"))),
    ("OnnxParser", "parse_from_file", ("decoder.onnx",)),
    ("OnnxParser", "num_errors", PROPERTY),
    ("OnnxParser", "get_error", (0,)),
    ("ParserError", "node", ()),
    ("ParserError", "node_name", ()),
    ("ParserError", "node_operator", ()),
    ("ParserError", "desc", ()),
    ("ParserError", "code", ()),
    ("INetworkDefinition", "num_inputs", PROPERTY),
    ("INetworkDefinition", "get_input", (0,)),
    ("ITensor", "name", PROPERTY),
    ("IBuilderConfig", "set_memory_pool_limit", (Obj("MemoryPoolType"), 1 << 30)),
    ("IBuilderConfig", "builder_optimization_level", SETTABLE),
    ("IBuilderConfig", "num_compute_capabilities", SETTABLE),
    ("IBuilderConfig", "set_compute_capability", (Obj("ComputeCapability"), 0)),
    ("IBuilderConfig", "add_optimization_profile", (Obj("IOptimizationProfile"),)),
    ("IBuilderConfig", "progress_monitor", SETTABLE),
    ("IOptimizationProfile", "set_shape", ("input_ids", (1, 1), (1, 8), (1, 16))),
    ("IProgressMonitor", "__init__", ()),
    ("IProgressMonitor", "phase_start", ("phase", "parent", 3)),  # overridden by make_monitor
    ("IProgressMonitor", "step_complete", ("phase", 1)),
    ("IProgressMonitor", "phase_finish", ("phase",)),
]
ENUMS = {
    "CudaGraphStrategy": ["DISABLED", "WHOLE_GRAPH_CAPTURE"],
    "EngineValidity": ["INVALID"],
    "EngineInvalidityDiagnostics": [],  # iterated through __members__
    "ILogger.Severity": ["INTERNAL_ERROR", "ERROR", "WARNING"],
    "MemoryPoolType": ["WORKSPACE"],
    "NetworkDefinitionCreationFlag": ["STRONGLY_TYPED"],
    "ComputeCapability": list(RTX_TARGETS.values()),
}
# Called only on full TensorRT, behind ``flavour.is_rtx`` checks (the timing cache, which
# TensorRT 11 keeps); TensorRT-RTX need not have them.
FULL_TENSORRT_ONLY = {"create_timing_cache", "set_timing_cache", "get_timing_cache"}
# Weak typing and INT8 calibration: TensorRT 10.x only (11 removed them), called only when
# ``Flavour.weakly_typed`` / ``Flavour.int8_calibrator`` found them in the module.
TENSORRT_10_ONLY = {
    "BuilderFlag": ["FP16", "BF16", "INT8"],
    "IInt8EntropyCalibrator2": [],
    "IBuilderConfig": ["int8_calibrator", "set_calibration_profile"],
}

# Attribute names the scanned files use on Python, numpy, logging or our own objects that
# happen to be member names of some TensorRT class too.
NOT_TENSORRT = {"append", "clear", "destroy", "dtype", "engine", "itemsize", "max", "min", "opt", "nbytes"}
NOT_TENSORRT |= {"metadata", "num_layers", "update", "DEBUG"}
NOT_TENSORRT |= {"read"}  # ExportRecord.read and file reads, not IStreamReader.read
NOT_TENSORRT |= {"data"}  # numpy's array.ctypes.data (calibration.py)
NOT_TENSORRT |= {"BUILD"}  # engines.progress.Stage.BUILD (progress.py)


def resolve(path: str) -> Any:
    target = RTX
    for part in path.split(".") if path else ():
        target = getattr(target, part)
    return target


def overloads(function: Any) -> list[list[tuple[str, str, bool]]]:
    """Each overload's parameters after ``self``: (name, annotation, has a default)."""
    doc = function.__doc__ or ""
    found = []
    for line in doc.splitlines():
        m = re.match(r"^(?:\d+\. )?\w+\((.*)\) -> ", line.strip())
        if not m or m.group(1) == "*args, **kwargs":
            continue
        params = []
        for part in re.split(r", (?=\w+: )", m.group(1)):
            name, _, rest = part.partition(": ")
            annotation, _, default = rest.partition(" = ")
            params.append((name, annotation, bool(default)))
        found.append([p for p in params if p[0] != "self"])
    if not found:  # a plain Python function (``nptype``)
        sig = inspect.signature(function)
        found.append([(p.name, "", p.default is not p.empty) for p in sig.parameters.values()])
    return found


def accepts(annotation: str, value: Any) -> bool:
    """Whether pybind11 converts ``value`` to a parameter of ``annotation``."""
    if not annotation:
        return True
    if isinstance(value, Obj):
        return annotation.endswith(value.name) or annotation.endswith(value.name.replace(".", "::"))
    if isinstance(value, bool):
        return annotation == "bool"
    if isinstance(value, int):
        return annotation in ("typing.SupportsInt", "int")
    if isinstance(value, str):
        return annotation == "str"
    if isinstance(value, bytes):
        return annotation.endswith("Buffer")
    if isinstance(value, tuple):
        return annotation in ("tuple", "list") or annotation.endswith(".Dims")
    return False


def takes(function: Any, args: tuple[Any, ...]) -> bool:
    for params in overloads(function):
        if len(params) < len(args) or any(not default for _, _, default in params[len(args) :]):
            continue
        if all(accepts(annotation, value) for (_, annotation, _), value in zip(params, args, strict=False)):
            return True
    return False


@pytest.mark.parametrize(("owner", "member", "use"), CALLS, ids=[f"{c}.{m}" for c, m, _ in CALLS])
def test_each_call_exists_in_tensorrt_rtx_with_the_arguments_used(owner, member, use):
    cls = resolve(owner)
    assert hasattr(cls, member), f"tensorrt_rtx {RTX.__version__} has no {owner}.{member}"
    attr = inspect.getattr_static(cls, member) if owner else getattr(cls, member)
    if use in (PROPERTY, SETTABLE):
        assert isinstance(attr, property), f"{owner}.{member} is not a property"
        assert use == PROPERTY or attr.fset is not None, f"{owner}.{member} cannot be set"
        return
    function = getattr(cls, member)
    assert takes(function, use), f"no overload of {owner}.{member} takes {use}:\n" + "\n".join(
        map(str, overloads(function))
    )


@pytest.mark.parametrize("name", sorted(ENUMS))
def test_enum_members_exist(name):
    enum = resolve(name)
    assert set(ENUMS[name]) <= set(enum.__members__), (
        f"{name} lacks {set(ENUMS[name]) - set(enum.__members__)}"
    )


def test_flavour_diagnostics_names_are_those_of_tensorrt_rtx():
    """The stand-in's invalidity reasons are the real ones with their bit values
    (``validity_problem`` prints their names), and the reasons a rebuild fixes exist."""
    real = {name: int(m) for name, m in RTX.EngineInvalidityDiagnostics.__members__.items()}
    assert {name: int(m) for name, m in trt_standin.EngineInvalidityDiagnostics.__members__.items()} == real
    assert REBUILD_FIXES <= set(real)


def scanned_names() -> tuple[set[str], set[str]]:
    """Names the code reads from the TensorRT module, and every attribute it uses anywhere."""
    module_names, attributes = set(), set()
    for name in SCANNED:
        tree = ast.parse((ROOT / name).read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            attributes.add(node.attr)
            base = node.value
            is_trt = (isinstance(base, ast.Name) and base.id == "trt") or (
                isinstance(base, ast.Attribute) and base.attr == "trt"
            )
            if is_trt:
                module_names.add(node.attr)
    return module_names, attributes


def test_the_table_covers_every_tensorrt_name_the_code_uses():
    """A new TensorRT call in the runtime or builder must join :data:`CALLS` (and be checked)."""
    module_names, attributes = scanned_names()
    tabled = {m for _, m, _ in CALLS} | {c.split(".")[0] for c, _, _ in CALLS if c} | set(ENUMS)
    tabled |= {n.split(".")[0] for n in ENUMS} | FULL_TENSORRT_ONLY | {"__version__"}
    tabled |= {"set_flag", *TENSORRT_10_ONLY, *(m for ms in TENSORRT_10_ONLY.values() for m in ms)}
    assert module_names - tabled == set(), "module names used but not checked"
    members = set()
    for name in dir(RTX):
        cls = getattr(RTX, name)
        if inspect.isclass(cls) and not issubclass(cls, BaseException):
            members |= {m for m in vars(cls) if not m.startswith("_")}
    enum_members = {m for path in ENUMS for m in [*ENUMS[path], *path.split(".")]}
    unchecked = (attributes & members) - tabled - enum_members - NOT_TENSORRT
    assert unchecked == set(), "TensorRT-looking members used but not checked"


def test_tensorrt_rtx_lacks_what_tensorrt_11_removed_and_the_flavour_sees_it():
    """The weak-typing and calibrator names are absent here as in TensorRT 11, and read so.

    This is what lets ``tests/integration/test_tensorrt_versions.py`` present these bindings as 11.4.
    """
    for owner, members in TENSORRT_10_ONLY.items():
        cls = getattr(RTX, owner, None)
        assert cls is None if not members else not any(hasattr(cls, m) for m in members), owner
    flavour = load_flavour("tensorrt-rtx")
    assert not flavour.weakly_typed and not flavour.int8_calibrator


STANDIN = {
    "Runtime": trt_standin.Runtime,
    "ICudaEngine": trt_standin.ICudaEngine,
    "IExecutionContext": trt_standin.IExecutionContext,
    "IRuntimeConfig": trt_standin.IRuntimeConfig,
    "IRuntimeCache": trt_standin.IRuntimeCache,
    "ILogger": trt_standin.ILogger,
    "": trt_standin.FakeTensorRT,
}


@pytest.mark.parametrize(
    ("owner", "member", "use"),
    [c for c in CALLS if c[0] in STANDIN and c[2] not in (PROPERTY, SETTABLE) and c[1] != "log"],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_the_standin_takes_the_same_arguments_with_the_same_names(owner, member, use):
    """The stand-in's methods mirror the real parameters, so the runtime tests prove real calls."""
    function = getattr(STANDIN[owner], member)
    real = [p for p in overloads(getattr(resolve(owner), member)) if len(p) >= len(use)]
    ours = [p for p in inspect.signature(function).parameters if p not in ("self", "trt_type")]
    if member == "nptype":
        return  # a plain function in both (one positional argument)
    assert any([n for n, _, _ in params][: len(ours)] == ours for params in real), (member, ours, real)
