"""One spoken turn on the live session of the virtual devices, and the event kinds it produced."""

from __future__ import annotations

import os
import subprocess
import time

from assistant.events import (
    Event,
)
from assistant.stages.endpoint import TurnOptions
from assistant.turns.live import LiveLoop
from bench.speech import write_wav


def converse(live_session, pulse, audio_dir, audio, endpointer, turn: TurnOptions, name: str):
    """Play ``audio`` into the virtual mic; return the turn's record, its events and the history."""
    session, events = live_session
    events.clear()
    session.pipeline.records.clear()
    session.dialogue.turns, session.dialogue.transcript = [], []
    session.speaker.first_audio_t_ns.clear()  # each test's endpointer numbers turns from 1 again
    session.speaker.played_samples.clear()
    loop = LiveLoop(session.pipeline, session.mic, session.speaker, endpointer, turn=turn)
    loop.start()
    try:
        wav = write_wav(audio_dir / f"{name}.wav", audio)
        subprocess.run(["paplay", "--device=micfeed", str(wav)], env={**os.environ, **pulse}, check=True)
        deadline = time.monotonic() + 120
        while not session.pipeline.records or loop.busy():
            assert time.monotonic() < deadline, kinds(events)
            time.sleep(0.1)
        time.sleep(1.0)  # nothing else may follow
    finally:
        loop.stop()
        # The next test's loop starts the microphone again: leave it opened but not started.
        # Stopping its stream directly made PortAudio report it finished, which the next
        # test's device watch then took for a lost microphone (and missed its first 0.6 s).
        session.mic.running = False
        session.mic.reopen()
    return session.pipeline.records, list(events), list(session.dialogue.turns)


def kinds(events: list[Event]) -> list[str]:
    return [type(e).__name__ for e in events]
