"""The model store's folder, checked once the settings are read: a file in its path is named.

``$XDG_CACHE_HOME`` (or ``--store``) naming a file made ``models fetch`` print a bare
``[Errno 20] Not a directory`` and ``chat`` say the model was not fetched; a path whose existing
part is a file can never become a folder, so it is said at start, with where the path came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


class StorePathError(ValueError):
    """The model store's path runs through a file (the message names it, and the fix)."""


def check_store_dir(store_dir: Path, where: str | None, env: Mapping[str, str]) -> None:
    """Refuse a store path that runs through a file.

    Args:
        store_dir: ``[models] store_dir``.
        where: Where it was set (config file, ``$ASSISTANT_MODELS_STORE_DIR``, ``command line``),
            ``None`` for the default (``$XDG_CACHE_HOME/assistant`` or ``~/.cache/assistant``).
        env: The environment the default was read from.

    Raises:
        StorePathError: A part of the path exists and is not a folder.
    """
    store = store_dir.expanduser()
    blocking = next((p for p in (store, *store.parents) if p.exists()), None)
    if blocking is None or blocking.is_dir():
        return
    problem = f"the model store {store} cannot be created: {blocking} is a file, not a folder"
    if where is not None:
        raise StorePathError(f"{where}: [models] store_dir (--store): {problem}; choose a folder")
    if env.get("XDG_CACHE_HOME"):
        raise StorePathError(
            f"$XDG_CACHE_HOME={env['XDG_CACHE_HOME']}: {problem} (the store is $XDG_CACHE_HOME/assistant); "
            "set XDG_CACHE_HOME to a folder or unset it, or choose the store with --store DIR"
        )
    raise StorePathError(f"{problem}; choose the store with --store DIR")
