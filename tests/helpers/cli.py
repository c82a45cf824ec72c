"""The ``assistant`` command line run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys


def run_cli(*args, stdin="", env=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "assistant", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
