"""The Textual UI on the virtual sound devices: a spoken turn, and the microphone closed on every exit."""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from assistant.tui.app import AssistantApp
from assistant.tui.breakdown import LEGEND, LatencyBreakdown, fmt_ms
from assistant.tui.conversation import Conversation
from assistant.tui.status import StatusBar
from tests.helpers.screen import screen_text
from tests.helpers.tui import builder, pipeline_threads, settings, sound_server_env, wait_until


@pytest.mark.asyncio
async def test_spoken_turn_on_the_virtual_mic_hears_answers_and_mutes(pulse, question_wav, monkeypatch):
    """The question spoken into the virtual mic: hearing, transcript, reply, breakdown; m mutes it."""
    sound_server_env(monkeypatch, pulse)
    s = settings()
    app = AssistantApp(builder(s), settings=s, gpu=False)
    env = {**os.environ, **pulse}
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.loop is not None and app.session is not None)
        await pilot.pause()
        screen = screen_text(app)
        assert "LISTENING" in screen and "in: " in screen and "out: none" not in screen, screen
        status = app.query_one(StatusBar)
        loudest = []

        def answered() -> bool:
            loudest.append(status.level_db if status.level_db is not None else -120.0)
            return bool(app.records)

        # Played without blocking the event loop, so the UI runs (and is sampled) meanwhile.
        play = await asyncio.create_subprocess_exec("paplay", "--device=micfeed", str(question_wav), env=env)
        await wait_until(pilot, answered)
        assert await play.wait() == 0
        await pilot.pause()
        assert max(loudest) > -40  # the level meter moved with the speech
        (record,) = app.records
        mic = app.session.mic
        lost = f"mic blocks dropped {mic.overflows}, PortAudio overflows {mic.device_overflows}"
        # Heard and transcribed, from its first word (tiny.en on the fitted window heard "What
        # is the capital and friends?" and once, in a two-worker run, "What is it?": ASR
        # accuracy is bench.asr_window's and the file-mode tests'; here the UI must show what
        # the pipeline produced).
        assert record.transcript.lower().startswith("what is"), (record.transcript, lost)
        shown = app.query_one(LatencyBreakdown).plain()
        for label, _short, key, _style in LEGEND:
            assert record.metrics[key] is not None, key
            assert f"{label} {fmt_ms(record.metrics[key])}" in shown, (label, shown, record)
        conversation = app.query_one(Conversation)
        assert " ".join(conversation.reply_text(record.turn_id).split()) == " ".join(record.reply.split())
        screen = " ".join(screen_text(app).split())
        assert f"you: {record.transcript}" in screen and record.reply.split()[0] in screen, screen
        await pilot.press("m")
        assert "MUTED" in screen_text(app)
        subprocess.run(["paplay", "--device=micfeed", str(question_wav)], env=env, check=True)
        await pilot.pause(1.0)
        assert len(app.records) == 1 and not app.turn_events  # muted: nothing was heard
        await pilot.press("q")
    assert not pipeline_threads()


def source_outputs(env) -> list[str]:
    """Recording streams of clients on the virtual PulseAudio (one per open microphone).

    The virtual mic's own remap stream has no client (``-``) and is left out.
    """
    cmd = ["pactl", "list", "short", "source-outputs"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line.split("\t")[2] != "-"]


@pytest.mark.asyncio
async def test_the_app_ending_without_q_still_stops_listening_and_closes_the_devices(pulse, monkeypatch):
    """An exit that is not q (a failed test, an error): no capture thread or device watch outlives it."""
    sound_server_env(monkeypatch, pulse)
    s = settings()
    app = AssistantApp(builder(s), settings=s, gpu=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.loop is not None and app.session is not None)
        loop = app.loop
        app.exit(0)
        await pilot.pause()
    assert not loop.capture.thread.is_alive() and not loop.watch.thread.is_alive()
    assert not pipeline_threads()


@pytest.mark.asyncio
async def test_q_while_models_load_cancels_the_load_and_closes_the_microphone(pulse, monkeypatch):
    """Q during loading: the load stops at its next step, the app exits, no stream is left open."""
    sound_server_env(monkeypatch, pulse)
    env = {**os.environ, **pulse}
    s = settings()
    steps: list[str] = []
    app = AssistantApp(builder(s, steps=steps), settings=s, gpu=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: any(step.startswith("loading LLM") for step in steps))
        assert source_outputs(env), "the microphone should be open while the models load"
        await pilot.press("q")
        await pilot.pause()
        assert "quitting" in screen_text(app)
        await wait_until(pilot, lambda: app.loader is not None and not app.loader.is_alive(), 60)
        await pilot.pause()
    assert app.return_code == 0
    assert app.session is None and app.loop is None
    assert "ready" not in steps  # it stopped before the end, at a step boundary
    assert not source_outputs(env)  # the microphone it had opened is closed
    assert not pipeline_threads()
