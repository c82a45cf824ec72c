"""The Textual UI: Pilot tests on real sessions (real models) without sound devices, snapshots, a tmux run.

The tests on the virtual sound devices are in ``test_ui_sound.py`` (they run on the real-time
worker, tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from assistant.observe.gpu import GpuMonitor, GpuSample
from assistant.observe.latency import STAGES, TurnRecord, percentiles
from assistant.tui.app import AssistantApp
from assistant.tui.breakdown import LEGEND, LatencyBreakdown, fmt_ms
from assistant.tui.conversation import Conversation
from assistant.tui.stats import SessionStats
from assistant.tui.status import StatusBar
from engines.onnx_export import ExportOptions, export_decoder
from tests.helpers.families import tiny_smollm2
from tests.helpers.screen import screen_text
from tests.helpers.tui import (
    builder,
    no_audio_env,
    pipeline_threads,
    settings,
    show_fixed_session,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = Path(__file__).parent / "snapshots"


@pytest.mark.asyncio
async def test_replayed_file_turn_shows_the_breakdown_of_its_json_record(question_wav, tmp_path, monkeypatch):
    """``--input`` in the UI (demo booth): the breakdown shows the numbers of the turn's JSON line."""
    no_audio_env(monkeypatch, tmp_path)
    log = tmp_path / "turns.jsonl"
    s = settings()
    app = AssistantApp(builder(s, log, asr=True, tts=True), input_wav=question_wav, settings=s, gpu=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.records)
        await pilot.pause()
        (line,) = log.read_text().splitlines()
        rec = json.loads(line)
        shown = app.query_one(LatencyBreakdown).plain()
        for label, _short, key, _style in LEGEND:
            assert rec["metrics"][key] is not None
            assert f"{label} {fmt_ms(rec['metrics'][key])}" in shown, (label, shown)
        assert f"voice-to-voice {fmt_ms(rec['metrics']['voice_to_voice_ms'])}" in shown
        assert f"{rec['metrics']['tokens_per_s']:.1f} tok/s" in shown
        screen = screen_text(app)
        assert "capital of france" in screen.lower() and "Paris" in screen
        assert "replaying question.wav" in screen
        # The statistics table has this one turn.
        assert re.search(rf"voice-to-voice\s+{rec['metrics']['voice_to_voice_ms']:.0f}\s", screen), screen
        await pilot.press("q")
    assert not pipeline_threads()


@pytest.mark.asyncio
async def test_no_microphone_typed_turns_stats_export_and_clean_quit(tmp_path, monkeypatch):
    """No devices: a notice, then t + typing gets replies; stats follow; e exports; q joins all."""
    no_audio_env(monkeypatch, tmp_path)
    before = set(threading.enumerate())
    s = settings()
    app = AssistantApp(builder(s), settings=s, export_dir=tmp_path / "reports", gpu=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.loop is not None and app.has_mic is False and app.session)
        await pilot.pause()
        screen = screen_text(app)
        assert "no voice" in screen and "no audio input device" in screen
        assert "TEXT MODE" in screen
        questions = ["What is the capital of France?", "Say hello.", "Name a colour."]
        for n, question in enumerate(questions, 1):
            await pilot.press("t")
            await pilot.press(*question)
            await pilot.press("enter")
            await wait_until(pilot, lambda n=n: len(app.records) == n)
        await pilot.pause()
        screen = screen_text(app)
        assert "Paris" in screen
        assert app.records[0].transcript == questions[0] and "Paris" in app.records[0].reply
        # Typed turns have LLM stages, not the voice ones.
        assert app.records[0].metrics["ttft_ms"] is not None
        assert app.records[0].metrics["endpointing_ms"] is None
        stats = percentiles(app.records)
        assert "session: 3 turns" in screen
        ttft = stats["ttft_ms"]
        cells = "\\s+".join(f"{ttft[k]:.0f}" for k in ("p50", "p95", "p99"))
        row = f"TTFT\\s+{cells}\\s+~{ttft['p999']:.0f}\\s+{ttft['max']:.0f}\\s+3"
        assert re.search(row, screen), screen  # P99.9 of 3 turns: marked rough, and the footnote says why
        assert "~ rough: P99.9 needs n ≥ 1000" in screen
        assert re.search(r"endpointing\s+-\s+-\s+-\s+-\s+-\s+0", screen)
        await pilot.press("e")
        await pilot.pause()
        (csv_path,) = (tmp_path / "reports").glob("latency-*.csv")
        rows = csv_path.read_text().splitlines()
        assert len(rows) == 4 and rows[0].startswith("turn_id,transcript")
        report = json.loads(csv_path.with_suffix(".json").read_text())
        assert report["turns"] == 3 and report["percentiles"]["ttft_ms"]["p50"] == pytest.approx(ttft["p50"])
        assert report["percentiles"]["ttft_ms"]["p999"] == pytest.approx(ttft["p999"])
        await pilot.press("q")
    assert app.return_code == 0
    left = [t for t in pipeline_threads() if t not in before]
    assert not left, left


