"""Which precision builds on which TensorRT version (issue 14, defects 2 and 10).

TensorRT 11 removed the weakly typed precision flags and the INT8 calibrator, so what a
precision needs is decided from the imported module (``flavour.export_dtype``): a table test
of that decision, real TensorRT-RTX builds (bf16 from a bf16 export), and the ``engine build``
command run against TensorRT 11's API (:class:`TensorRT11`). Everything here runs on the CPU
with the tiny random-weight model (a build takes ~2 s).
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest
import torch

from assistant.__main__ import main
from engines.onnx_export import ExportOptions, export_decoder
from engines.tensorrt import builder, cache, calibration
from engines.tensorrt.cuda_mem import GpuInfo
from engines.tensorrt.flavour import Flavour, UnsupportedPrecision, export_dtype, load_flavour
from engines.tensorrt.options import EngineOptions
from tests.helpers.families import copy_tokenizer, qwen2

RTX = load_flavour("tensorrt-rtx")  # a dev dependency: CI has it, so no skip
TINY = EngineOptions(
    prefill_opt_tokens=16, prefill_max_tokens=64, context_opt_tokens=64, context_max_tokens=256
)
GPU = GpuInfo("NVIDIA stand-in", (8, 9), 8 << 30)  # full TensorRT builds on "its" GPU


class TensorRT11(types.ModuleType):
    """The real TensorRT-RTX bindings presented as the ``tensorrt`` module, version 11.4.0.

    TensorRT 11 cannot be installed here (PyPI's ``tensorrt`` only fetches its libraries from
    NVIDIA's index), but the installed ``tensorrt_rtx`` 1.7 bindings lack exactly what 11
    removed (``BuilderFlag.FP16/BF16/INT8``, ``IInt8EntropyCalibrator2``, ``int8_calibrator``,
    ``set_calibration_profile``) and have the builder, parser, profile and timing-cache calls the
    builder makes on full TensorRT. Every attribute is the real one; only the module's name and
    version differ. It proves which calls the builder makes, not how TensorRT 11 builds.
    """

    def __init__(self, real: types.ModuleType) -> None:
        super().__init__("tensorrt")
        self.__version__ = "11.4.0"
        self._real = real

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)


def tensorrt10(version: str = "10.13.3.9") -> SimpleNamespace:
    """The names TensorRT 10.x has and 11 removed (nothing more: the decision reads only them)."""
    return SimpleNamespace(
        __version__=version,
        BuilderFlag=SimpleNamespace(FP16=1, BF16=2, INT8=3),
        IInt8EntropyCalibrator2=object,
        IBuilderConfig=SimpleNamespace(int8_calibrator=None, set_calibration_profile=None),
    )


FLAVOURS = {
    "TensorRT 10.13": Flavour("tensorrt", tensorrt10(), "10.13.3.9"),
    "TensorRT 11.4": Flavour("tensorrt", TensorRT11(RTX.trt), "11.4.0"),
    # An 11.x that still had 10's names would get the same answer: the version decides too.
    "TensorRT 11.4 with 10's names": Flavour("tensorrt", tensorrt10("11.4.0"), "11.4.0"),
    "TensorRT-RTX 1.7": RTX,
}
# (export dtype, strongly typed), or the start of the refusal. docs/engines.md shows this table.
STRONG_ONLY = {"fp32": ("fp32", True), "fp16": ("fp16", True), "bf16": ("bf16", True)}
EXPECTED = {
    "TensorRT 10.13": {**STRONG_ONLY, "bf16": ("fp32", False), "int8": ("fp32", False)},
    "TensorRT 11.4": {**STRONG_ONLY, "int8": "TensorRT 11.4 has no INT8 calibrator: "},
    "TensorRT 11.4 with 10's names": {**STRONG_ONLY, "int8": "TensorRT 11.4 has no INT8 calibrator: "},
    "TensorRT-RTX 1.7": {**STRONG_ONLY, "int8": "TensorRT-RTX 1.7 has no INT8 calibrator: "},
}


@pytest.mark.parametrize("name", sorted(FLAVOURS))
def test_what_each_precision_is_built_from_on_each_version(name):
    flavour = FLAVOURS[name]
    for precision, expected in EXPECTED[name].items():
        if isinstance(expected, tuple):
            assert export_dtype(flavour, precision) == expected, precision
            continue
        with pytest.raises(UnsupportedPrecision) as info:
            export_dtype(flavour, precision)
        message = str(info.value)
        assert message.startswith(expected) and "\n" not in message
        assert "--precision fp16" in message and "tensorrt>=10.4,<11" in message
    assert flavour.label == name.split(" with")[0]


@pytest.fixture
def tiny_model(tmp_path, model_dir):
    """A random-weight Qwen2 folder with SmolLM2's tokenizer files (what int8 calibration reads)."""
    torch.manual_seed(0)
    folder = tmp_path / "tiny-model"
    qwen2().save_pretrained(folder)
    return copy_tokenizer(model_dir, folder)


def test_bf16_builds_a_real_strongly_typed_tensorrt_rtx_engine(tiny_model, tmp_path):
    exported = export_decoder(tiny_model, ExportOptions(dtype="bf16"))
    built = builder.build_engine(
        exported, EngineOptions(**{**TINY.__dict__, "targets": "sm89", "precision": "bf16"}), tmp_path
    )
    r = built.record
    assert (r["precision"], r["strongly_typed"], r["onnx"]["dtype"]) == ("bf16", True, "bf16")
    assert built.size_bytes > 0 and cache.check_entry(built.path.parent, r) is None


def engine_build(capsys, folder, store, precision):
    """``assistant engine build --flavour tensorrt --precision ...`` in this process."""
    argv = ["engine", "build", "--flavour", "tensorrt", "--precision", precision]
    code = main([*argv, "--model", str(folder), "--store", str(store)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def tensorrt11(monkeypatch):
    """``import tensorrt`` gives :class:`TensorRT11`; the build sees an SM89 GPU (none is here)."""
    monkeypatch.setitem(sys.modules, "tensorrt", TensorRT11(RTX.trt))
    monkeypatch.setattr(builder, "gpu_info", lambda: GPU)


def test_tensorrt_11_builds_bf16_strongly_typed(tensorrt11, tiny_model, tmp_path, capsys):
    """Before the fix: AttributeError, BuilderFlag has no BF16 (TensorRT 11 removed it)."""
    code, out, err = engine_build(capsys, tiny_model, tmp_path / "store", "bf16")
    assert code == 0, err
    assert "(tensorrt 11.4.0 sm89 bf16," in out
    (entry,) = cache.list_entries(tmp_path / "store" / "engines")
    assert entry.problem is None and entry.record["strongly_typed"] is True
    assert entry.record["onnx"]["dtype"] == "bf16"


def test_tensorrt_11_refuses_int8_in_one_line_before_exporting(tensorrt11, tiny_model, tmp_path, capsys):
    """Before the fix: AttributeError, no IInt8EntropyCalibrator2 (after an fp32 export)."""
    code, out, err = engine_build(capsys, tiny_model, tmp_path / "store", "int8")
    assert code == 2 and not out
    assert err.startswith("error: TensorRT 11.4 has no INT8 calibrator: ") and err.count("\n") == 1
    assert "build --precision fp16" in err
    assert not (tiny_model / "onnx").exists()  # nothing exported
    assert not (tmp_path / "store" / "engines").exists()


def test_calibration_cache_is_keyed_by_chunk_length_and_tensorrt_version(tmp_path, monkeypatch):
    """Defect 10: scales from another chunk length or TensorRT version are never reused."""
    torch.manual_seed(0)
    qwen2().save_pretrained(tmp_path / "tiny")
    exported = export_decoder(tmp_path / "tiny", ExportOptions(dtype="fp32"))
    paths = []

    def calibrator(trt, ids, cache_path, length_tokens):
        paths.append(cache_path)
        return SimpleNamespace(length_tokens=length_tokens, free=lambda: None)

    monkeypatch.setattr(calibration, "make_calibrator", calibrator)
    monkeypatch.setattr(builder, "compile_engine", lambda *args: b"engine")  # no TensorRT 10 here
    ids = [list(range(40))] * 8
    for version, opt_tokens in (("10.8.0.43", 16), ("10.8.0.43", 32), ("10.9.0.34", 32)):
        monkeypatch.setattr(builder, "load_flavour", lambda name, v=version: Flavour(name, tensorrt10(v), v))
        options = EngineOptions(flavour="tensorrt", precision="int8", prefill_opt_tokens=opt_tokens)
        built = builder.build_engine(
            exported, options, tmp_path / "engines", flavour_name="tensorrt", calibration_ids=ids, gpu=GPU
        )
        assert not built.cache_hit
    assert len(set(paths)) == 3, [p.name for p in paths]
    assert "-16tok-" in paths[0].name and paths[2].name.endswith("-tensorrt-10.9.0.34.bin")
    again = builder.build_engine(
        exported, options, tmp_path / "engines", flavour_name="tensorrt", calibration_ids=ids, gpu=GPU,
        force=True,
    )  # fmt: skip
    assert again.path == built.path and paths[-1] == paths[2]  # same length and version: same scales
