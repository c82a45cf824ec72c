"""The two transcriptions beside a turn's own: partial transcripts and speech over a reply.

Each runs on its own thread (``partial-asr``, ``overlap-asr``) fed by the capture thread, so
that the microphone is never held up by Whisper. Both use the pipeline's ASR under its lock
(:class:`~assistant.turns.hearing.Hearing`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from assistant.stages.echo_linear import EchoSpan
from assistant.stages.vad import SAMPLE_RATE_HZ, Endpointer
from assistant.turns.hearing import Overheard
from assistant.turns.pipeline import VoicePipeline
from assistant.turns.protocols import Said


@dataclass(frozen=True)
class Judgement:
    """Speech over ``turn``'s reply waiting for its words (:meth:`SideTranscripts.judge`)."""

    turn: int
    audio: np.ndarray
    said: Said | None
    ungated: EchoSpan | None
    short: bool


class SideTranscripts:
    """The partial-transcript and overlap threads; ``heard(turn, overheard, now_ns)`` gets overlaps'."""

    def __init__(self, pipeline: VoicePipeline, heard: Callable[[int, Overheard, int], None]) -> None:
        self.pipeline = pipeline
        self.heard = heard
        self.partials: queue.Queue[tuple[int, np.ndarray] | None] = queue.Queue(maxsize=1)
        self.partial_thread = threading.Thread(target=self._partial_worker, name="partial-asr")
        self.judgements: queue.Queue[Judgement | None] = queue.Queue()
        self.judge_thread = threading.Thread(target=self._judge_worker, name="overlap-asr")

    def start(self, partials: bool) -> None:
        """Start the overlap thread, and the partial one when ``partials`` is on."""
        self.judge_thread.start()
        if partials:
            self.partial_thread.start()

    def offer_partial(self, endpointer: Endpointer, due: Callable[[float, bool], bool]) -> None:
        """Transcribe the utterance in progress for the display, when ``due(audio_ms, in_speech)``.

        Never waits: nothing is offered while the last partial is still being transcribed.
        """
        if self.partials.full():
            return
        ep = endpointer
        in_speech = bool(ep.turn_id and not ep.silence_chunks and ep.chunks)
        audio_ms = 1000.0 * sum(c.size for c in ep.chunks) / SAMPLE_RATE_HZ if in_speech else 0.0
        if due(audio_ms, in_speech):
            self.partials.put_nowait((ep.turn_id, np.concatenate(ep.chunks)))

    def judge(
        self,
        turn: int,
        audio: np.ndarray,
        said: Said | None = None,
        ungated: EchoSpan | None = None,
        short: bool = False,
    ) -> None:
        """Transcribe speech over a reply (after ``said``: its question); its words go to ``heard``.

        ``ungated``: the same speech for an echo removal without suppression, if kept;
        ``short``: too short to take the floor (:meth:`Hearing.transcribe_overlap`).
        """
        self.judgements.put(Judgement(turn, audio, said, ungated, short))

    def stop(self) -> None:
        """End and join both threads."""
        for thread, jobs in ((self.partial_thread, self.partials), (self.judge_thread, self.judgements)):
            if thread.is_alive():
                jobs.put(None)
                thread.join()

    def _partial_worker(self) -> None:
        while (item := self.partials.get()) is not None:
            self.pipeline.hearing.partial_transcript(*item)

    def _judge_worker(self) -> None:
        while (job := self.judgements.get()) is not None:
            # the fit (~0.2 s of CPU) on this thread, not the turn engine's
            ungated = job.ungated.cleaned() if job.ungated is not None else None
            raw = job.ungated.microphone() if job.ungated is not None and job.ungated.settling else None
            overheard = self.pipeline.hearing.transcribe_overlap(job.audio, job.said, ungated, job.short, raw)
            self.heard(job.turn, overheard, time.monotonic_ns())
