"""ONNX Runtime's optimized graph of an export (engines/onnxruntime_graph.py), on a tiny graph.

The real exports' optimized graphs (tests/integration/test_onnx_backend.py) keep every weight
as it was; here a weight the optimizer changed and one it added are made by hand, as a future
ONNX Runtime could, to check where each goes and that a real session then computes with them.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from engines import onnxruntime_graph
from engines.onnx_export import DATA_FILE, GRAPH_FILE
from engines.onnxruntime_graph import ORT_DATA_FILE, ORT_GRAPH_FILE, graph_to_load, write_optimized_graph

RNG = np.random.default_rng(0)
A, B = (RNG.standard_normal((16, 16)).astype(np.float32) for _ in range(2))  # 1 KB each: external
X = RNG.standard_normal((2, 16)).astype(np.float32)


def tiny_export(folder, a=A, b=B, extra=None):
    """``y = x @ a + x @ b (+ extra)``, its weights in ``folder/decoder.onnx.data``."""
    inits = [numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b")]
    nodes = [helper.make_node("MatMul", ["x", "a"], ["xa"]), helper.make_node("MatMul", ["x", "b"], ["xb"])]
    nodes.append(helper.make_node("Add", ["xa", "xb"], ["y" if extra is None else "s"]))
    if extra is not None:
        inits.append(numpy_helper.from_array(extra, "c"))
        nodes.append(helper.make_node("Add", ["s", "c"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(folder / GRAPH_FILE), save_as_external_data=True, location=DATA_FILE,
                    size_threshold=1024)  # fmt: skip
    return folder


def run(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]


def test_the_optimized_graph_points_into_the_exports_weights_and_computes_the_same(tmp_path):
    folder = tiny_export(tmp_path / "export")
    write_optimized_graph(folder)
    assert sorted(p.name for p in folder.iterdir()) == [GRAPH_FILE, DATA_FILE, ORT_GRAPH_FILE]
    graph = onnx.load(str(folder / ORT_GRAPH_FILE), load_external_data=False)
    locations = {
        t.name: {e.key: e.value for e in t.external_data}["location"]
        for t in graph.graph.initializer
        if t.data_location == TensorProto.EXTERNAL
    }
    assert locations == {"a": DATA_FILE, "b": DATA_FILE}
    assert np.array_equal(run(folder / ORT_GRAPH_FILE), run(folder / GRAPH_FILE))
    assert graph_to_load(folder) == (folder / ORT_GRAPH_FILE, "optimized graph")


def test_a_weight_the_optimizer_changed_goes_in_a_file_of_its_own_and_a_small_new_one_in_the_graph(tmp_path):
    """As if the optimizer had rewritten ``b`` and added a small constant ``c``: the optimized
    graph is made by hand (a second export with those weights) and rewritten as ONNX Runtime's."""
    folder = tiny_export(tmp_path / "export")
    changed, extra = B * 2, np.ones(16, np.float32)  # extra: 64 bytes, under INLINE_BYTES
    staged = tiny_export(tmp_path / "staged", b=changed, extra=extra)
    graph = onnx.load(str(staged / GRAPH_FILE), load_external_data=False)
    original = onnxruntime_graph._external(onnx.load(str(folder / GRAPH_FILE), load_external_data=False))
    with (
        onnxruntime_graph._mapped(folder / DATA_FILE) as weights,
        onnxruntime_graph._mapped(staged / DATA_FILE) as optimized,
    ):
        onnxruntime_graph._point_into_the_export(graph, original, weights, optimized, folder / ORT_DATA_FILE)
    onnx.save_model(graph, str(folder / ORT_GRAPH_FILE))
    where = {
        t.name: {e.key: e.value for e in t.external_data}.get("location", "in the graph")
        for t in graph.graph.initializer
    }
    assert where == {"a": DATA_FILE, "b": ORT_DATA_FILE, "c": "in the graph"}
    assert (folder / ORT_DATA_FILE).stat().st_size == changed.nbytes
    np.testing.assert_allclose(run(folder / ORT_GRAPH_FILE), X @ A + X @ changed + extra, rtol=1e-5)