@pytest.mark.asyncio
async def test_s_stops_the_reply_being_written_keeps_its_words_and_the_next_question_is_answered(
    tmp_path, monkeypatch
):
    """S while a long reply is written: it stops there, as a spoken "stop" would; S with none: a notice."""
    no_audio_env(monkeypatch, tmp_path)
    s = settings(**{"generation.max_new_tokens": 400})
    app = AssistantApp(builder(s), settings=s, export_dir=tmp_path, gpu=False)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await wait_until(pilot, lambda: app.loop is not None and app.session)
        await pilot.press("s")
        await wait_until(pilot, lambda: any("nothing to stop" in t.message for t in app._notifications))

        def tokens() -> int:
            return sum(type(e).__name__ == "TokenGenerated" for e in app.fold.turn_events.get(1, []))

        await pilot.press("t", *"Tell me about the history of Paris.", "enter")
        await wait_until(pilot, lambda: tokens() >= 5)
        await pilot.press("s")
        await wait_until(pilot, lambda: len(app.records) == 1)
        stopped = app.records[0]
        assert stopped.cancelled == "interrupted", stopped
        assert stopped.reply and tokens() < 300  # its words so far, far short of the 400 asked
        await pilot.press("t", *"Say hello.", "enter")
        await wait_until(pilot, lambda: len(app.records) == 2)
        assert app.records[1].cancelled == "" and app.records[1].reply
        await pilot.press("q")
    assert app.return_code == 0


@pytest.mark.asyncio
async def test_a_chat_template_that_raises_is_named_once_and_typing_says_the_start_failed(
    model_dir, tmp_path, monkeypatch
):
    """It showed "error: template boom", then "still loading: try again" for every typed line, for ever."""
    no_audio_env(monkeypatch, tmp_path)
    folder = tmp_path / "model"
    folder.mkdir()
    for f in model_dir.iterdir():
        if f.is_file() and f.name not in ("chat_template.jinja", "assistant-model.json"):
            (folder / f.name).symlink_to(f)
    (folder / "chat_template.jinja").write_text("{{ raise_exception('template boom') }}")
    s = settings(**{"models.llm": str(folder), "decoder.backend": "pytorch"})
    app = AssistantApp(builder(s), settings=s, gpu=False)
    named = f"the chat template in {folder / 'chat_template.jinja'} fails (TemplateError: template boom)"

    def notices() -> list[str]:
        return [str(w.content) for w in app.query_one(Conversation).query(".notice")]

    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: any(n.startswith("error:") for n in notices()))
        await pilot.press("t", *"hello", "enter")
        await pilot.pause()
        shown = notices()
        assert shown[-2].startswith(f"error: {named}; fix the template or replace {folder}"), shown
        assert shown[-1].startswith(f"cannot answer: the start failed ({named}"), shown
        await pilot.press("q")
    assert app.return_code == 0


