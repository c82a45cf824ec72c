"""Integration tests: every test here is marked ``integration``; the live session of the virtual devices."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from assistant.config import load_settings
from assistant.events import (
    Event,
)


@pytest.fixture(autouse=True)
def _no_app_left_running():
    """An app a test started with ``tests.helpers.voice.Live`` is killed when the test ends."""
    from tests.helpers.voice import kill_leftover_apps

    yield
    kill_leftover_apps()


@pytest.fixture(scope="module")
def live_session(pulse, store):
    """One session (devices, LLM, ASR, TTS, Smart Turn) on the virtual PulseAudio."""
    from tests.helpers.tui import rescan_audio_devices

    saved = {k: os.environ.get(k) for k in pulse}
    os.environ.update(pulse)
    rescan_audio_devices()
    from assistant.app import build_session

    events: list[Event] = []
    s = load_settings(
        None,
        overrides={
            "decoder.backend": "pytorch",
            "decoder.threads": 2,
            "asr.cpu_threads": 2,
            "generation.max_new_tokens": 24,
        },
    )
    session = build_session(s, emit=events.append)
    assert session.mic is not None and session.speaker is not None, session.notices
    yield session, events
    session.close()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    rescan_audio_devices()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under this folder ``integration`` (``-m "not integration"`` is the unit part)."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.integration)
