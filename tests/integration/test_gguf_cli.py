"""``--model FILE.gguf`` faults at the command line: each says what is wrong, without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.gguf_files import write_tiny_gguf


def test_the_cli_says_what_is_wrong_without_a_traceback(tmp_path):
    data = write_tiny_gguf(tmp_path / "good.gguf").read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[:-500])
    out = subprocess.run(
        [sys.executable, "-m", "assistant", "chat", "--store", str(tmp_path / "store"), "--model", str(bad)],
        input="hi\n",
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert out.returncode == 2
    assert f"error: {bad} is truncated" in out.stderr and "Traceback" not in out.stderr
