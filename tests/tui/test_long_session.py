"""A long session in the UI: what the screen keeps does not slow every reply down.

The conversation pane keeps its newest ``KEEP_ENTRIES`` entries: each entry is laid out again
every time a streamed reply grows, which with 1,000 turns on screen took ~250 ms a time
(``python -m bench.ui_growth``). The footer lets go of its old keys when it recomposes.

The garbage collector's full passes walk what the screen keeps; in the middle of replies they
held the GIL 50-76 ms, near what underruns the speaker (``python -m bench.ui``, ``python -m
bench.xruns``, docs/benchmarks.md). While the UI runs the collector makes none by itself;
the UI makes one at each finished turn, over what is new, and freezes what is left; every
``RECOLLECT_FROZEN_EVERY_TURNS`` turns it unfreezes first, so what died since is freed too.
"""

from __future__ import annotations

import gc
import weakref

import pytest
from textual.widgets._footer import FooterKey

from assistant.tui.app import AssistantApp
from assistant.tui.conversation import KEEP_ENTRIES, Conversation
from assistant.tui.feed import NO_FULL_PASSES, RECOLLECT_FROZEN_EVERY_TURNS
from tests.helpers.tui import show_fixed_session


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.mark.asyncio
async def test_the_collector_makes_no_full_pass_of_its_own_while_the_ui_runs_but_one_at_each_finished_turn():
    before = gc.get_threshold()
    app = AssistantApp(None, gpu=False)
    async with app.run_test(size=(120, 40)) as pilot:
        assert gc.get_threshold()[2] == NO_FULL_PASSES and gc.get_threshold()[:2] == before[:2]
        await show_fixed_session(app, pilot)  # two finished turns
        node = Node()
        left = weakref.ref(node)
        gc.collect(1)  # old now (not frozen): only a full pass frees it
        del node
        gc.collect(1)
        assert left() is not None
        app.turn_done(app.records[-1])
        assert left() is None
        await pilot.press("q")
    assert gc.get_threshold() == before


@pytest.mark.asyncio
async def test_a_finished_turn_sets_aside_what_is_alive_and_every_fiftieth_frees_what_died_since():
    app = AssistantApp(None, gpu=False)
    gc.unfreeze()
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            node = Node()  # alive at the end of the turns below, as the screen's lines are
            left = weakref.ref(node)
            await show_fixed_session(app, pilot)  # two finished turns
            assert len(app.records) == 2
            assert id(node) not in {id(o) for o in gc.get_objects()}  # no longer walked
            del node
            gc.collect()
            assert left() is not None  # frozen: garbage, but set aside
            while len(app.records) < RECOLLECT_FROZEN_EVERY_TURNS - 1:
                app.turn_done(app.records[-1])
            assert left() is not None
            app.turn_done(app.records[-1])  # the fiftieth
            assert left() is None
            await pilot.press("q")
    finally:
        gc.unfreeze()


@pytest.mark.asyncio
async def test_the_conversation_keeps_its_newest_entries_and_a_trimmed_turn_can_still_be_shown():
    app = AssistantApp(None, gpu=False)
    async with app.run_test(size=(120, 40)) as pilot:
        pane = app.query_one(Conversation)
        turns = KEEP_ENTRIES  # a question and a reply each: twice the entries kept
        for turn in range(1, turns + 1):
            pane.user(turn, f"question {turn}")
            pane.token(turn, f" answer {turn}")
            pane.flush()
        await pilot.pause()
        shown = [str(widget.render()) for widget in pane.children]
        assert len(shown) == KEEP_ENTRIES
        assert shown[0] == f"you: question {turns - KEEP_ENTRIES // 2 + 1}"
        assert shown[-1] == f"assistant: answer {turns}"
        pane.user(1, "question 1, late")  # a turn whose entry went: shown anew, at the bottom
        pane.token(1, " answer 1, late")
        pane.flush()
        await pilot.pause()
        shown = [str(widget.render()) for widget in pane.children]
        assert shown[-2:] == ["you: question 1, late", "assistant: answer 1, late"]
        assert len(shown) == KEEP_ENTRIES
        await pilot.press("q")


@pytest.mark.asyncio
async def test_the_footer_lets_go_of_its_old_keys_when_the_text_box_takes_the_keys_and_gives_them_back():
    """Textual kept every recomposed footer's keys alive (bound to a reactive that never changes)."""
    app = AssistantApp(None, gpu=False)
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(5):  # a typed turn: t opens the text box, which takes the keys
            await pilot.press("t")
            await pilot.pause()
            await pilot.press("escape")
            await pilot.pause()
        await pilot.pause(0.3)
        gc.collect()
        keys = [o for o in gc.get_objects() if type(o) is FooterKey]
        assert len(keys) == sum(key.is_attached for key in keys) > 0
        await pilot.press("q")