@pytest.mark.asyncio
async def test_status_bar_shows_the_onnx_export_cache_hit_then_the_rebuild_of_a_damaged_one(
    model_dir, tmp_path, monkeypatch
):
    """onnxruntime backend: a cached export reads as a hit; a damaged one is re-exported, not fatal.

    A random-weight model of SmolLM2's vocabulary: the export and its cache are the same code
    at any size, and the real model's export is the ONNX tests' (tests/integration/).
    """
    no_audio_env(monkeypatch, tmp_path)
    folder = tiny_smollm2(tmp_path / "models" / "tiny", model_dir)
    exported = export_decoder(folder, ExportOptions(dtype="fp32"))
    s = settings(**{"models.llm": str(folder), "decoder.backend": "onnxruntime"})

    async def start(expect: str) -> tuple[list[str], str]:
        steps: list[str] = []
        app = AssistantApp(builder(s, steps=steps), settings=s, gpu=False)
        async with app.run_test(size=(160, 40)) as pilot:
            await wait_until(pilot, lambda: app.session is not None, 180)
            await pilot.pause()
            screen = screen_text(app)
            assert f"engine: {expect}" in screen and "(onnxruntime" in screen, screen
            await pilot.press("q")
        return steps, screen

    steps, _ = await start("ONNX export cache hit")
    assert "ONNX export cache hit (fp32)" in steps
    with exported.path.open("r+b") as f:  # a truncated graph, as after a full disk
        f.truncate(exported.path.stat().st_size // 2)
    steps, screen = await start("ONNX exported in")
    assert "exporting ONNX (fp32), once per model" in steps
    assert "cached export unusable" in screen  # the ready notice says why it was exported again


# --- snapshots: fixed events, no models, no clock ------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_main_screen_snapshot(size):
    """The main screen matches the committed SVG (UPDATE_SNAPSHOTS=1 rewrites it)."""
    app = AssistantApp(None, gpu=False)
    async with app.run_test(size=size) as pilot:
        await show_fixed_session(app, pilot)
        svg = app.export_screenshot(title="assistant")
        text = screen_text(app)
    path = SNAPSHOTS / f"main_{size[0]}x{size[1]}.svg"
    if os.environ.get("UPDATE_SNAPSHOTS") or not path.exists():
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(svg)
        if not os.environ.get("UPDATE_SNAPSHOTS"):
            pytest.fail(f"wrote a new snapshot {path}: check it, then commit it")
    assert "THINKING" in text and "smollm2-135m-instruct" in text  # turn 3 is being answered
    assert "Berlin is" in text and "q Quit" in text
    assert svg == path.read_text(), f"screen differs from {path}; UPDATE_SNAPSHOTS=1 to accept"


def v2v_records(n: int) -> list[TurnRecord]:
    """``n`` finished voice turns (only the metrics: the table reads nothing else)."""
    metrics = dict.fromkeys(STAGES, 100.0)
    return [
        TurnRecord(i, metrics={**metrics, "voice_to_voice_ms": 1900.0 + i % 100}) for i in range(1, n + 1)
    ]


@pytest.mark.asyncio
async def test_stats_table_marks_p999_rough_under_1000_turns_and_fits_80x24():
    """P99.9 reads ``~`` with a footnote until n reaches 1000; every column stays on screen at 80x24."""
    app = AssistantApp(None, gpu=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()  # the breakpoint's layout
        stats = app.query_one(SessionStats)
        screen = screen_text(app)
        assert re.search(r"stage\s+P50\s+P95\s+P99\s+P99\.9\s+max\s+n\s*│", screen), screen
        for n in (999, 1000):
            stats.update_records(v2v_records(n))
            await pilot.pause()
            screen = screen_text(app)
            s = percentiles(v2v_records(n))["voice_to_voice_ms"]
            cells = [f"{s[k]:.0f}" for k in ("p50", "p95", "p99", "p999", "max")]
            rough = "~" if n < 1000 else ""
            # 4-digit ms and counts: the long names would not fit, "v2v"; the count is the last column.
            row = rf"│ v2v\s+{cells[0]}\s+{cells[1]}\s+{cells[2]}\s+{rough}{cells[3]}\s+{cells[4]}\s+{n}\s*│"
            assert re.search(row, screen), screen
            assert ("~ rough: P99.9 needs n ≥ 1000" in screen) == (n < 1000), screen
            assert "│ turn det " in screen and "turn detection" not in screen  # short names throughout


class StandInGpu(GpuMonitor):
    """The UI's GPU reader with samples given by the test: no GPU can exist on this machine.

    ``sample()`` returns the next of ``samples`` (``None`` for no GPU) and counts the reads.
    """

    def __init__(self, samples: list[GpuSample | None]) -> None:
        self.name = "H200"
        self.samples = list(samples)
        self.reads = 0

    @property
    def available(self) -> bool:
        return self.samples[0] is not None

    def sample(self) -> GpuSample | None:
        self.reads += 1
        return self.samples[min(self.reads, len(self.samples)) - 1]


@pytest.mark.asyncio
async def test_gpu_memory_trend_beside_voice_to_voice_only_with_a_gpu(monkeypatch):
    """With a GPU, each status refresh (one read) adds to a memory sparkline beside voice-to-voice.

    Without one, the statistics pane has no GPU trend and keeps the full voice-to-voice label.
    """
    monkeypatch.setattr("assistant.tui.app.GPU_POLL_S", 0.05)
    gib = 2**30
    samples = [GpuSample("H200", 0.73, (4 + i // 2) * gib, 140 * gib) for i in range(6)]
    for gpu in (StandInGpu([None]), StandInGpu(samples)):
        app = AssistantApp(None, gpu=False)
        app.gpu = gpu
        async with app.run_test(size=(80, 24)) as pilot:
            await show_fixed_session(app, pilot)  # two voice turns: the voice-to-voice trend shows
            if not gpu.available:
                await pilot.pause(0.3)
                screen = screen_text(app)
                assert "voice-to-voice per turn:" in screen and "GPU mem" not in screen, screen
                assert gpu.reads == 0
                continue
            await wait_until(pilot, lambda g=gpu: g.reads >= len(samples), 10)
            await pilot.pause()
            screen = screen_text(app)
            assert "GPU mem 4.0-6.0 GiB" in screen, screen  # the plot's range, beside voice-to-voice:
            (line,) = [row for row in screen.splitlines() if "GPU mem" in row]
            assert "│ v2v per turn:" in line, screen  # on one line of the 80-column pane
            stats = app.query_one(SessionStats)
            for spark in app.query("#v2v-spark, #gpu-spark"):  # all of each plot is on screen
                assert spark.region.width > 10 and stats.content_region.contains_region(spark.region)
            # One read per refresh: the trend has every reading, in order (the stand-in repeats
            # its last sample), and the status line shows the same one.
            trend = list(stats.gpu_memory_gib)
            assert len(trend) == gpu.reads
            assert trend[:6] == [4.0, 4.0, 5.0, 5.0, 6.0, 6.0] and set(trend[6:]) <= {6.0}
            assert app.query_one(StatusBar).gpu == "H200 util 73% mem 6.0/140.0 GiB"
            for _ in range(200):
                stats.add_gpu_sample(samples[0])
            assert len(stats.gpu_memory_gib) == 120  # bounded: the last 4 minutes


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_tmux_run_of_the_first_command_shows_the_ui(tmp_path):
    """``assistant`` in a 120x40 tmux pane opens the UI: the status bar and the footer keys."""
    session = f"assistant-test-{os.getpid()}"
    env_args = ["-e", f"PYTHONPATH={ROOT}"]
    for key in ("HOME", "XDG_CACHE_HOME"):
        if key in os.environ:
            env_args += ["-e", f"{key}={os.environ[key]}"]
    exe = ROOT / ".venv" / "bin" / "assistant"  # what scripts/run.sh runs once set up
    cmd = str(exe) if exe.exists() else f"{sys.executable} -m assistant"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "40", *env_args, "-c", str(ROOT)]
        + [f"{cmd} --max-new-tokens 16"],
        check=True,
    )
    try:
        screen = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            screen = subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
            ).stdout
            if "ready:" in screen or "error:" in screen:
                break
            time.sleep(0.5)
        assert "ready:" in screen, screen
        assert "LLM smollm2-135m-instruct" in screen and "q Quit" in screen
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        for _ in range(100):
            alive = subprocess.run(["tmux", "has-session", "-t", session], capture_output=True)
            if alive.returncode != 0:
                break
            time.sleep(0.2)
        assert alive.returncode != 0, "q did not end the app"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
