"""Hugging Face hub models, asked for by name: ``hf:org/name[@revision]``.

A hub model is downloaded once into the store (``<store>/models/hf--org--name``) at the
commit the revision resolved to, and that commit is recorded in the folder's manifest
(``assistant-model.json``: ``"source": "hf:org/name@<commit>"``). Later starts use that
copy without the network, pinned: ``hf:org/name`` never moves to a newer commit by itself.
Naming a revision (a branch, tag or commit) that is not the pinned commit downloads again;
``hf:org/name@main`` therefore updates to the newest commit.
"""

from __future__ import annotations

import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from models.files import ModelNotFound, check_model_dir
from store.bundled import ModelStore
from store.leftovers import staging_folder
from store.records import MANIFEST, check_model, publish_folder, read_manifest

logger = logging.getLogger(__name__)

PREFIX = "hf:"
FORM = "hf:org/name or hf:org/name@revision"
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_COMMIT = re.compile(r"[0-9a-f]{7,40}")


@dataclass(frozen=True)
class HubModel:
    """A hub repository and the revision asked for (None: the pinned copy, else ``main``)."""

    repo_id: str
    revision: str | None

    @property
    def store_name(self) -> str:
        """The model's folder name in the store."""
        return "hf--" + self.repo_id.replace("/", "--")


def parse_hub_name(name: str) -> HubModel:
    """``hf:org/name[@revision]`` as a :class:`HubModel`.

    Raises:
        ModelNotFound: Not of that form.
    """
    repo_id, at, revision = name.removeprefix(PREFIX).partition("@")
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_PART.fullmatch(p) for p in parts) or (at and not revision):
        raise ModelNotFound(f"{name!r} is not a Hugging Face model name; write {FORM}")
    return HubModel(repo_id, revision or None)


def pinned_revision(folder: Path) -> str | None:
    """The commit a stored hub model was downloaded at (None: not stored, or not from the hub)."""
    revision = read_manifest(folder).get("revision")
    return revision if isinstance(revision, str) else None


def hub_model_dir(model: HubModel, store: ModelStore) -> Path:
    """The store folder of ``model``, downloading it (online) unless the pinned copy fits.

    Raises:
        ModelNotFound: The download failed (offline, unknown repository or revision), or the
            repository is not a safetensors model.
    """
    target = store.path(model.store_name)
    pinned = pinned_revision(target)
    asked = model.revision
    if pinned and (asked is None or (_COMMIT.fullmatch(asked) is not None and pinned.startswith(asked))):
        check_model(target)
        return target
    return _download(model, store, target)


def _download(model: HubModel, store: ModelStore, target: Path) -> Path:
    from huggingface_hub import model_info, snapshot_download

    revision = model.revision or "main"
    logger.warning("downloading %s@%s from the Hugging Face hub into %s", model.repo_id, revision, target)
    with staging_folder(store.models_dir, model.store_name) as tmp:
        staged = tmp / "out"
        try:
            commit = model_info(model.repo_id, revision=revision).sha
            if not commit:
                raise ValueError(f"the hub named no commit for revision {revision!r}")
            # Download the commit just resolved, so what is recorded is exactly what came.
            snapshot_download(model.repo_id, revision=commit, local_dir=staged, allow_patterns=ALLOW_PATTERNS)
        except Exception as e:  # the hub client raises many unrelated types for offline/unknown
            raise ModelNotFound(
                f"could not download {PREFIX}{model.repo_id}@{revision} from the Hugging Face hub ({e}); "
                "check the network (and that HF_HUB_OFFLINE is not set), or use a local folder"
            ) from e
        shutil.rmtree(staged / ".cache", ignore_errors=True)  # the hub client's download notes
        try:
            check_model_dir(staged)
        except ModelNotFound as e:
            raise ModelNotFound(
                f"{PREFIX}{model.repo_id}@{commit} is not a safetensors model "
                "(no config.json or no *.safetensors weights)"
            ) from e
        manifest = {
            "kind": "llm",
            "source": f"{PREFIX}{model.repo_id}@{commit}",
            "repo_id": model.repo_id,
            "revision": commit,
            "requested_revision": revision,
        }
        publish_folder(staged, target, record=(MANIFEST, manifest))
    logger.warning("%s: pinned to commit %s", target.name, commit)
    return target
