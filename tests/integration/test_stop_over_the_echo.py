"""A lone "Stop." said over a reply on speakers is heard as a request to stop.

The capture path of the app without its threads or devices: the reply's echo (60 ms, -13 dB
and a reflection, as on the echo rig, optionally with its clock drift) and espeak-ng's "Stop."
at the microphone, through the real echo canceller (WebRTC AEC3), the endpointer (Silero VAD)
and the judge of speech over a reply (tiny.en). The reply stops 300 ms after the word begins
(the app pauses it ~110 ms after the onset; what the speaker had queued plays on). AEC3's
suppression and the residual gate take the word's soft start under the reply's echo: tiny.en
heard nothing in the gated audio alone (the reply played on), so the judge looks for a stop
request in the speech with the echo removed by a linear fit alone too (``EchoSpan.cleaned``).
With the rig's drift, AEC3's output before the gate (what the judge had before) read "Up.",
"Uh." or nothing at most of these onsets.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile

from assistant.config.sections import EchoOptions, VadOptions
from assistant.events import OnsetEnded, OverlapVerdict, SpeechPaused
from assistant.stages.asr import AsrOptions, Transcriber
from assistant.stages.echo import EchoCanceller, load_processor
from assistant.stages.echo_linear import EchoTrack
from assistant.stages.vad import SAMPLE_RATE_HZ, Endpointer
from assistant.turns.hearing import Hearing
from assistant.turns.overlap_words import judge
from bench.corpus import ECHO_REPLY as REPLY
from bench.duplex_rig import utterance
from store.bundled import ModelStore
from tests.helpers.echo import echo_of

pytest.importorskip("livekit")
pytestmark = pytest.mark.slow

BLOCK = 512  # the microphone's 32 ms blocks
PLAYS_ON_S = 0.3  # the reply's sound after the word began


def spoken(folder: Path, text: str, name: str) -> np.ndarray:
    samples, rate = soundfile.read(utterance(folder, text, name), dtype="float32")
    assert rate == SAMPLE_RATE_HZ
    return samples


def overheard(far: np.ndarray, near: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """What the judge gets: the speech's audio and the same with the echo removed by a linear fit alone."""
    options = EchoOptions(enabled="on")
    canceller = EchoCanceller(options, load_processor(options))
    endpointer = Endpointer(VadOptions())
    track = EchoTrack(10)
    t0 = 10**12
    for i in range(0, len(near) - BLOCK + 1, BLOCK):
        t_ns = t0 + i * 1_000_000_000 // SAMPLE_RATE_HZ
        canceller.play(far[i : i + 2 * BLOCK], t_ns)  # the speaker's callback writes a block ahead
        track.add_far(far[i : i + BLOCK], t_ns + (BLOCK - 1) * 62_500)
        out = canceller.process(near[i : i + BLOCK], t_ns)
        t_end_ns = t_ns + (out.audio.size - 1) * 62_500  # as Duplex.clean times what it passes on
        track.add_near(out.near, t_end_ns)
        for event in endpointer.feed(out.vad, t_end_ns):
            if isinstance(event, OnsetEnded | SpeechPaused):  # what the overlap is judged on
                span = track.span(event.t_ns, event.audio.size)
                return event.audio, span.cleaned() if span is not None else None
    raise AssertionError("the word over the reply was never heard as speech")


@pytest.fixture(scope="module")
def asr(store: ModelStore) -> Transcriber:
    store.fetch("whisper-tiny.en", progress=lambda _msg: None)
    return Transcriber(AsrOptions(device="cpu", cpu_threads=2), store)


@pytest.mark.parametrize("drift", [0.0, 1e-4], ids=["steady", "drifting 0.1 ms a second"])
@pytest.mark.parametrize("onset_s", [2.5, 3.0, 3.5])  # into the reply (with the gated signal: 3.0 failed)
def test_a_lone_stop_over_the_replys_echo_is_a_stop_request(
    asr: Transcriber, tmp_path: Path, onset_s: float, drift: float
) -> None:
    reply = spoken(tmp_path, REPLY, "reply")
    stop = spoken(tmp_path, "Stop.", "stop")
    onset = int(onset_s * SAMPLE_RATE_HZ)
    far = np.zeros(onset + 2 * SAMPLE_RATE_HZ, np.float32)
    far[: onset + int(PLAYS_ON_S * SAMPLE_RATE_HZ)] = reply[: onset + int(PLAYS_ON_S * SAMPLE_RATE_HZ)]
    near = echo_of(far, drift=drift)
    start = onset - int(0.2 * SAMPLE_RATE_HZ)  # the WAV's 0.2 s of silence before the word
    near[start : start + stop.size] += stop
    audio, ungated = overheard(far, near)
    assert ungated is not None and ungated.size == audio.size
    heard = Hearing(asr, lambda _event: None).transcribe_overlap(audio, None, ungated).text
    assert judge(heard) is OverlapVerdict.STOP, heard
