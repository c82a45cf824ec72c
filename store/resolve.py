"""Resolve once: the configured LLM name to a checked folder and its parsed config.

The one LLM resolver of the app (store name, local folder, GGUF file, ``hf:org/name``);
``assistant.stages.llm`` calls it once a start and passes the result (:class:`ResolvedLlm`)
down to the tokenizer and the backends, so ``config.json`` is parsed once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from models.config import DecoderConfig
from models.files import FETCH_HINT, ModelNotFound
from models.shapes import check_sizes
from store.bundled import BUNDLED, ModelStore
from store.gguf_import import find_gguf
from store.hub import PREFIX as HUB_PREFIX
from store.hub import hub_model_dir, parse_hub_name
from store.records import check_model, repair_hints

GgufDir = Callable[[Path, ModelStore], Path]  # a GGUF file -> its converted store folder


@dataclass(frozen=True)
class ResolvedLlm:
    """The LLM of one start: its checked folder and its parsed ``config.json``."""

    path: Path
    config: DecoderConfig


def resolve_llm_path(store: ModelStore, name: str, gguf_dir: GgufDir) -> Path:
    """Folder of the LLM ``name``: store name, local folder, GGUF file or ``hf:org/name[@rev]``.

    A local folder may be a Hugging Face folder or one holding exactly one ``.gguf`` file.
    The folder's recorded files are checked cheaply (:func:`store.records.check_model`).

    A hub model is downloaded only when named so, once, into the store, pinned to a commit
    (:mod:`store.hub`); a name that is no folder is never taken for a hub id. A GGUF goes to
    ``gguf_dir`` (converted once into the store: :mod:`store.gguf_import`).

    Raises:
        ModelNotFound: Nothing usable under that name, with the command that fixes it.
        CorruptModel, UnsupportedModel, FetchError: A damaged folder, a GGUF that cannot be
            converted, or a store that cannot take it (each names the fix).
    """
    if name.startswith(HUB_PREFIX):
        return hub_model_dir(parse_hub_name(name), store)
    local = Path(name).expanduser()
    gguf = find_gguf(local)
    if gguf is not None or local.suffix.lower() == ".gguf":
        return gguf_dir(gguf or local, store)
    if local.is_dir():
        check_model(local)
        return local
    if store.is_present(name):
        check_model(store.path(name))  # also the cheap check of the recorded files
        return store.path(name)
    if name in BUNDLED:
        raise ModelNotFound(f"model {name!r} is not in the store {store.models_dir}: {FETCH_HINT}")
    hub_form = f"{HUB_PREFIX}{name}" if name.count("/") == 1 else f"{HUB_PREFIX}org/name"
    raise ModelNotFound(
        f"no such folder {local} and no stored model {name!r}; for a Hugging Face model use {hub_form} "
        "(downloaded once, online); for the bundled models run 'assistant models fetch'"
    )


def resolve_llm(store: ModelStore, name: str, gguf_dir: GgufDir) -> ResolvedLlm:
    """:func:`resolve_llm_path`, and the folder's config read once (with the fix when damaged).

    The config's sizes are checked against the weight files' headers (:func:`models.shapes.check_sizes`)
    before anything reads the tokenizer or builds a layer.

    Raises:
        ModelNotFound, CorruptModel, UnsupportedModel, FetchError: As :func:`resolve_llm_path`.
        InvalidConfig: ``config.json`` is not JSON, lacks a setting, or has a size the weights
            do not have (names the setting, the files and the fix).
    """
    path = resolve_llm_path(store, name, gguf_dir)
    with repair_hints(path):
        config = DecoderConfig.from_dir(path)
        check_sizes(path, config)
        return ResolvedLlm(path, config)
