"""The turn threads: one per run of a turn that the engine starts, each after the runs before it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from assistant.events import SpeechEnded, SpeechPaused
from assistant.stages.asr import TranscriptResult
from assistant.stages.audio import AudioSink
from assistant.turns.actions import Start
from assistant.turns.pipeline import VoicePipeline
from assistant.turns.protocols import ReplyGate


@dataclass
class Run:
    """The thread, cancel flag and reply gate of one attempt of the engine."""

    turn_id: int
    cancel: threading.Event = field(default_factory=threading.Event)
    gate: ReplyGate = field(default_factory=ReplyGate)
    thread: threading.Thread = field(default_factory=threading.Thread)


class TurnRuns:
    """Runs the pipeline for each ``Start`` on a ``turn-N`` thread, in order.

    Args:
        pipeline: What a run runs (``run_turn`` for speech, ``run_text_turn`` for text).
        sink: Where replies play now (``None``: text only, the speaker is lost).
        claim_audio: Asked (with the attempt) before each piece of a reply plays: the floor.
        ended: Told (with the attempt) when a run's thread is done; the caller's lock is
            taken there, so :meth:`start` and :meth:`ended` never race.
    """

    def __init__(
        self,
        pipeline: VoicePipeline,
        sink: Callable[[], AudioSink | None],
        claim_audio: Callable[[int], bool],
        ended: Callable[[int], None],
    ) -> None:
        self.pipeline = pipeline
        self.sink = sink
        self.claim_audio = claim_audio
        self.ended = ended
        self.runs: dict[int, Run] = {}  # attempt id -> its run

    def __getitem__(self, attempt: int) -> Run:
        return self.runs[attempt]

    def get(self, attempt: int) -> Run | None:
        """The run of ``attempt``, or ``None`` when it has ended (or there is none: attempt 0)."""
        return self.runs.get(attempt)

    def forget(self, attempt: int) -> None:
        """Drop the record of ``attempt``'s run, whose thread is done (caller's lock held)."""
        del self.runs[attempt]

    def threads(self) -> list[threading.Thread]:
        """The threads of the runs not finished yet."""
        return [r.thread for r in self.runs.values()]

    def start(self, start: Start) -> None:
        """Run ``start``'s turn on its own thread after the runs before it (caller's lock held)."""
        before = self.threads()
        run = Run(start.turn_id, gate=ReplyGate(start.confirmed))
        run.gate.claim_audio = lambda: self.claim_audio(start.attempt)

        def work() -> None:
            try:
                waited = any(thread.is_alive() for thread in before)
                for thread in before:  # one turn at a time, in order
                    thread.join()
                queued_until_ns = time.monotonic_ns() if waited else 0
                if run.cancel.is_set():
                    return
                sink = self.sink()
                if isinstance(start.first, str):
                    self.pipeline.run_text_turn(start.turn_id, start.first, sink, run.cancel, run.gate)
                else:
                    assert isinstance(start.first, SpeechEnded | SpeechPaused)
                    assert start.heard is None or isinstance(start.heard, TranscriptResult)
                    self.pipeline.run_turn(
                        start.first, sink, run.cancel, run.gate, start.heard, queued_until_ns
                    )
            finally:
                self.ended(start.attempt)

        run.thread = threading.Thread(target=work, name=f"turn-{start.turn_id}")
        self.runs[start.attempt] = run
        run.thread.start()
