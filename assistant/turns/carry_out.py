"""The turn engine's actions carried out: runs, the speaker, the overlap judge, events.

:class:`~assistant.turns.engine.TurnEngine` only decides; the live loop hands what it returns
to :class:`Carrier` under the floor lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from assistant.events import BargeIn, Event, ReplyPaused
from assistant.stages.audio import AudioSink
from assistant.stages.echo_linear import EchoSpan
from assistant.turns import actions as act
from assistant.turns.runs import TurnRuns
from assistant.turns.side_asr import SideTranscripts


class Carrier:
    """Carries out actions on the turn ``runs``, the ``speaker``, the ``side`` ASR threads and ``emit``.

    ``started(turn_id)`` is told of each turn run started (the device watch names it);
    ``unsuppressed(t_end_ns, samples)`` gives speech over a reply and the echo before it, for
    an echo removal without suppression (:meth:`~assistant.turns.duplex.Duplex.unsuppressed`).
    """

    def __init__(
        self,
        runs: TurnRuns,
        speaker: AudioSink | None,
        side: SideTranscripts,
        emit: Callable[[Event], None],
        started: Callable[[int], None],
        unsuppressed: Callable[[int, int], EchoSpan | None] | None = None,
    ) -> None:
        self.runs = runs
        self.speaker = speaker
        self.side = side
        self.emit = emit
        self.started = started
        self.unsuppressed = unsuppressed

    def apply(self, actions: list[act.Action]) -> None:
        """Carry out ``actions`` in order (the caller holds the floor lock)."""
        for action in actions:
            if isinstance(action, act.Start):
                self.started(action.turn_id)
                self.runs.start(action)
            elif isinstance(action, act.Confirm):
                self.runs[action.attempt].gate.confirm()
            elif isinstance(action, act.Discard):
                run = self.runs[action.attempt]
                run.gate.discard(action.reason)  # nothing of this reply plays
                run.cancel.set()
            elif isinstance(action, act.Cancel):
                self.runs[action.attempt].cancel.set()
            elif isinstance(action, act.BargeIn):
                self.runs[action.attempt].cancel.set()
                stopped_ns = action.paused_t_ns or time.monotonic_ns()
                self.emit(BargeIn(action.turn_id, stopped_ns, action.onset_t_ns, self.latency_ms()))
            elif isinstance(action, act.PauseReply):
                if self.speaker is not None:
                    self.speaker.pause()
                if (held := self.runs.get(action.attempt)) is not None:
                    held.gate.hold()  # the judge gets the CPU the reply's generation had
                now, latency_ms = time.monotonic_ns(), self.latency_ms()
                self.emit(
                    ReplyPaused(action.turn_id, now, action.onset_t_ns, action.overlap_turn, latency_ms)
                )
            elif isinstance(action, act.ResumeReply):
                if self.speaker is not None:
                    self.speaker.resume()
                if (held := self.runs.get(action.attempt)) is not None:
                    held.gate.release()
            elif isinstance(action, act.ContinueTurn):
                run = self.runs[action.attempt]
                run.gate.join_next(action.hold)  # its speech joins the next turn; its reply is dropped
                run.cancel.set()
            elif isinstance(action, act.Judge):
                assert isinstance(action.audio, np.ndarray)
                question = self.runs.get(action.joined_with)
                said = question.gate.said if question else None
                ungated = self.unsuppressed(action.t_ns, action.audio.size) if self.unsuppressed else None
                self.side.judge(action.turn_id, action.audio, said, ungated, action.short)
            elif isinstance(action, act.StopSpeaker):
                if self.speaker is not None:
                    self.speaker.stop()
            elif isinstance(action, act.Emit):
                self.emit(action.event)

    def latency_ms(self) -> float:
        """The speaker's output latency: how long a pause or stop takes to be heard."""
        return self.speaker.output_latency_ms if self.speaker is not None else 0.0
