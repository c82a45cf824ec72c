"""Where the test suite's time and CPU go: a pytest plugin, and the table of what it recorded.

Each test's wall time and CPU time (its worker's own, and its subprocesses': the app runs as
one) go to a file per worker in ``$SUITE_CPU_DIR`` (default ``/tmp/suite-cpu``); then the
table per worker and the files that took the most CPU:

    SUITE_CPU_DIR=/tmp/suite-cpu bash scripts/test.sh -q -p bench.suite_cpu
    python -m bench.suite_cpu --dir /tmp/suite-cpu --files 30
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import defaultdict
from pathlib import Path

import pytest

DEFAULT_DIR = "/tmp/suite-cpu"


def _cpu_s() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Time the test's whole protocol (set-up, call, tear-down) and append it to this worker's file."""
    start, (own, children) = time.monotonic(), _cpu_s()
    try:
        return (yield)
    finally:
        own_after, children_after = _cpu_s()
        record = {
            "id": item.nodeid,
            "start": start,
            "wall": time.monotonic() - start,
            "self": own_after - own,
            "children": children_after - children,
            "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
        }
        folder = Path(os.environ.get("SUITE_CPU_DIR", DEFAULT_DIR))
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / f"cpu-{os.getpid()}.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path(DEFAULT_DIR))
    parser.add_argument("--files", type=int, default=30, help="the files that took the most CPU")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for f in sorted(args.dir.glob("cpu-*.jsonl")) for line in f.open()]
    if not rows:
        parser.error(f"nothing recorded in {args.dir}: run the suite with -p bench.suite_cpu first")
    t0 = min(r["start"] for r in rows)
    print("| worker | tests | last ended (s) | wall summed (s) | own CPU (s) | subprocesses' CPU (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for worker in sorted({r["worker"] for r in rows}):
        mine = [r for r in rows if r["worker"] == worker]
        ended = max(r["start"] + r["wall"] for r in mine) - t0
        wall, own, sub = (sum(r[k] for r in mine) for k in ("wall", "self", "children"))
        print(f"| {worker or '-'} | {len(mine)} | {ended:.0f} | {wall:.0f} | {own:.0f} | {sub:.0f} |")
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for r in rows:
        totals = files[r["id"].split("::")[0]]
        for i, k in enumerate(("wall", "self", "children")):
            totals[i] += r[k]
    print("\n| file | wall (s) | own CPU (s) | subprocesses' CPU (s) |\n|---|---:|---:|---:|")
    for name, (wall, own, sub) in sorted(files.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[: args.files]:
        print(f"| {name} | {wall:.1f} | {own:.1f} | {sub:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
