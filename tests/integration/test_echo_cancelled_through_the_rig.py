"""The echo canceller stage on the real echo rig: the echo of a played reply is removed from the mic.

The reply (espeak-ng, the app's voice) plays on the virtual speaker with the rig's echo path
(60 ms, -13 dB, two reflections); what played and what the microphone heard are recorded on one
clock and fed to :class:`assistant.stages.echo.EchoCanceller` in the capture path's 32 ms blocks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from assistant.config.sections import EchoOptions
from assistant.stages.echo import SAMPLE_RATE_HZ, EchoCanceller, load_processor
from bench.echo_rig import echo_path, play_and_record
from bench.speech import silence, speak, trim

pytest.importorskip("livekit")

# This test's ERLE of the canceller's ungated output (what is left of the echo before the
# leftover is silenced for the VAD) over the reply after its first second: 47-56 dB with the far
# end handed over a block ahead, as the speaker's callback does; 28-34 dB with it handed over just
# in time (the 20 ms lead then finds the end of each block missing: the project's CI failed on
# that once, at 23.8 dB against a threshold of 25, when the test measured the gated output);
# 0.0 dB without the far end. 35 dB lies between.
MIN_ERLE_DB = 35
BLOCK = 512
REPLY = "The Pacific is the largest ocean on Earth. It covers about a third of the planet's surface."


@pytest.fixture(scope="module")
def recording(
    pulse: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[np.ndarray, np.ndarray]:
    """(far end, near end): the reply as played, and the microphone hearing its echo."""
    folder: Path = tmp_path_factory.mktemp("echo")
    reply = np.concatenate([silence(0.2), trim(speak(REPLY, folder)), silence(0.3)])
    with echo_path(pulse, delay_ms=60, gain_db=-13, reflections=2):
        return play_and_record(pulse, reply)


def erle_after_first_second(far: np.ndarray, near: np.ndarray, give_far_end: bool) -> float:
    """ERLE (dB) of the stage's ungated output over the recording after its first second."""
    options = EchoOptions(enabled="on")
    canceller = EchoCanceller(options, load_processor(options))
    t0 = 10**12
    out = []
    for i in range(0, len(near) - BLOCK + 1, BLOCK):
        t_ns = t0 + i * 1_000_000_000 // SAMPLE_RATE_HZ
        if give_far_end:  # as the speaker's callback hands it over: this block and the next, ahead
            canceller.play(far[i : i + 2 * BLOCK], t_ns)
        out.append(canceller.process(near[i : i + BLOCK], t_ns).audio)
    cancelled = np.concatenate(out)
    tail = slice(SAMPLE_RATE_HZ, len(cancelled))
    erle = 10 * np.log10(np.sum(near[tail] ** 2) / max(np.sum(cancelled[tail] ** 2), 1e-12))
    print(f"far end {'given' if give_far_end else 'withheld'}: ERLE {erle:.1f} dB, {canceller.stats()}")
    return float(erle)


def test_the_canceller_removes_the_echo_of_a_played_reply(recording: tuple[np.ndarray, np.ndarray]) -> None:
    """With the far end, at least MIN_ERLE_DB of the echo goes."""
    far, near = recording
    assert np.sum(near**2) > 0.01 * np.sum(far**2)  # the rig did echo (about -12 dB)
    assert erle_after_first_second(far, near, give_far_end=True) >= MIN_ERLE_DB


def test_with_the_canceller_off_the_same_check_fails(recording: tuple[np.ndarray, np.ndarray]) -> None:
    """Without the far end (the canceller has nothing to cancel), the echo stays: the check above fails."""
    far, near = recording
    assert erle_after_first_second(far, near, give_far_end=False) < MIN_ERLE_DB
