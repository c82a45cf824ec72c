"""A reply's tokens to spoken sentences: decoder stream -> sentence splitter -> ``say``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from assistant.events import Event, PromptSubmitted, SentenceReady, TokenGenerated
from assistant.stages.dialogue import Reply
from assistant.turns.protocols import ReplyGate, Splits


def stream_reply(
    turn: int,
    reply: Reply,
    splitter: Splits,
    say: Callable[[int, str], None],
    cancel: threading.Event,
    gate: ReplyGate,
    emit: Callable[[Event], None],
    left_to_play_ms: Callable[[], float | None],
) -> None:
    """Feed the reply's tokens to the splitter and its sentences to ``say``.

    Unconfirmed (speculating), it stops after the first sentence until the gate is confirmed:
    one sentence ready to play is enough until the user is done. ``left_to_play_ms`` tells
    the splitter when the voice is about to run dry (:meth:`ReplyAudio.left_to_play_ms`).
    """
    index = 0
    submitted = False
    for chunk in reply:
        if not submitted:  # the stats know the prompt split only once iteration began
            submitted = True
            s = reply.stats
            emit(PromptSubmitted(turn, s.t_submit_ns, s.prompt_tokens, s.reused_tokens, s.network_ms))
        if chunk.token_id >= 0:
            emit(TokenGenerated(turn, chunk.t_ns, chunk.index, chunk.text))
        for sentence in splitter.push(chunk.text, left_to_play_ms()):
            emit(SentenceReady(turn, time.monotonic_ns(), index, sentence))
            say(index, sentence)
            index += 1
        if index and not (gate.wait(cancel) and gate.paced(cancel)):
            break  # dropped, or stopped while speech over the reply was judged
    if not submitted:
        s = reply.stats
        emit(PromptSubmitted(turn, s.t_submit_ns, s.prompt_tokens, s.reused_tokens))
    if not cancel.is_set() and not gate.discarded:
        for sentence in splitter.flush():
            emit(SentenceReady(turn, time.monotonic_ns(), index, sentence))
            say(index, sentence)
            index += 1
