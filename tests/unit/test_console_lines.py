"""What ``run --no-tui`` prints, and the UI's breakdown shows, for the end-of-turn decisions."""

from __future__ import annotations

import io

from assistant.events import TurnDecision
from assistant.modes.run import ConsoleReporter
from assistant.observe.latency import TurnRecord
from assistant.tui.breakdown import _detector


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


def test_the_breakdown_names_the_rule_that_ended_a_turn_with_the_models_last_score():
    """A question or the cap ended it: the score says why the model did not (it read as absent)."""
    question = TurnRecord(1, turn_detector="question 0.03", turn_probability=0.03)
    capped = TurnRecord(2, turn_detector="max silence 0.11", turn_probability=0.11)
    scored = {"turn_detection_ms": 62.0}
    model = TurnRecord(3, turn_detector="model 0.93", turn_probability=0.93, metrics=scored)
    fixed = TurnRecord(4, turn_detector="fixed silence")
    assert [_detector(r, narrow=False) for r in (question, capped, model, fixed)] == [
        "question p0.03", "max silence p0.11", "p0.93/62 ms", "fixed silence",
    ]  # fmt: skip
