"""The echo removed by a linear fit alone (``EchoSpan.cleaned``): how the judge hears a word over a reply.

Synthetic signals, no models: a far end of speech-band noise in bursts, its echo at the
microphone on two taps as on the echo rig (60 ms at -13 dB and 83 ms at -19 dB) whose delay
drifts by a fraction of a sample as the rig's loopback resamples, and a burst of the user's
"voice" (noise of its own) over it. The same through AEC3 is tested in
``tests/integration/test_stop_over_the_echo.py`` with real speech and tiny.en.
"""

from __future__ import annotations

import numpy as np
import pytest

from assistant.stages.echo_linear import LEAD_S, EchoTrack
from tests.helpers.echo import echo_of

RATE = 16000
BLOCK = 512
T0_NS = 10**12
SECONDS = 6
SPEECH = RATE  # the user's burst: the last second


def speech_band(rng: np.random.Generator, n: int) -> np.ndarray:
    """Noise low-passed at 4 kHz, in bursts three times a second (a far end that pauses, as speech does)."""
    k = np.arange(-32, 33)
    low_pass = np.sinc(k / 4) / 4 * np.hanning(k.size)
    noise = np.convolve(rng.standard_normal(n), low_pass, "same") * 0.1
    return noise * (np.sin(2 * np.pi * 3 * np.arange(n) / RATE) > -0.3)


def jitter_ns(i: int) -> int:
    """-3 to +3 ms: the time the speaker callback gives its block is off by that much."""
    return (i // BLOCK * 5 % 7 - 3) * 1_000_000


def tracked(near: np.ndarray, far: np.ndarray) -> EchoTrack:
    """Both streams added block by block, each block with the time of its last sample.

    The far end's times jitter as the speaker callback's do (:func:`jitter_ns`): its blocks
    still follow each other whole, which the fit needs to the sample.
    """
    track = EchoTrack(10)
    for i in range(0, near.size, BLOCK):
        end = min(i + BLOCK, near.size)
        track.add_near(near[i:end].astype(np.float32), T0_NS + (end - 1) * 62_500)
        track.add_far(far[i:end].astype(np.float32), T0_NS + (end - 1) * 62_500 + jitter_ns(i))
    return track


def db(x: np.ndarray, y: np.ndarray) -> float:
    return 10 * float(np.log10(np.sum(x**2) / np.sum(y**2)))


@pytest.mark.parametrize("drift", [0.0, 1e-4, -1e-4], ids=["no drift", "0.1 ms a second", "-0.1 ms a second"])
def test_the_echo_under_a_word_is_removed_and_the_word_kept_whole(drift: float) -> None:
    rng = np.random.default_rng(3)
    n = SECONDS * RATE
    far = speech_band(rng, n)
    user = np.zeros(n)
    user[-SPEECH:] = 0.05 * rng.standard_normal(SPEECH)  # nothing suppresses it, consonants and all
    echoed = echo_of(far, drift=drift)
    span = tracked(echoed + user, far).span(T0_NS + (n - 1) * 62_500, SPEECH)
    assert span is not None and span.far.size == span.near.size + int(LEAD_S * RATE)
    cleaned = span.cleaned()
    assert cleaned is not None and cleaned.size == SPEECH
    left = cleaned - user[-SPEECH:]  # what is left of the echo
    assert db(echoed[-SPEECH:], left) > 20  # ~3.5 dB if the drift were not followed
    assert np.corrcoef(cleaned, user[-SPEECH:])[0, 1] > 0.99


def test_nothing_played_before_the_speech_gives_no_view() -> None:
    rng = np.random.default_rng(4)
    n = SECONDS * RATE
    far = np.zeros(n)
    far[-SPEECH // 2 :] = speech_band(rng, SPEECH // 2)  # the reply began under the word
    span = tracked(echo_of(far) + 0.05 * rng.standard_normal(n), far).span(T0_NS + (n - 1) * 62_500, SPEECH)
    assert span is not None and span.cleaned() is None


def test_a_span_older_than_the_track_keeps_is_none() -> None:
    track = tracked(np.zeros(3 * RATE), np.zeros(3 * RATE))
    assert track.span(T0_NS + (3 * RATE - 1) * 62_500, 2 * RATE) is None  # 2 s + the fit + the lead > 3 s


@pytest.mark.parametrize("delay_ms", [2, 5, 60, 390])
@pytest.mark.parametrize("speech_s", [0.1, 3.0])
def test_any_echo_delay_the_fit_can_reach_and_any_speech_length_give_a_view_of_the_speech(
    delay_ms: int, speech_s: float
) -> None:
    """From a microphone next to the speaker to the longest delay looked for.

    An echo the streams' times put before its sound (a delay of 0 or less) is not fitted: the
    view is then the microphone as it is (AEC3's own delay estimate on the rig: 12-60 ms).
    """
    rng = np.random.default_rng(6)
    n, speech = SECONDS * RATE, int(speech_s * RATE)
    far = speech_band(rng, n)
    near = np.zeros(n)
    d = delay_ms * RATE // 1000
    near[d:] = 0.2 * far[: n - d]
    span = tracked(near, far).span(T0_NS + (n - 1) * 62_500, speech)
    cleaned = span.cleaned() if span is not None else None
    assert cleaned is not None and cleaned.size == speech
    assert db(near[-speech:], cleaned) > 20
