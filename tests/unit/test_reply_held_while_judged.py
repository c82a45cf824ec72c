"""While speech over a playing reply is judged, the reply's generation waits (the judge gets the CPU).

On 2 cores the judge's Whisper pass shared the CPU with the reply's LLM and voice: a reply
paused for "Okay." stayed silent 2.2 s in a user check. The turn engine's ``PauseReply`` holds
the run's reply gate, ``ResumeReply`` releases it; a stop (cancel) or the user going on
(discard) ends the wait.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from assistant.stages.splitter import SentenceSplitter, SplitterOptions
from assistant.turns import actions as act
from assistant.turns.carry_out import Carrier
from assistant.turns.protocols import ReplyGate
from assistant.turns.reply_stream import stream_reply
from assistant.turns.runs import Run
from engines.base import GenerationStats, TokenChunk


def waits(gate: ReplyGate, cancel: threading.Event) -> tuple[threading.Thread, list[bool]]:
    """``gate.paced(cancel)`` (where generation waits) on a thread of its own; its answer in the list."""
    answer: list[bool] = []
    thread = threading.Thread(target=lambda: answer.append(gate.paced(cancel)))
    thread.start()
    return thread, answer


def test_a_held_gate_waits_until_released():
    gate, cancel = ReplyGate(), threading.Event()
    gate.hold()
    thread, answer = waits(gate, cancel)
    thread.join(0.2)
    assert thread.is_alive() and answer == []
    gate.release()
    thread.join(2)
    assert answer == [True]


def test_a_stop_or_the_user_going_on_ends_a_held_wait():
    for end in ("cancel", "discard"):
        gate, cancel = ReplyGate(), threading.Event()
        gate.hold()
        thread, answer = waits(gate, cancel)
        cancel.set() if end == "cancel" else gate.discard()
        thread.join(2)
        assert answer == [False], end


def test_a_reply_stopped_while_held_is_still_confirmed_so_its_heard_part_is_recorded():
    """A barge-in on a held reply: the run's last wait (confirmed?) must not read the hold as a
    discard, or the turn ends unrecorded (a CI run: the interrupted turn had no record)."""
    gate, cancel = ReplyGate(), threading.Event()
    gate.hold()
    cancel.set()
    assert gate.wait(cancel) is True


class Tokens:
    """A reply of ``n`` one-word tokens, a sentence every 5; logs when each is taken."""

    def __init__(self, n: int) -> None:
        self.n, self.taken_ns = n, []
        self.stats = GenerationStats(prompt_tokens=3)

    def __iter__(self):
        for i in range(self.n):
            self.taken_ns.append(time.monotonic_ns())
            yield TokenChunk(i, i + 1, f" word{i}{'.' if i % 5 == 4 else ''}", time.monotonic_ns())


def test_the_reply_takes_no_token_while_held_and_goes_on_once_released():
    gate, cancel, reply = ReplyGate(), threading.Event(), Tokens(40)
    said: list[str] = []
    held = threading.Event()

    def say(index: int, sentence: str) -> None:
        said.append(sentence)
        if index == 0:
            gate.hold()  # speech began over the first sentence
            held.set()

    splitter = SentenceSplitter(SplitterOptions(first_chunk_words=0))
    args = (1, reply, splitter, say, cancel, gate, lambda _e: None, lambda: None)
    thread = threading.Thread(target=stream_reply, args=args)
    thread.start()
    assert held.wait(5)
    taken = len(reply.taken_ns)
    time.sleep(0.3)
    assert len(reply.taken_ns) == taken < 40 and thread.is_alive()  # none taken while held
    released_ns = time.monotonic_ns()
    gate.release()
    thread.join(5)
    assert len(reply.taken_ns) == 40 and len(said) > 1
    assert all(t >= released_ns for t in reply.taken_ns[taken:])


@dataclass
class Played:
    """The speaker, as far as pausing goes."""

    calls: list[str] = field(default_factory=list)
    output_latency_ms: float = 0.0

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


class Runs:
    def __init__(self, run: Run) -> None:
        self.run = run

    def get(self, attempt: int) -> Run | None:
        return self.run if attempt == 7 else None


def test_pausing_the_reply_holds_its_generation_and_resuming_releases_it():
    run, speaker = Run(3), Played()
    carrier = Carrier(Runs(run), speaker, None, lambda _e: None, lambda _t: None)  # type: ignore[arg-type]
    carrier.apply([act.PauseReply(7, 3, 0, 4)])
    assert speaker.calls == ["pause"] and not run.gate._free.is_set()
    carrier.apply([act.ResumeReply(7)])
    assert speaker.calls == ["pause", "resume"] and run.gate._free.is_set()
    carrier.apply([act.PauseReply(9, 3, 0, 4), act.ResumeReply(9)])  # its run ended already: nothing held
