"""UI tests (Pilot on real sessions, snapshots, a tmux run): every test here is marked ``integration``."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under this folder ``integration`` (``-m "not integration"`` is the unit part)."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.integration)
