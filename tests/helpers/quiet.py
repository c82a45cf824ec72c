"""A quiet machine for the few tests that need one, while pytest-xdist runs several workers.

``scripts/test.sh`` runs the tests on the sound devices on one worker beside two lanes of
compute-bound ones (tests/conftest.py). Each compute test holds this run's lock file shared; a
test marked ``quiet`` holds it exclusively, so while it runs the compute lanes start no test
(it waits for the ones in progress to end). Outside pytest-xdist there is no lock.

Only the echo rig's scenarios with echo cancellation on (``test_full_duplex.py``) are marked
(the half-duplex ones gate the microphone or hear the echo whatever the load): beside the compute worker,
even at nice 19, a reply of the echo-only scenario lost its echo cancellation for a moment and
paused twice for its own echo (ERLE 14 dB against 24-35 dB for the other replies: once in two
full runs of 2026-12-05 without the lock; docs/benchmarks.md). The live pause tests and the
metrics test's spoken turn, marked before, passed without it in four runs: their failures
had been product bugs since fixed (the echo probe, the rejoin race). The quiet tests run last
on their worker (``tests/conftest.py``), when the compute lanes are done or nearly so.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def quiet_lock(run: str | None = None) -> Path | None:
    """The lock file of run ``run`` (default: this worker's run; none outside pytest-xdist).

    The controller removes it when the run ends (``pytest_sessionfinish`` in tests/conftest.py).
    """
    run = run or os.environ.get("PYTEST_XDIST_TESTRUNUID")
    return Path(tempfile.gettempdir()) / f"assistant-tests-{run}.quiet" if run else None


@contextmanager
def holding(exclusive: bool) -> Iterator[None]:
    """Hold the run's lock, shared (a compute test) or exclusive (a ``quiet`` test)."""
    path = quiet_lock()
    if path is None:
        yield
        return
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
