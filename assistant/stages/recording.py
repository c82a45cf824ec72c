"""The speech of a recorded file (``run --input``, the UI's replay), found as the microphone's would be."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from assistant.config.sections import VadOptions
from assistant.events import SpeechEnded, SpeechStarted
from assistant.stages.vad import SAMPLE_RATE_HZ, EndOfTurn, Endpointer


class NoSpeechInFile(ValueError):
    """The input file holds no speech the VAD accepts."""


def find_utterance(
    audio: np.ndarray, vad: VadOptions, path: Path, policy: EndOfTurn | None = None
) -> tuple[np.ndarray, float]:
    """The speech of a recorded file as one utterance, and the endpointing delay in ms.

    The file is run through the same streaming endpointer as the microphone, with the same
    end-of-turn ``policy`` (fixed silence when ``None``) and trailing silence appended, as if
    the speaker stopped; all speech it finds forms the turn, and the delay is the one the
    policy took after the last of it.
    """
    endpointer = Endpointer(VadOptions(**{**vad.__dict__, "max_utterance_s": 1e9}), policy=policy)
    events = endpointer.feed_recording(np.concatenate([audio, np.zeros(SAMPLE_RATE_HZ * 2, np.float32)]))
    ns_per_sample = 1e9 / SAMPLE_RATE_HZ
    ended = [e for e in events if isinstance(e, SpeechEnded)]
    started = [e for e in events if isinstance(e, SpeechStarted)]
    if not ended:
        raise NoSpeechInFile(f"no speech found in {path} (silence or noise only?)")
    first = max(int(started[0].t_ns / ns_per_sample) - vad.pre_roll_ms * SAMPLE_RATE_HZ // 1000, 0)
    last = int(ended[-1].speech_end_t_ns / ns_per_sample)
    delay_ms = (ended[-1].t_ns - ended[-1].speech_end_t_ns) / 1e6
    return audio[first : max(last, first + 1)], delay_ms
