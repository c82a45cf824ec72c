"""``assistant models fetch | list``: the bundled models, fetched, checked or listed."""

from __future__ import annotations

import argparse

from assistant.config import Settings


def models_command(args: argparse.Namespace, settings: Settings) -> int:
    """Fetch (``--check``: verify) the bundled models, or list the stored ones; returns the exit status."""
    from store.bundled import BUNDLED, ModelStore

    store = ModelStore(settings.models.store_dir)
    # By default the models every run needs; the Piper voice too when it is configured or present.
    piper = settings.tts.piper_voice if settings.tts.engine == "piper" else ""
    default = [n for n, m in BUNDLED.items() if not m.optional or n == piper]
    if args.models_command == "fetch" and args.check:
        intact = True
        present = [n for n, m in BUNDLED.items() if m.optional and n not in default and store.is_present(n)]
        for name in args.names or default + present:
            ok, line = store.verify(name)
            intact &= ok
            print(line)
        return 0 if intact else 1
    if args.models_command == "fetch":
        for name in args.names or default:
            store.fetch(name, force=args.force)
        return 0
    stored = store.list()
    if not stored:
        print(f"no models in {store.models_dir}; run 'assistant models fetch'")
    for m in stored:
        print(f"{m.name:28} {m.kind:4} {m.size_bytes / 1e6:8.1f} MB  {m.source:28} {m.path}")
    missing = [n for n in BUNDLED if not store.is_present(n)]
    if missing:
        names = [n + (" (optional)" if BUNDLED[n].optional else "") for n in missing]
        print(f"bundled but not fetched: {', '.join(names)}")
    if any(BUNDLED[n].kind == "tts" for n in missing):
        print("the Piper voice is for --tts piper: scripts/setup.sh --piper installs it and piper-tts")
    return 0
