"""Where the source checkout is."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
