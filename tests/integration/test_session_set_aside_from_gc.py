"""What a session loaded is kept out of the garbage collector's full collections.

A full collection holds the GIL while it walks every object the collector tracks; with the
models and the UI loaded it took 50-76 ms, long enough for the speaker's callback to miss its
block (``python -m bench.ui``, docs/benchmarks.md). ``build_session`` freezes what it loaded
(``gc.freeze``) and, first, unfreezes and collects what an earlier session left.
"""

from __future__ import annotations

import gc
import weakref

from assistant.app import build_session
from assistant.config import load_settings


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_a_session_is_frozen_and_the_next_one_collects_what_the_last_one_left(model_dir) -> None:
    settings = load_settings(None, overrides={"decoder.backend": "pytorch", "decoder.threads": 2})
    node = Node()  # alive when the session is built: frozen with it
    left = weakref.ref(node)
    first = build_session(settings, devices=False, asr=False, tts=False)
    try:
        walked = {id(o) for o in gc.get_objects()}  # what a full collection walks now
        assert id(first.dialogue) not in walked and id(first.pipeline) not in walked
        del node
        gc.collect()
        assert left() is not None  # frozen: a full collection no longer looks at it
    finally:
        first.close()
    second = build_session(settings, devices=False, asr=False, tts=False)
    try:
        assert left() is None  # unfrozen and collected before the new session was frozen
        assert gc.get_freeze_count() > 0
    finally:
        second.close()
