"""``build_session`` loads ASR and the turn detector on a helper thread while the LLM loads.

Fakes stand in for the models (their loads are what is scheduled here); the real loads are
timed in docs/benchmarks.md ("Start-up") and run in the integration tests.
"""

from __future__ import annotations

import threading

import pytest

from assistant import app as session_module
from assistant.config import Settings
from assistant.stages.asr import AsrLoadError
from assistant.stages.dialogue import Dialogue
from assistant.stages.vad import FixedSilence


class FakeDecoder:
    closed = False

    def close(self):
        self.closed = True


class FakeTranscriber:
    device = "cpu"
    description = "fake"

    def warm_up(self):
        return 1.0


@pytest.fixture
def loads(monkeypatch):
    """Record which thread loads what; the LLM load waits (up to 10 s) for the ASR load to start."""
    seen: dict[str, str] = {}
    asr_started = threading.Event()
    decoder = FakeDecoder()

    def load_llm(*args, **kwargs):
        seen["llm"] = threading.current_thread().name
        seen["overlapped"] = str(asr_started.wait(10))
        return decoder, object()

    def open_transcriber(options, store):
        seen["asr"] = threading.current_thread().name
        asr_started.set()
        if seen.get("fail"):
            raise AsrLoadError("damaged ASR model")
        return FakeTranscriber()

    monkeypatch.setattr(session_module, "load_llm", load_llm)
    monkeypatch.setattr(session_module, "open_transcriber", open_transcriber)
    monkeypatch.setattr(
        session_module, "end_of_turn_policy", lambda turn, vad, store: (FixedSilence(600, 300), "")
    )
    monkeypatch.setattr(Dialogue, "warm_up", lambda self: 2.0)
    return seen, decoder


def test_asr_loads_on_a_helper_thread_while_the_llm_loads(loads):
    seen, _ = loads
    steps = []
    session = session_module.build_session(
        Settings(), devices=False, asr=True, tts=False, progress=lambda text, f: steps.append(text)
    )
    assert seen["llm"] == threading.current_thread().name != seen["asr"]
    assert seen["overlapped"] == "True"  # the ASR load started before the LLM load returned
    assert session.warm_up_ms == {"llm": 2.0, "asr": 1.0} and session.transcriber is not None
    assert [s.split()[0] for s in steps] == ["loading", "loading", "warming", "warming", "loading", "ready"]
    assert not [t for t in threading.enumerate() if t.name.startswith("load-listening")]


def test_a_failed_asr_load_raises_as_before_and_closes_the_llm(loads):
    seen, decoder = loads
    seen["fail"] = "yes"
    with pytest.raises(AsrLoadError, match="damaged ASR model"):
        session_module.build_session(Settings(), devices=False, asr=True, tts=False)
    assert decoder.closed
    assert not [t for t in threading.enumerate() if t.name.startswith("load-listening")]
