"""Hub-like names are not downloaded; torch.compile's pickles stay out of the model folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from assistant.config import DecoderSettings, ModelSettings
from assistant.stages.llm import resolve_llm_dir
from engines.base import Backend, BackendIdentity
from models.weights import ModelNotFound

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_folder_named_like_org_slash_name_is_not_downloaded_from_the_hub(tmp_path, monkeypatch):
    import huggingface_hub

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was asked for a name the user did not mark as a hub model")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    monkeypatch.setattr(huggingface_hub, "model_info", no_hub)
    with pytest.raises(ModelNotFound) as caught:
        resolve_llm_dir(ModelSettings(store_dir=tmp_path, llm="someorg/somemodel"))
    message = str(caught.value)
    assert "no such folder someorg/somemodel" in message and "use hf:someorg/somemodel" in message
    assert "assistant models fetch" in message

    out = subprocess.run(
        [sys.executable, "-m", "assistant", "chat", "--store", str(tmp_path), "--model", "someorg/somemodel"],
        input="hi\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},  # even on old code, no real download here
        timeout=300,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "error: no such folder someorg/somemodel" in out.stderr and "hf:someorg/somemodel" in out.stderr


def test_torch_compile_keeps_its_pickles_in_the_store_not_in_the_model_folder(
    tmp_path, monkeypatch, model_dir
):
    """--compile (CUDA graphs faked: no GPU here) puts Inductor's cache under the store, per model."""
    from assistant.stages.llm import load_llm
    from engines import torch_backend

    class NoGraphs:  # stands in for the CUDA-graph step: nothing is compiled here
        name = "fake cuda-graph+compile"
        identity = BackendIdentity(Backend.PYTORCH, "cuda", "fp32", "cuda-graph+compile")

        def __init__(self, model, capacity, options):
            assert options.compile
            self.capacity_tokens = capacity

        def close(self) -> None:
            """Nothing to free."""

    monkeypatch.setattr(torch_backend, "use_cuda_graph", lambda options, device: True)
    monkeypatch.setattr(torch_backend, "CudaGraphStep", NoGraphs)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "restored after the test")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    store_dir = tmp_path / "store"
    models = ModelSettings(store_dir=store_dir, llm=str(model_dir))
    decoder = DecoderSettings(backend="pytorch", device="cpu", dtype="fp32", compile=True, threads=2)
    load_llm(models, decoder)

    cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).resolve()
    assert not cache.is_relative_to(model_dir.resolve()), f"compile cache inside the model folder: {cache}"
    assert cache.is_relative_to(store_dir.resolve() / "torch-compile") and cache.is_dir()
    assert not (model_dir / "torch-compile").exists()

    from assistant.stages.llm import compile_cache_dir

    twin = tmp_path / "twin"
    twin.mkdir()
    (twin / "config.json").symlink_to(model_dir / "config.json")
    assert compile_cache_dir(models, twin) != compile_cache_dir(models, model_dir)  # keyed per model
    assert compile_cache_dir(models, model_dir).resolve() == cache
