"""``assistant bench``: the decoder benchmark, ``scripts/bench_decoder.py``, with its own flags."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_decoder.py"


def bench_command(argv: list[str]) -> int:
    """Run the benchmark script's ``main`` with ``argv`` (it ships with the source checkout)."""
    if not BENCH_SCRIPT.is_file():
        print(
            f"error: {BENCH_SCRIPT} not found; 'assistant bench' needs the source checkout", file=sys.stderr
        )
        return 2
    sys.path.insert(0, str(BENCH_SCRIPT.parent))  # the script imports its sibling modules
    spec = importlib.util.spec_from_file_location("bench_decoder", BENCH_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return int(module.main(argv))
