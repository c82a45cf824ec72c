"""Long speech through the virtual microphone: cut for length while the user speaks, answered once.

The file-mode and headless tests of long speech are in ``test_long_speech_kept.py``; this one
plays audio at real speed on the virtual devices (the real-time worker, tests/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from assistant.events import AudioStarted, SpeechEnded, TurnHeld
from assistant.stages.vad import Endpointer, VadOptions
from bench.speech import lost_sentences, numbered_sentences, silence, speak
from tests.helpers.turns import converse


@pytest.mark.slow
def test_live_long_speech_is_cut_without_loss_and_answered_after_the_user_stops(
    live_session, pulse, tmp_path
):
    """Five sentences (~25 s) with ``max_utterance_s`` 5: several cuts while the user speaks.

    Nothing plays until the user has stopped, then one reply answers every sentence. (It was
    eight sentences with cuts at 8 s: the same three or more cuts, 15 s more of real-time audio.)
    """
    last = 5
    audio = np.concatenate([silence(0.3), speak(numbered_sentences(last), tmp_path, "five"), silence(2.5)])
    session, _ = live_session
    vad = VadOptions(max_utterance_s=5.0)
    turn = session.settings_turn
    endpointer = Endpointer(vad, policy=session.turn_policy, pause_ms=turn.speculate_after_ms)
    records, events, turns = converse(live_session, pulse, tmp_path, audio, endpointer, turn, "long-live")
    ended = [e for e in events if isinstance(e, SpeechEnded)]
    heard = " ".join(r.transcript for r in records)
    assert lost_sentences(heard, last) == [], f"sentences lost across the turns: {heard}"
    assert sum(e.cut for e in ended) >= 3
    last_speech_ns = max(e.speech_end_t_ns for e in ended)
    started = [e for e in events if isinstance(e, AudioStarted)]
    early = [e.turn_id for e in started if e.t_ns <= last_speech_ns]
    assert early == [], f"replies of turns {early} played while the user was still speaking"
    (record,) = records  # one answer to the whole utterance
    assert len(started) == 1 and len(turns) == 1
    assert record.held_turns == [e.turn_id for e in events if isinstance(e, TurnHeld)] != []
