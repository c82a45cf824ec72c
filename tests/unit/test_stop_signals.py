"""SIGTERM and SIGHUP end a command with status 128 + signal, even when Python swallows the exit.

The handler raises ``SystemExit`` in the main thread. When the signal lands while that thread
runs a finalizer (a ``__del__``, a weakref callback), Python prints "Exception ignored" and
carries on: the command then finished its work and exited 0, as if never signalled (seen in
CI: ``WeakSet._remove`` swallowed it during a file-mode turn).
"""

from __future__ import annotations

import gc
import os
import signal

import pytest

import assistant.__main__ as entry


class SignalledWhileFinalized:
    """Sends ``signum`` to this process from its finalizer: the handler runs inside it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)
        for _ in range(1000):  # bytecodes: the handler runs at one of them, inside __del__
            pass


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_swallowed_by_a_finalizer_still_ends_with_its_status(
    monkeypatch, capsys, signum
) -> None:
    """And quietly: the user sees no "Exception ignored" traceback."""

    def work(_argv: list[str]) -> int:
        SignalledWhileFinalized(signum)  # dropped at once: its __del__ runs here
        gc.collect()
        return 0  # the work went on to its end: the signal's exit was swallowed

    monkeypatch.setattr(entry, "_main", work)
    assert entry.main(["chat"]) == 128 + signum
    assert "Traceback" not in capsys.readouterr().err


def test_a_stop_signal_in_the_work_unwinds_with_its_status(monkeypatch) -> None:
    reached = []

    def work(_argv: list[str]) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
        reached.append("after the signal")
        return 0

    monkeypatch.setattr(entry, "_main", work)
    with pytest.raises(SystemExit) as exit_:
        entry.main(["chat"])
    assert exit_.value.code == 128 + signal.SIGTERM and not reached
