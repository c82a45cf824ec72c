"""``assistant bench [NAME] ARGS``: a benchmark of the ``bench`` package, with its own flags."""

from __future__ import annotations


def bench_command(argv: list[str]) -> int:
    """Run ``bench.NAME``'s ``main`` with the rest of ``argv`` (``bench`` ships with the package)."""
    import bench  # lazily: only 'assistant bench' needs it

    return int(bench.run(argv))
