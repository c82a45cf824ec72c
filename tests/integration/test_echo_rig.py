"""The echo rig of ``scripts/virtual-audio.sh echo``: the delay and gain it is asked for reach the mic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.echo_rig import echo_path, estimate_echo, play_and_record
from bench.speech import speak, trim


@pytest.fixture(scope="module")
def utterance(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """About 3 s of espeak-ng speech."""
    folder: Path = tmp_path_factory.mktemp("rig")
    return trim(speak("The quick brown fox jumps over the lazy dog near the river bank.", folder))


@pytest.mark.parametrize(("delay_ms", "gain_db"), [(60, -13), (150, -20)])
def test_echo_path_has_the_delay_and_gain_asked_for(
    pulse: dict[str, str], utterance: np.ndarray, delay_ms: int, gain_db: float
) -> None:
    """The direct tap arrives ``delay_ms`` (plus PulseAudio's ~10 ms transport) later at ``gain_db``.

    Measured once more when the first reading is off: PulseAudio's loopbacks reach their latency
    by adjusting their rate, and on a machine busy with the compute lanes' exports one fresh-clone
    run read 104 ms at -20 dB for 60 ms at -13 dB half a second after the path was loaded.
    """
    with echo_path(pulse, delay_ms, gain_db, reflections=2):
        for attempt in (1, 2):
            echo = estimate_echo(*play_and_record(pulse, utterance))
            print(f"asked {delay_ms} ms {gain_db} dB: measured {echo} (attempt {attempt})")
            if delay_ms <= echo.delay_ms <= delay_ms + 25 and abs(echo.gain_db - gain_db) < 1.5:
                break
    assert delay_ms <= echo.delay_ms <= delay_ms + 25
    assert abs(echo.gain_db - gain_db) < 1.5


def test_without_the_echo_path_the_microphone_hears_nothing(
    pulse: dict[str, str], utterance: np.ndarray
) -> None:
    """``echo off`` removes every tap: what plays on ``spk`` no longer reaches ``virtmic``."""
    with echo_path(pulse, 60, -13):
        pass
    far, near = play_and_record(pulse, utterance)
    assert np.sum(far**2) > 0
    assert np.sum(near**2) == 0
