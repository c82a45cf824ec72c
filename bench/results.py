"""Writing a benchmark's ``--json``: the machine, the command's arguments and what it measured."""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any


def write_results(path: Path, args: argparse.Namespace, **measured: Any) -> None:
    """Write ``measured`` to ``path`` with the machine (platform, cores, load) and ``args``."""
    meta = {"machine": platform.platform(), "cores": os.cpu_count(), "load_avg": os.getloadavg()}
    options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    path.write_text(json.dumps({"meta": meta, "args": options, **measured}, indent=1))
