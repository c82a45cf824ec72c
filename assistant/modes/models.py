"""``assistant models fetch | list | verify``: the model store from the command line (no torch)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from assistant.config import Settings
from store.bundled import BUNDLED, ModelStore
from store.leftovers import abandoned_staging, folder_bytes
from store.records import MANIFEST, recorded_files


@dataclass(frozen=True)
class Checked:
    """One row of ``assistant models verify``: what was hashed, and what to do if it is damaged."""

    kind: str  # "model", "onnx" or "engine"
    name: str
    problem: str | None  # None: every byte matches the record
    fix: str = ""


def run_models(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``assistant models ...``; returns the exit status."""
    store = ModelStore(settings.models.store_dir)
    # By default the models every run needs; the Piper voice too when it is configured or present.
    piper = settings.tts.piper_voice if settings.tts.engine == "piper" else ""
    default = [n for n, m in BUNDLED.items() if not m.optional or n == piper]
    if args.models_command == "verify":
        return _print_verified(verify_store(store))
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
    return _list(store)


def _list(store: ModelStore) -> int:
    stored = store.list()
    if not stored:
        print(f"no models in {store.models_dir}; run 'assistant models fetch'")
    for m in stored:
        print(f"{m.name:28} {m.kind:4} {m.size_bytes / 1e6:8.1f} MB  {m.source:28} {m.path}")
    missing = [n for n in BUNDLED if not store.is_present(n)]
    if missing:
        names = [n + (" (optional)" if BUNDLED[n].optional else "") for n in missing]
        print(f"bundled but not fetched: {', '.join(names)}")
    for staged in abandoned_staging(store.models_dir):
        print(
            f"left by an interrupted fetch: {staged} ({folder_bytes(staged) / 1e6:.0f} MB); the next "
            "'assistant models fetch' or 'assistant engine clear' removes it"
        )
    if any(BUNDLED[n].kind == "tts" for n in missing):
        print("the Piper voice is for --tts piper: scripts/setup.sh --piper installs it and piper-tts")
    return 0


def verify_store(store: ModelStore) -> list[Checked]:
    """Hash every recorded file of every stored model, ONNX export and TensorRT engine.

    A start checks these by size, modification time and (for models) a sampled sha256 only;
    this reads every byte, so it also finds a byte changed in place with the mtime kept.
    """
    from engines.onnx_export import check_export  # onnx only: no torch
    from engines.tensorrt.cache import list_entries

    rows: list[Checked] = []
    for folder in sorted(p.parent for p in store.models_dir.glob(f"*/{MANIFEST}")):
        intact, line = store.verify(folder.name)
        try:
            unrecorded = recorded_files(folder) is None
        except ValueError:
            unrecorded = False
        problem = None if intact else line.split(": ", 1)[-1]
        if problem and not unrecorded and "; " in problem:  # "DAMAGED: <what>; <fix>"
            problem, fix = problem.removeprefix("DAMAGED: ").rsplit("; ", 1)
        else:
            fix = ""
        rows.append(Checked("model", folder.name, problem, fix))
        for export in sorted(p.parent for p in (folder / "onnx").glob("*/export.json")):
            fix = f"the next start exports it again (or delete {export})"
            rows.append(
                Checked("onnx", f"{folder.name}/onnx/{export.name}", check_export(export, full=True), fix)
            )
    engines = store.root / "engines"
    for entry in list_entries(engines, full=True):
        fix = "the next build rebuilds it; 'assistant engine clear --broken' removes it"
        rows.append(Checked("engine", f"engines/{entry.folder.name}", entry.problem, fix))
    return rows


def _print_verified(rows: list[Checked]) -> int:
    """Print the table of :func:`verify_store`; 1 when something is damaged."""
    if not rows:
        print("nothing stored to verify; run 'assistant models fetch'")
        return 0
    width = max(len(r.name) for r in rows)
    print(f"{'KIND':6}  {'NAME':{width}}  STATUS")
    for r in rows:
        status = (
            "OK"
            if r.problem is None
            else f"DAMAGED: {r.problem}" + (f"\n{'':{width + 8}}  fix: {r.fix}" if r.fix else "")
        )
        print(f"{r.kind:6}  {r.name:{width}}  {status}")
    damaged = [r for r in rows if r.problem is not None]
    print(f"{len(rows) - len(damaged)} OK, {len(damaged)} damaged" + (": exit status 1" if damaged else ""))
    return 1 if damaged else 0
