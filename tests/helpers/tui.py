"""Sessions for the Textual UI tests: settings, a session builder, waits and a fixed session to show."""

from __future__ import annotations

import os
import threading
import time

from assistant.app import SessionInfo, build_session
from assistant.config import load_settings
from assistant.events import (
    AudioReady,
    PartialTranscript,
    PromptSubmitted,
    SentenceReady,
    SpeculationStarted,
    SpeechEnded,
    SpeechPaused,
    SpeechStarted,
    TokenGenerated,
    TranscriptReady,
    TurnDecision,
)
from assistant.observe.latency import TurnRecord, build_record
from assistant.tui.breakdown import LatencyBreakdown
from assistant.tui.messages import PipelineEvent, SessionReady


def settings(**extra):
    return load_settings(
        None,
        overrides={"generation.max_new_tokens": 24, "decoder.threads": 2, "asr.cpu_threads": 2, **extra},
    )


def rescan_audio_devices() -> None:
    """PortAudio lists devices once, at initialisation: start it again under the new env."""
    import sounddevice as sd

    sd._terminate()
    sd._initialize()


def sound_server_env(monkeypatch, env: dict[str, str]) -> None:
    """Reach the sound server of ``env`` (the virtual PulseAudio's variables) from this process."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    rescan_audio_devices()


def no_audio_env(monkeypatch, tmp_path) -> None:
    """As on a machine without a sound server (PortAudio lists no devices)."""
    for key in list(os.environ):
        if key.startswith(("PULSE", "ALSA")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("PULSE_SERVER", f"unix:{tmp_path}/no-such-server")
    rescan_audio_devices()


async def wait_until(pilot, condition, timeout_s: float = 120.0) -> None:
    """Let the app run until ``condition()`` holds (a deadline, not a latency assertion)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the UI did not get there in time"
        await pilot.pause(0.1)


def builder(s, log_path=None, steps: list[str] | None = None, **kwargs):
    """The app's session builder over the real models; each load step is added to ``steps``."""

    def build(emit, progress, cancel):
        def seen(step, fraction):
            if steps is not None:
                steps.append(step)
            progress(step, fraction)

        return build_session(s, emit=emit, progress=seen, cancel=cancel, log_path=log_path, **kwargs)

    return build


def pipeline_threads() -> list[threading.Thread]:
    """Non-daemon threads still alive, besides the main one and the event loop's executor.

    ``asyncio_N`` is the test event loop's default executor (Textual uses it); pytest-asyncio
    shuts it down with the loop. Everything else (capture, turns, TTS) is ours to join.
    """
    return [
        t
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and not t.name.startswith("asyncio_")
    ]


INFO = SessionInfo(
    mic="virtmic",
    speaker="spk",
    asr="whisper-tiny.en cpu int8",
    llm="smollm2-135m-instruct",
    backend="pytorch-cpu fp32",
    engine="eager, nothing to cache",
    warm_up_ms={"llm": 212.0, "asr": 305.0},
    load_s=3.2,
    turn="smart-turn-v3.2 (pause 200 ms, max 1200 ms)",
)


MS = 1_000_000


def turn_events(turn: int, base_ns: int, words: list[str], finished: bool = True):
    """A voice turn's events at fixed times (speech end at ``base_ns``)."""
    events = [
        SpeechStarted(turn, base_ns - 1500 * MS),
        PartialTranscript(turn, base_ns - 600 * MS, "What is the capital", 900.0, 180.0),
        SpeechPaused(turn, base_ns + 128 * MS, base_ns),
        SpeculationStarted(turn, base_ns + 128 * MS, "asr"),
        TurnDecision(turn, base_ns + 286 * MS, True, 0.93, 62.0, 224.0, "model"),
        SpeechEnded(turn, base_ns + 286 * MS, base_ns),
        TranscriptReady(turn, base_ns + 520 * MS, "What is the capital of France?", 118.0),
        PromptSubmitted(turn, base_ns + 524 * MS, 60, 40),
    ]
    for i, word in enumerate(words):
        events.append(TokenGenerated(turn, base_ns + (610 + 55 * i) * MS, i, word))
    if finished:
        events += [
            SentenceReady(turn, base_ns + 900 * MS, 0, "".join(words).strip()),
            AudioReady(turn, base_ns + 930 * MS, 0, 2100.0),
        ]
    return events


async def show_fixed_session(app, pilot) -> None:
    app.query_one(LatencyBreakdown).clock = lambda: 31_234 * MS  # turn 3 is 1.2 s in
    app.post_message(SessionReady(INFO, None, ("fixed session for the snapshot",)))
    await pilot.pause()
    from assistant.events import AudioStarted, PlaybackEnded

    for turn, base in ((1, 10_000 * MS), (2, 20_000 * MS)):
        events = turn_events(turn, base, [" The", " capital", " of", " France", " is", " Paris", "."])
        events += [AudioStarted(turn, base + (960 + 40 * turn) * MS), PlaybackEnded(turn, base + 3000 * MS)]
        for e in events:
            app.post_message(PipelineEvent(e))
        await pilot.pause()

        record = build_record(turn, events, backend=INFO.backend, llm_model=INFO.llm, asr_model=INFO.asr)
        assert isinstance(record, TurnRecord)
        app.turn_done(record)
    for e in turn_events(3, 30_000 * MS, [" Berlin", " is"], finished=False):
        app.post_message(PipelineEvent(e))
    for _ in range(3):  # messages, then the layout they cause, then the scroll after layout
        await pilot.pause()
    await pilot.wait_for_scheduled_animations()
