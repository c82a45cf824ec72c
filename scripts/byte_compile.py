"""Write the bytecode of the installed modules that the assistant imports (run by scripts/setup.sh).

pip installs with ``--no-compile`` (byte-compiling all of torch, transformers and their
neighbours took 23 s of the set-up), which leaves each module to be compiled when it is first
imported, its ``.pyc`` written then. Where ``PYTHONDONTWRITEBYTECODE`` is set (our CI machine
sets it) nothing is ever written, and every process compiled the ~420 modules it imports
again: 0.7 s of each start of the app, each test's app among them. This imports every module
of our packages once (~6 s) and writes the ``.pyc`` of what that loaded from the virtual
environment, as pip would have; the checkout itself gets none, as the variable asks. The
test processes compile what only the tests import themselves (importing the test modules
here took 12 s more than it saves).
"""

from __future__ import annotations

import importlib
import pkgutil
import py_compile
import sys
from pathlib import Path

PACKAGES = ("assistant", "bench", "engines", "models", "store")


def import_all() -> None:
    """Import each module of our packages; one that fails is skipped.

    A module that cannot be imported here (TensorRT's on a machine without it) is not loaded by
    the app here either.
    """
    for name in PACKAGES:
        try:
            package = importlib.import_module(name)
        except ImportError:  # not installed (set-up's own test installs a stand-in project)
            continue
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            try:
                importlib.import_module(module.name)
            except (Exception, SystemExit):
                continue


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
    import_all()
    compile_loaded()
