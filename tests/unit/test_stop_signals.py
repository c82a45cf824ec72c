"""SIGTERM and SIGHUP end a command with status 128 + signal, even when Python swallows the exit.

The handler raises ``SystemExit`` in the main thread. When the signal lands while that thread
runs a finalizer (a ``__del__``, a weakref callback), Python prints "Exception ignored" and
carries on: the command then finished its work and exited 0, as if never signalled (seen in
CI: ``WeakSet._remove`` swallowed it during a file-mode turn), or would wait on. A signal the
kernel hands to another thread while the main one blocks in a system call is never acted on at
all (``serve`` waiting for Triton: the last test).
"""

from __future__ import annotations

import gc
import os
import signal
import threading

import pytest

import assistant.__main__ as entry


@pytest.fixture(autouse=True)
def sighup_at_its_default():
    """SIGHUP as from a terminal: under ``nohup`` (a test run started so) it is inherited ignored,
    and the app rightly leaves it so (then these tests would see nothing)."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, previous)


class SignalledWhileFinalized:
    """Sends ``signum`` to this process from its finalizer: the handler runs inside it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)
        for _ in range(1000):  # bytecodes: the handler runs at one of them, inside __del__
            pass


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_swallowed_by_a_finalizer_is_delivered_again_and_unwinds_the_work(
    monkeypatch, capsys, signum
) -> None:
    """A command waiting (here as serve waits for its server) would wait on after such a SIGTERM.

    The exit is delivered again: the work unwinds with the signal's status, before the wait it
    would have gone on to, and quietly (no "Exception ignored" traceback).
    """
    reached = []

    def work(_argv: list[str]) -> int:
        SignalledWhileFinalized(signum)  # dropped at once: its __del__ runs here
        gc.collect()
        threading.Event().wait(5)  # where serve waits for its server
        reached.append("the wait ended")
        return 0

    monkeypatch.setattr(entry, "_main", work)
    with pytest.raises(SystemExit) as exit_:
        entry.main(["chat"])
    assert exit_.value.code == 128 + signum and not reached
    assert "Traceback" not in capsys.readouterr().err


class SenderOutrun(threading.Timer):
    """The first sender's signal lands while the hook still starts it (a busy machine: CI).

    Its ``start`` sends the signal before returning, so the handler runs inside the hook, as
    when the thread start outlasted the 10 ms the sender waits; later senders are real.
    """

    outrun = 0

    def start(self) -> None:
        if SenderOutrun.outrun == 0:
            SenderOutrun.outrun += 1
            self.function(*self.args)
            for _ in range(1000):  # bytecodes: the handler runs at one of them, in here
                pass
        super().start()


def test_an_exit_delivered_again_while_the_hook_still_starts_its_sender_is_sent_once_more(
    monkeypatch, capsys
) -> None:
    """There Python drops the exit with "Exception ignored in sys.unraisablehook" (a CI run: the
    command would have waited on); the hook catches it and sends the signal once more."""
    monkeypatch.setattr(threading, "Timer", SenderOutrun)
    monkeypatch.setattr(SenderOutrun, "outrun", 0)
    reached = []

    def work(_argv: list[str]) -> int:
        SignalledWhileFinalized(signal.SIGTERM)
        gc.collect()
        threading.Event().wait(5)
        reached.append("the wait ended")
        return 0

    monkeypatch.setattr(entry, "_main", work)
    with pytest.raises(SystemExit) as exit_:
        entry.main(["chat"])
    assert SenderOutrun.outrun == 1
    assert exit_.value.code == 143 and not reached
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


SIGNAL_TO_ANOTHER_THREAD = """
import signal, subprocess, sys, threading, time
import assistant.__main__ as entry
from assistant.modes.serve import wait_for_exit

server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
other = threading.Thread(target=time.sleep, args=(30,), daemon=True)  # blocks no signal
other.start()

def work(_argv):
    # The kernel hands SIGTERM to a thread of its choosing; here, to the other one.
    threading.Timer(0.5, signal.pthread_kill, (other.ident, signal.SIGTERM)).start()
    try:
        return wait_for_exit(server)
    finally:
        server.kill()

entry._main = work
sys.exit(entry.main(["serve"]))
"""


def test_a_sigterm_the_kernel_hands_to_another_thread_still_stops_the_wait_for_the_server() -> None:
    """``assistant serve`` waited in ``waitpid`` for good when gRPC's thread took the SIGTERM.

    A plain ``wait()`` returns only when the 30 s server does: past this test's 20 s limit.
    """
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SIGNAL_TO_ANOTHER_THREAD], timeout=20, capture_output=True)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
