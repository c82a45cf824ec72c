"""Write the bytecode of the installed modules that the assistant (and with --dev its tests) imports.

Run by scripts/setup.sh after pip, with the checkout on ``PYTHONPATH`` (the test modules import
``tests.helpers``): ``PYTHONPATH=. .venv/bin/python scripts/byte_compile.py [--dev]``.

pip installs with ``--no-compile`` (byte-compiling all of torch, transformers and their
neighbours took 23 s of the set-up), which leaves each module to be compiled when it is first
imported, its ``.pyc`` written then. Where ``PYTHONDONTWRITEBYTECODE`` is set (our CI machine
sets it) nothing is ever written, and every process compiled the ~420 modules it imports
again: 0.7 s of each start of the app, each test's app among them. This imports every module
of our packages once and writes the ``.pyc`` of what that loaded from the virtual environment,
as pip would have; the checkout itself gets none, as the variable asks.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import py_compile
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("assistant", "bench", "engines", "models", "store")


def import_all(dev: bool) -> None:
    """Import each module of our packages (and the test modules with ``dev``); failures skipped.

    A module that cannot be imported here (TensorRT's on a machine without it, a test skipped
    at import) is not needed here either.
    """
    for name in PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            try:
                importlib.import_module(module.name)
            except (Exception, SystemExit, pytest_outcome()):
                pass
    if dev:
        for path in sorted((ROOT / "tests").rglob("*.py")):
            spec = importlib.util.spec_from_file_location(f"_byte_compile_{len(sys.modules)}", path)
            try:
                assert spec is not None and spec.loader is not None
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            except (Exception, SystemExit, pytest_outcome()):
                pass


def pytest_outcome() -> type[BaseException]:
    """pytest's skip at import (``importorskip``), a ``BaseException``; ``Exception`` without pytest."""
    try:
        from _pytest.outcomes import OutcomeException
    except ImportError:
        return Exception
    return OutcomeException


def compile_loaded() -> int:
    """Write the missing ``.pyc`` of the loaded modules that live in the virtual environment."""
    venv, written = Path(sys.prefix).resolve(), 0
    for module in list(sys.modules.values()):
        source, cached = getattr(module, "__file__", None), getattr(module, "__cached__", None)
        if not (isinstance(source, str) and isinstance(cached, str) and source.endswith(".py")):
            continue
        if Path(source).resolve().is_relative_to(venv) and not Path(cached).exists():
            written += py_compile.compile(source, cfile=cached, doraise=False, quiet=2) is not None
    return written


if __name__ == "__main__":
    import_all(dev="--dev" in sys.argv[1:])
    print(f"byte-compiled {compile_loaded()} installed modules")
