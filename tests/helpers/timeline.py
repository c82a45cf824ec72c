"""Scripted timelines for the turn engine: speech and silence in 32 ms chunks, no threads, no devices.

A scripted VAD calls a chunk speech when it is loud, a scripted Smart Turn answers the
probabilities it is given, and the real :class:`~assistant.stages.vad.Endpointer` and
:class:`~assistant.stages.endpoint.SmartTurnPolicy` turn them into events for the real
:class:`~assistant.turns.engine.TurnEngine`, called the way the live loop calls it. The test
plays the other threads' part at scripted times (``plays``, ``ends``, ``judged``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from assistant.config.sections import TurnOptions, VadOptions
from assistant.events import Event
from assistant.stages.endpoint import SmartTurnPolicy
from assistant.stages.smart_turn import TurnScore
from assistant.stages.vad import CHUNK_MS, CHUNK_NS, CHUNK_SAMPLES, Endpointer
from assistant.turns.engine import Action, Judge, MicBlock, Start, TurnEngine, TurnRules

LOUD, SOFT, QUIET = 0.5, 0.225, 0.0


class LoudnessVad:
    """A VAD whose speech probability is twice the chunk's peak: 1.0 for loud speech, 0.45 for soft."""

    def __call__(self, chunk: np.ndarray) -> float:
        return min(1.0, 2 * float(np.abs(chunk).max()))

    def reset(self) -> None:
        """Nothing to forget."""


@dataclass
class ScriptedTurnModel:
    """Smart Turn's stand-in: answers the next scripted probability (the last one repeats)."""

    probabilities: list[float]
    inference_ms: float = 50.0
    scored: list[float] = field(default_factory=list)  # audio seconds of each call

    def score(self, audio: np.ndarray) -> TurnScore:
        self.scored.append(audio.size / 16000)
        p = self.probabilities[min(len(self.scored) - 1, len(self.probabilities) - 1)]
        return TurnScore(p, self.inference_ms)


@dataclass
class Script:
    """Runs a timeline through the endpointer and the engine; records what happened when."""

    rules: TurnRules = field(default_factory=TurnRules)
    probabilities: list[float] = field(default_factory=lambda: [0.9])
    vad: VadOptions = field(default_factory=VadOptions)
    turn: TurnOptions = field(default_factory=TurnOptions)
    closed: bool = False

    def __post_init__(self) -> None:
        self.model = ScriptedTurnModel(self.probabilities)
        policy = SmartTurnPolicy(self.model, self.turn)  # type: ignore[arg-type]
        self.endpointer = Endpointer(self.vad, LoudnessVad(), policy, self.turn.speculate_after_ms)  # type: ignore[arg-type]
        self.engine = TurnEngine(self.rules)
        self.t_ns = 0
        self.events: list[Event] = []
        self.actions: list[tuple[int, Action]] = []  # (ms, action)
        self.blocks: list[MicBlock] = []
        self.at: dict[int, Callable[[], None]] = {}  # chunk index -> what another thread does then

    @property
    def ms(self) -> int:
        return self.t_ns // 1_000_000

    def _apply(self, actions: list[Action]) -> None:
        self.actions += [(self.ms, a) for a in actions]

    def speak(self, ms: float) -> Script:
        return self._play(ms, LOUD)

    def speak_softly(self, ms: float) -> Script:
        """Speech the VAD gives 0.45: under its threshold, over its threshold over a reply."""
        return self._play(ms, SOFT)

    def pause(self, ms: float) -> Script:
        return self._play(ms, QUIET)

    def _play(self, ms: float, level: float) -> Script:
        for _ in range(round(ms / CHUNK_MS)):
            self.t_ns += CHUNK_NS
            decision = self.engine.mic_block(self.closed)
            self.blocks.append(decision)
            if decision is MicBlock.CLOSE:  # as the capture thread does
                turn = self.endpointer.turn_id
                ended = self.endpointer.close(self.t_ns)
                if ended is not None:
                    self.events.append(ended)
                    self._apply(self.engine.handle(ended, self.t_ns))
                self._apply(self.engine.unheard(0 if ended is not None else turn, self.t_ns))
                continue
            if decision is MicBlock.IGNORE:
                continue
            if decision is MicBlock.RESTART:
                self.endpointer.reset()
                continue
            if decision in (MicBlock.FEED_SEALED, MicBlock.FEED_OVER_REPLY):
                self.endpointer.seal()
            self.endpointer.over_reply = decision is MicBlock.FEED_OVER_REPLY
            for event in self.endpointer.feed(np.full(CHUNK_SAMPLES, level, np.float32), self.t_ns):
                self.events.append(event)
                self._apply(self.engine.handle(event, self.t_ns))
        return self

    # What the other threads do

    def plays(self, attempt: int) -> bool:
        """The reply's TTS thread asks to play its first piece."""
        return self.engine.claim_audio(attempt, self.t_ns)

    def judged(self, text: str, transcript: object = None) -> list[Action]:
        """The judge thread heard the newest speech over the reply as ``text`` (``transcript``: all of it)."""
        judge = self.of(Judge)[-1]
        actions = self.engine.overlap_heard(judge.turn_id, text, self.t_ns, transcript)
        self._apply(actions)
        return actions

    def transcribes(self, text: str, run: int = -1) -> None:
        """The ASR of a speculative run (the newest by default) finished with ``text``."""
        pause = [a for a in self.of(Start) if not a.confirmed][run].first
        self.endpointer.policy.transcribed(pause.t_ns, text)

    def ends(self, attempt: int) -> None:
        """The attempt's thread returns."""
        self.engine.ended(attempt)

    # Reading the result

    def of(self, kind: type) -> list:
        return [a for _, a in self.actions if isinstance(a, kind)]

    def event_kinds(self) -> list[str]:
        return [type(e).__name__ for e in self.events]

    def when(self, kind: type) -> list[int]:
        return [ms for ms, a in self.actions if isinstance(a, kind)]
