"""The test tree's own rules: a test module imports helpers, never another test module."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (lazy imports inside functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_no_test_module_imports_another_test_module_or_a_conftest():
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        bad = sorted(
            m
            for m in imported_modules(path)
            if m.startswith("tests.") and m.split(".")[-1].startswith(("test_", "conftest"))
        )
        if bad:
            offenders[str(path.relative_to(TESTS))] = bad
    assert not offenders, f"test modules import only tests.helpers (or bench): {offenders}"


def test_every_test_module_sits_in_a_folder_that_says_what_it_costs():
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"put these under tests/unit, tests/integration, tests/tui or tests/gpu: {loose}"
