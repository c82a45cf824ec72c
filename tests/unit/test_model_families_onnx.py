"""Every supported family through the ONNX export and ONNX Runtime, against transformers.

The same tiny random models as tests/unit/test_model_families.py (tests/helpers/families.py): the graph's
sliding-window masks, per-layer RoPEs, soft-caps, fused Phi-3 weights and longrope (whose
switch the 32 generated tokens cross: the driver then runs the whole sequence again) must give
transformers' greedy tokens and logits.
"""

from __future__ import annotations

import pytest

from engines.onnxruntime_backend import OnnxRuntimeOptions, load_onnxruntime_decoder
from tests.helpers.families import (
    FAMILIES,
    Family,
    NoTokenizer,
    family_prompt,
    greedy_run,
    reference_family,
    rel_err,
)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory) -> Family:
    return reference_family(request.param, tmp_path_factory.mktemp(request.param))


def test_family_through_onnxruntime_matches_transformers(family):
    options = OnnxRuntimeOptions(dtype="fp32", threads=1, capacity_tokens=128)
    driver = load_onnxruntime_decoder(family.folder, NoTokenizer(), options)
    tokens, logits = greedy_run(driver, family_prompt())
    errors = [rel_err(g, e) for g, e in zip(logits, family.logits, strict=True)]
    print(f"{family.name} onnxruntime: max logits rel err {max(errors):.1e}")
    assert tokens == family.tokens
    assert max(errors) < 1e-4


def test_family_fp16_graph_stays_close_to_transformers_fp32(family):
    """The fp16 graph (what TensorRT builds from): soft-caps, (1 + w) norms and masks in half
    precision, teacher-forced on transformers' tokens so both see the same inputs."""
    options = OnnxRuntimeOptions(dtype="fp16", threads=1, capacity_tokens=128)
    driver = load_onnxruntime_decoder(family.folder, NoTokenizer(), options)
    driver.reset()
    logits = [driver.prefill(family_prompt())] + [driver.decode(t) for t in family.tokens[:-1]]
    errors = [rel_err(g, e) for g, e in zip(logits, family.logits, strict=True)]
    agree = sum(int(g.argmax() == e.argmax()) for g, e in zip(logits, family.logits, strict=True))
    print(f"{family.name} onnxruntime fp16: max logits rel err {max(errors):.1e}, top-1 {agree}/32")
    assert max(errors) < 2e-2
    assert agree >= 28
