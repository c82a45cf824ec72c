"""TensorRT-RTX engines of the new families, built on the CPU (no GPU here; nothing runs them).

Each family's fp16 ONNX export (sliding-window masks, per-layer RoPEs, soft-caps, longrope's
``where``, fused Phi-3 weights) must parse and build into a real SM89 engine. The engines'
numerics are the ONNX graph's, checked against transformers through ONNX Runtime in
tests/unit/test_model_families_onnx.py; running an engine needs an RTX-class GPU (docs/engines.md).
"""

from __future__ import annotations

import onnx
import pytest

from engines.onnx_export import ExportOptions, export_decoder
from engines.tensorrt.builder import build_engine
from tests.helpers.engines import TINY
from tests.helpers.families import FAMILIES, save_family


@pytest.mark.parametrize("name", list(FAMILIES))
def test_new_family_fp16_export_builds_a_real_rtx_engine(name, tmp_path):
    save_family(name, tmp_path / "model")
    exported = export_decoder(tmp_path / "model", ExportOptions(dtype="fp16"))
    ops = {n.op_type for n in onnx.load(str(exported.path), load_external_data=False).graph.node}
    assert not ops & {"NonZero", "Unique", "Loop", "If", "Scan", "ScatterND", "ScatterElements"}
    built = build_engine(exported, TINY, tmp_path / "engines")
    print(f"{name}: TensorRT-RTX SM89 engine built in {built.build_s:.1f} s, {built.size_bytes} bytes")
    assert not built.cache_hit and built.path.stat().st_size == built.size_bytes > 0
    assert built.record["targets"] == ["sm89"]
