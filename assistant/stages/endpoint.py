"""End of turn: is the user done, or only pausing? Pipecat's Smart Turn model decides.

After ``pause_ms`` of silence the model scores the utterance; a probability at or above
``threshold`` ends the turn at once, below it the endpointer keeps listening and scores again
every ``rescore_ms``, and ``max_silence_ms`` of silence ends the turn whatever the model says.
A pause whose speculative transcript is a question of :data:`QUESTION_MIN_WORDS` words or more
ends it after ``question_ms``: Smart Turn called some whole questions unfinished, and they
waited for the cap.
``detection = "off"`` is the fixed silence of ``[vad] end_silence_ms``. Defaults and why:
docs/voice.md.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from assistant.config.sections import TurnOptions
from assistant.events import TurnDecision
from assistant.stages.vad import EndOfTurn, FixedSilence, VadOptions
from store.bundled import ModelStore

if TYPE_CHECKING:
    from assistant.stages.smart_turn import SmartTurn

logger = logging.getLogger(__name__)

# A question this short may open a longer one ("Can you tell me? ... what time it is", "Do you
# know?"): Whisper punctuates such openers as questions, and the model may rightly call them
# unfinished. They wait for the model; the rule is for whole questions it misses.
QUESTION_MIN_WORDS = 5


class SmartTurnPolicy:
    """Ends a turn when Smart Turn says the speaker is done, or at ``max_silence_ms``."""

    def __init__(self, model: SmartTurn, options: TurnOptions) -> None:
        self.model = model
        self.options = options
        self.pause_ms = options.pause_ms
        self.next_score_ms = float(options.pause_ms)
        self.last: TurnDecision | None = None
        self.paused_t_ns = 0  # the pause under way (its SpeechPaused's time)
        self.question_t_ns = -1  # the pause whose transcript ends with "?"

    def reset(self, paused_t_ns: int = 0) -> None:
        """A new pause (its ``SpeechPaused`` at ``paused_t_ns``): score again at ``pause_ms``."""
        self.next_score_ms = float(self.pause_ms)
        self.last = None
        self.paused_t_ns = paused_t_ns

    def transcribed(self, paused_t_ns: int, text: str) -> None:
        """The speculative transcript of the pause at ``paused_t_ns`` (from a turn's thread).

        One of an earlier pause that finished late is ignored in :meth:`decide`.
        """
        text = text.strip()
        if text.endswith("?") and len(text.split()) >= QUESTION_MIN_WORDS:
            self.question_t_ns = paused_t_ns

    def decide(
        self, turn_id: int, audio: Callable[[], np.ndarray], silence_ms: float, t_ns: int
    ) -> TurnDecision | None:
        """Score at ``pause_ms`` and every ``rescore_ms`` after; complete at the threshold or the cap."""
        opts = self.options
        p = self.last.probability if self.last else None  # the model's last look, for a rule's ending
        if silence_ms >= opts.max_silence_ms:
            return TurnDecision(turn_id, t_ns, True, p, 0.0, silence_ms, "max silence")
        if opts.question_ms and silence_ms >= opts.question_ms and self.question_t_ns == self.paused_t_ns:
            return TurnDecision(turn_id, t_ns, True, p, 0.0, silence_ms, "question")
        if silence_ms < self.next_score_ms:
            return None
        self.next_score_ms = silence_ms + opts.rescore_ms
        score = self.model.score(audio())
        complete = score.probability >= opts.threshold
        # The decision exists only once the model has run: its time includes the inference.
        decided_t_ns = t_ns + int(score.inference_ms * 1e6)
        self.last = TurnDecision(
            turn_id, decided_t_ns, complete, score.probability, score.inference_ms, silence_ms, "model"
        )
        return self.last


def end_of_turn_policy(turn: TurnOptions, vad: VadOptions, store: ModelStore) -> tuple[EndOfTurn, str]:
    """The policy ``turn`` asks for, and a notice when it had to fall back ('' otherwise).

    A missing or damaged Smart Turn model never stops the app: it falls back to fixed silence.
    """
    fixed = FixedSilence(vad.end_silence_ms, min(turn.pause_ms, vad.end_silence_ms))
    if turn.detection == "off":
        return fixed, ""
    from assistant.stages.smart_turn import SmartTurn, TurnModelError  # onnxruntime: only when used

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    # One core leaves the other to ASR on a 2-core machine; where cores are plenty, 4 threads
    # took a score from 60 to 40 ms (16-core Xeon, docs/benchmarks.md).
    threads = 1 if cores <= 2 else min(4, cores // 2)
    try:
        model = SmartTurn.from_store(store, turn.model, threads)
        model.warm_up()
    except TurnModelError as e:
        logger.warning("turn detection unavailable: %s", e)
        return fixed, f"turn detection off ({e}); ending turns after {vad.end_silence_ms} ms of silence"
    return SmartTurnPolicy(model, turn), ""


def with_partials_resolved(turn: TurnOptions, asr_device: str) -> TurnOptions:
    """``turn`` with ``partials`` made concrete (``on``/``off``) for this machine's ASR."""
    if turn.partials != "auto":
        return turn
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    room = asr_device == "cuda" or cores >= 2  # 2 cores: measured, docs/benchmarks.md
    return dataclasses.replace(turn, partials="on" if room else "off")


def describe(policy: EndOfTurn) -> str:
    """``smart-turn-v3.2 (pause 200 ms, max 1200 ms)`` or ``fixed silence 400 ms``."""
    if isinstance(policy, SmartTurnPolicy):
        o = policy.options
        return f"{o.model} (pause {o.pause_ms} ms, max {o.max_silence_ms} ms)"
    if isinstance(policy, FixedSilence):
        return f"fixed silence {policy.end_silence_ms} ms"
    return type(policy).__name__
