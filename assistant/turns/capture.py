"""The capture thread: microphone -> echo canceller -> level -> the engine's gate -> endpointer.

:class:`~assistant.turns.live.LiveLoop` owns one. What the engine decides for a block (forget
the speech in progress, ignore it, restart the endpointer, feed it, feed it sealed) comes back
through ``gate``; each event the endpointer makes goes to ``heard``. When the microphone stops
being heard (closed, or gated as a reply plays) the speech in progress is forgotten and
``unheard`` told which turn it was. A lost microphone does the same once per loss and tells
``lost``; the device watch reports and reopens it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from assistant.events import Event, MicLevel
from assistant.stages.audio import Microphone
from assistant.stages.devices import DeviceLostError
from assistant.stages.vad import Endpointer
from assistant.turns.duplex import Duplex
from assistant.turns.engine import MicBlock

LEVEL_EVERY_NS = 100_000_000


class Capture:
    """Reads the microphone on its own thread until ``stop_event`` is set.

    ``ids`` guards the endpointer's turn ids (shared with the loop's typed turns); ``gate``
    gets whether the microphone is closed by the echo probe and returns the engine's
    :class:`~assistant.turns.engine.MicBlock`; ``after_block`` runs after every block fed;
    ``on_level`` gets a ``MicLevel`` about every 100 ms.
    """

    def __init__(
        self,
        mic: Microphone,
        endpointer: Endpointer,
        duplex: Duplex | None,
        ids: threading.Lock,
        stop_event: threading.Event,
        gate: Callable[[bool], MicBlock],
        heard: Callable[[Event], None],
        lost: Callable[[int], None],
        unheard: Callable[[int], None],
        after_block: Callable[[], None],
        current_turn: Callable[[], int],
        on_level: Callable[[MicLevel], None] | None = None,
    ) -> None:
        self.mic = mic
        self.endpointer = endpointer
        self.duplex = duplex
        self.ids = ids
        self.stop_event = stop_event
        self.gate = gate
        self.heard = heard
        self.lost = lost
        self.unheard = unheard
        self.after_block = after_block
        self.current_turn = current_turn  # the turn a MicLevel belongs to
        self.on_level = on_level
        self.thread = threading.Thread(target=self._run, name="capture")

    def _run(self) -> None:
        lost = False
        level_due_ns = 0
        while not self.stop_event.is_set():
            try:
                block = self.mic.read(0.1)
            except DeviceLostError:
                if not lost:  # once per loss; the watch reports it and reopens the device
                    lost = True
                    self._forget_speech(self.lost)
                    self.mic.drain()
                self.stop_event.wait(0.1)
                continue
            lost = False
            if block is None:
                continue
            if self.duplex is not None:
                block = self.duplex.clean(*block)
                if not block[0].size:
                    continue
            if self.on_level is not None and block[1] >= level_due_ns:
                level_due_ns = block[1] + LEVEL_EVERY_NS
                self.on_level(MicLevel(self.current_turn(), block[1], level_db(block[0])))
            decision = self.gate(self.duplex is not None and self.duplex.probing(block[1]))
            if decision is MicBlock.CLOSE:
                self._close(block[1])
                continue
            if decision is MicBlock.IGNORE:
                continue
            if decision is MicBlock.RESTART:
                self.endpointer.reset()
                self.mic.drain()
                continue
            with self.ids:
                if decision in (MicBlock.FEED_SEALED, MicBlock.FEED_OVER_REPLY):
                    self.endpointer.seal()
                self.endpointer.over_reply = decision is MicBlock.FEED_OVER_REPLY
                events = self.endpointer.feed(*block)
            for event in events:
                self.heard(event)
            self.after_block()

    def _close(self, t_ns: int) -> None:
        """The microphone stops being heard: the speech in progress is forgotten, ``unheard`` told.

        A turn that had ended once and went on is ended there instead, and answered (``heard``).
        """
        with self.ids:
            turn = self.endpointer.turn_id
            ended = self.endpointer.close(t_ns)
        if ended is not None:
            self.heard(ended)
        self.unheard(0 if ended is not None else turn)

    def _forget_speech(self, tell: Callable[[int], None]) -> None:
        """Forget the speech in progress, then ``tell`` the loop its turn (0: none)."""
        with self.ids:
            turn = self.endpointer.turn_id
            self.endpointer.reset()
        tell(turn)


def level_db(samples: np.ndarray) -> float:
    """The block's RMS level in dBFS (-120 for silence or an empty block)."""
    rms = float(np.sqrt(np.mean(np.square(samples)))) if samples.size else 0.0
    return 20 * float(np.log10(max(rms, 1e-6)))
