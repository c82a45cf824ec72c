"""What ``run --no-tui`` prints for the end-of-turn decisions."""

from __future__ import annotations

import io

from assistant.events import TurnDecision
from assistant.modes.run import ConsoleReporter


def printed(*events) -> list[str]:
    out = io.StringIO()
    report = ConsoleReporter(out)
    for event in events:
        report(event)
    return out.getvalue().splitlines()


def test_a_turn_ended_on_a_question_says_so_and_the_model_looks_before_it_too():
    lines = printed(
        TurnDecision(3, 0, False, 0.11, 71.0, 224.0, "model"),
        TurnDecision(3, 0, True, 0.11, 0.0, 512.0, "question"),
    )
    assert lines == [
        "[turn 3] turn detector: not done, listening on (p=0.11, 71 ms, after 224 ms of silence)",
        "[turn 3] done: a question, after 512 ms of silence",
    ]
