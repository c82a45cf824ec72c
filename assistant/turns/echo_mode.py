"""Full or half duplex: whether the microphone is heard over replies, from the echo canceller's stats.

:class:`EchoMode` is the rule :class:`~assistant.turns.duplex.Duplex` applies at each look at the
canceller (every few microphone blocks, on the capture thread): full duplex once the canceller
has converged; half duplex again while it converges after the echo path moved, a stream ran
late or the canceller lost the echo. Each change is reported as an
:class:`~assistant.events.EchoState`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from assistant.events import EchoState, Event
from assistant.stages.echo import EchoCanceller, EchoStats

logger = logging.getLogger(__name__)

# The echo delay this far from where the canceller converged: the echo path moved and AEC3 has
# lost it for a while (a 40 ms move slewed over 2 s: 8-16 dB ERLE for ~3 s; replies paused for
# their own echo on the echo rig). Clock drift (~0.1 ms a second) is followed, FOLLOW_MS a look.
MOVED_MS = 15.0
FOLLOW_MS = 1.0
# After a move the path goes on settling for seconds (a stalled app on the echo rig: 25 -> 41
# -> 9 ms over 4 s), and full duplex declared on half a second converged paused replies for
# their echo again: full duplex only once the delay held within STEADY_WITHIN_MS for STEADY_MS
# of reply audio. Not after an xrun or a stall alone: that comes at the start of a reply on a
# busy machine, when the user goes on with the question, and a gated microphone loses those
# words; the convergence window is enough there when the delay reads where it was before. When
# it reads elsewhere the stall moved the path (a fresh-clone CI run: 60 -> 18 ms after a 300 ms
# stall, full duplex on that, four pauses for the reply's own echo): as after a move.
STEADY_MS = 2000
STEADY_WITHIN_MS = 5.0


class EchoMode:
    """Full or half duplex for ``canceller``; changes go to :attr:`emit` (set by ``Duplex.start``)."""

    def __init__(self, canceller: EchoCanceller) -> None:
        self.canceller = canceller
        self.emit: Callable[[Event], None] = _nowhere
        self.full_duplex = False
        self._no_echo: bool | None = None  # what the last full-duplex report said of the echo path
        self._delay_ref: float | None = None  # the echo delay the canceller is converged at (ms)
        self._moved_at: int | None = None  # the canceller's far-end frames when the echo path moved
        self._steady: tuple[float | None, int] = (None, 0)  # since a move: (delay ms, held since frame)
        self._steady_frames = 0  # how long (far-end frames) the delay must hold before full duplex
        self._home: float | None = None  # after a stream ran late: the delay converged at before it

    def check(self, stats: EchoStats) -> None:
        """Full duplex once the canceller converged; half duplex if the path moved or it lost the echo."""
        if self.full_duplex and (self._moved(stats) or self._lost(stats)):
            return
        if not self._settled(stats) or not stats.converged or stats.echo_lost:
            return  # both at one look: a delay that held, then moved before convergence, waits again
        self._moved_at = self._home = None
        below = self.canceller.options.converged_below_db
        # A headset or a quiet speaker; the user talking over a reply lowers the loss, not echo_free.
        no_echo = self.canceller.echo_free or (stats.echo_loss_db is not None and stats.echo_loss_db >= below)
        if self.full_duplex and no_echo == self._no_echo:
            return  # reported already; said again when an echo path appears (or goes) mid-session
        self.full_duplex, self._no_echo = True, no_echo
        self._delay_ref = stats.delay_ms
        if no_echo:
            reason = f"full duplex: no echo heard ({stats.echo_loss_db:.0f} dB under the speaker)"
            self.emit(EchoState(0, _now(), True, reason, None, None))
            logger.info("%s", reason)
            return
        erle = f"ERLE {stats.erle_db:.0f} dB" if stats.erle_db is not None else "no echo"
        delay = f", echo delay {stats.delay_ms:.0f} ms" if stats.delay_ms is not None else ""
        reason = f"full duplex: echo cancelled ({erle}{delay})"
        logger.info("%s", reason)
        self.emit(EchoState(0, _now(), True, reason, stats.erle_db, stats.delay_ms))

    def ran_late(self, what: str, stats: EchoStats) -> None:
        """A stream ran late (``what``): the echo path may have moved; half duplex at once.

        An xrun: the speaker's output underran or the microphone's input overran, PortAudio
        restarted the stream and the sound server placed it where it could (an echo rig's
        delay went 97 -> 6 ms after an underrun on a loaded machine; AEC3 lost the echo for a
        while and a reply paused for it). Or the process stalled: the microphone's backlog
        comes late, in a burst. Half duplex from the block where it shows (before the VAD
        hears it) until the canceller has converged on audio played since.
        """
        if not self.full_duplex or self._no_echo:
            return
        self._half_duplex(
            f"half duplex: {what}; the echo path may have moved, until echo cancellation converges again",
            stats,
            home=self._delay_ref,
        )

    def _half_duplex(
        self, reason: str, stats: EchoStats, steady_ms: int = 0, home: float | None = None
    ) -> None:
        """Back to half duplex until the canceller converges on far-end audio played from now.

        ``steady_ms``: and until the delay has held that long (of far-end audio). ``home``: the
        delay before; held elsewhere, it must hold :data:`STEADY_MS`.
        """
        logger.info("%s", reason)
        self.full_duplex, self._moved_at, self._delay_ref, self._home = False, stats.far_frames, None, home
        self._steady, self._steady_frames = (stats.delay_ms, stats.far_frames), steady_ms // 10
        self.emit(EchoState(0, _now(), False, reason, stats.erle_db, stats.delay_ms))

    def _moved(self, stats: EchoStats) -> bool:
        """Whether the echo path moved away from where the canceller converged; then half duplex.

        The delay is the lag of the microphone's correlation with what the speaker played, so
        the user talking over a reply (which lowers the ERLE as a lost canceller does) leaves it
        where it was. Half duplex until the canceller has converged again (:meth:`_settled`).
        """
        if self._no_echo or stats.delay_ms is None:
            return False
        if self._delay_ref is None:
            self._delay_ref = stats.delay_ms
        gap = stats.delay_ms - self._delay_ref
        if abs(gap) < MOVED_MS:
            self._delay_ref += float(np.clip(gap, -FOLLOW_MS, FOLLOW_MS))  # drift: followed
            return False
        self._half_duplex(
            f"half duplex: the echo path moved (delay {self._delay_ref:.0f} -> {stats.delay_ms:.0f} ms)"
            " until echo cancellation converges again",
            stats,
            STEADY_MS,
        )
        return True

    def _lost(self, stats: EchoStats) -> bool:
        """Whether the canceller lost an echo whose delay stayed put; then half duplex.

        Under load the rig's echo delay read -6 ms for eight replies in a row while AEC3 removed
        4-8 dB of it (a fresh-clone CI run): the path wobbled by less than the delay estimate
        sees, the app stayed full duplex, its replies paused for their own echo and the echo was
        heard as a turn. ``EchoStats.echo_lost`` tells that from the user talking over the reply
        (which lowers the ERLE as well). Half duplex until it has converged again (:meth:`_settled`).
        """
        if self._no_echo or not stats.echo_lost:
            return False
        erle = f"ERLE {stats.erle_db:.0f} dB" if stats.erle_db is not None else "no ERLE yet"
        self._half_duplex(
            f"half duplex: echo cancellation lost the echo ({erle}) until it converges again",
            stats,
            home=self._delay_ref,
        )
        return True

    def _settled(self, stats: EchoStats) -> bool:
        """Whether the echo path has settled since it moved (or a stream ran late).

        The convergence window must hold only far-end audio played since (its earlier frames,
        cancelled before the move, still say converged), and after a move the delay must have
        held for :data:`STEADY_MS` of it; after a stream ran late too, unless it holds where
        it was before.
        """
        if self._moved_at is None:
            return True
        delay, since = self._steady
        if stats.delay_ms is None or delay is None or abs(stats.delay_ms - delay) > STEADY_WITHIN_MS:
            self._steady = (stats.delay_ms, stats.far_frames)
            return False
        window = self.canceller.options.window_ms // 10
        steady_frames = self._steady_frames
        if self._home is not None and abs(delay - self._home) > STEADY_WITHIN_MS:
            steady_frames = STEADY_MS // 10  # the stall moved the path
        return stats.far_frames - self._moved_at >= window and stats.far_frames - since >= steady_frames


def _nowhere(_event: Event) -> None:
    """Where events go before ``Duplex.start``."""


def _now() -> int:
    return time.monotonic_ns()
