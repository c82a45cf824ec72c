"""UI tests (Pilot on real sessions, snapshots, a tmux run): every test here is marked ``integration``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.speech import speak


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under this folder ``integration`` (``-m "not integration"`` is the unit part)."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory) -> Path:
    """ "What is the capital of France?" in espeak-ng, as a WAV."""
    folder = tmp_path_factory.mktemp("q")
    speak("What is the capital of France?", folder, "question")
    return folder / "question.wav"
