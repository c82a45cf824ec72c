"""Full duplex on the echo rig: false barge-ins, barge-in reaction, words kept, ERLE, CPU per frame.

Each configuration runs the real app (``assistant run --no-tui``) on the private PulseAudio of
``scripts/virtual-audio.sh`` with the speaker fed back into the microphone (``--delay-ms``,
``--gain-db``, two reflections; ``bench.echo_rig``), in three parts:

1. echo only: ``--replies`` typed questions answered aloud, nobody speaking: every pause of a
   reply, barge-in or speech heard is a false one (per 100 replies), ERLE per reply;
2. barge-in: a long question, then ``What is the capital of Germany?`` spoken 2.6 s into its
   reply: the reaction (reply paused or stopped, minus the speech's onset), and whether the
   new question was answered;
3. paused questions: the first half, the reply starts, 0.2 s later the second half: the share
   of the second half's words in no transcript (words lost), and voice-to-voice of the answer.

``before`` is a checkout of the code before full duplex (``--before DIR``, its own venv), run
with ``--barge-in`` in part 1 and 2 (without it nothing is heard over a reply at all). Prints
markdown tables (median and P95) and writes ``--json``.

    python -m bench.duplex --before /work/baseline --json docs/results/duplex-14.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.duplex_rig import LiveApp, next_turn, reply_playing, utterance
from bench.echo_rig import echo_path

ROOT = Path(__file__).resolve().parents[1]
PAUSED = [  # (first half, second half)
    ("I would like to know", "how many days are in a week?"),
    ("What is the largest,", "the largest ocean on Earth?"),
    ("Can you tell me", "the name of the closest star?"),
    ("How many legs", "does a spider have?"),
]


def norm(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9 ]", " ", text.lower()).split()


class App(LiveApp):
    """:class:`LiveApp` from another checkout (its own venv) when ``checkout`` is given."""

    def __init__(self, env: dict[str, str], folder: Path, checkout: Path | None, *args: str) -> None:
        if checkout is None:
            super().__init__(env, folder, *args)
            return
        python = checkout / ".venv" / "bin" / "python"
        real = sys.executable
        sys.executable = str(python)  # LiveApp starts "sys.executable -m assistant"
        cwd = Path.cwd()
        os.chdir(checkout)
        try:
            super().__init__(env, folder, *args)
        finally:
            sys.executable = real
            os.chdir(cwd)


def echo_only(env: dict, folder: Path, checkout: Path | None, replies: int, flags: list[str]) -> dict:
    app = App(env, folder, checkout, "--max-new-tokens", "10", *flags)
    try:
        app.wait_line("listening on", 300)
        for i in range(replies):
            app.ask(f"Name a colour, number {i + 1}.")
        deadline = time.monotonic() + 60 + 8 * replies
        while sum(e["event"] == "TurnDone" for e in app.events()) < replies and time.monotonic() < deadline:
            time.sleep(0.3)
    finally:
        app.stop()
    events = app.events()
    done = sum(e["event"] == "TurnDone" for e in events)
    false = sum(e["event"] in ("ReplyPaused", "BargeIn") for e in events)
    heard = sum(e["event"] == "SpeechStarted" for e in events)
    erle = [e["erle_db"] for e in events if e["event"] == "EchoMeasured" and e.get("erle_db") is not None]
    return {"replies": done, "false_interruptions": false, "speech_heard": heard, "erle_db": erle}


def spoken(env: dict, folder: Path, checkout: Path | None, trials: int, flags: list[str]) -> dict:
    long_q = utterance(folder, "Tell me about the history of Paris.", "long")
    germany = utterance(folder, "What is the capital of Germany?", "germany")
    halves = [
        (utterance(folder, a, f"a{i}"), utterance(folder, b, f"b{i}"), b) for i, (a, b) in enumerate(PAUSED)
    ]
    app = App(env, folder, checkout, "--max-new-tokens", "40", *flags)
    reactions, answered, lost, v2v = [], 0, [], []
    try:
        app.wait_line("listening on", 300)
        for k in range(trials):
            mark = len(app.events())
            app.say(long_q)
            turn = next_turn(app, mark)
            reply_playing(app, turn, mark)
            time.sleep(2.6)
            app.say(germany)
            try:
                new = next_turn(app, mark + 1, 30)
                app.wait_event("TurnDone", new, 60, mark)
            except AssertionError:
                new = 0
            ev = [e for e in app.events()[mark:] if e["turn_id"] == turn]
            stop = next((e for e in ev if e["event"] in ("ReplyPaused", "BargeIn")), None)
            if stop is not None:
                reactions.append((stop["t_ns"] - stop["onset_t_ns"]) / 1e6)
            answered += bool(new and "germany" in app.records().get(new, {}).get("transcript", "").lower())
            time.sleep(1.5)
            first, rest, rest_text = halves[k % len(halves)]
            mark = len(app.events())
            app.say(first)
            turn = next_turn(app, mark)
            reply_playing(app, turn, mark)
            time.sleep(0.2)
            app.say(rest)
            time.sleep(6)
            app.wait_event("TurnDone", None, 60, len(app.events()) - 1)
            texts = " ".join(e["text"] for e in app.events()[mark:] if e["event"] == "TranscriptReady")
            words = set(norm(rest_text))
            lost.append(len(words - set(norm(texts))) / len(words))
            recs = [r for t, r in app.records().items() if t >= turn and r.get("voice_to_voice_ms")]
            if recs and not recs[-1]["cancelled"]:
                v2v.append(recs[-1]["voice_to_voice_ms"])
            time.sleep(1.5)
    finally:
        app.stop()
    return {
        "reactions_ms": reactions,
        "answered": answered,
        "trials": trials,
        "words_lost": lost,
        "v2v_ms": v2v,
    }


def cpu_per_frame() -> dict:
    """The capture path's echo cancellation per 10 ms frame (far end fed, resampled, processed)."""
    from assistant.config.sections import EchoOptions
    from assistant.stages.echo import EchoCanceller, load_processor

    options = EchoOptions()
    canceller = EchoCanceller(options, load_processor(options))
    rng = np.random.default_rng(0)
    far = (0.1 * rng.standard_normal(16000 * 20)).astype(np.float32)
    near = np.roll(far, 960) * 0.2
    t0, block = 10**12, 512
    start = time.process_time()
    for i in range(0, far.size - block, block):
        t = t0 + i * 62_500
        canceller.play(far[i : i + block], t)
        canceller.process(near[i : i + block], t)
    frames = far.size // 160
    return {"cpu_ms_per_frame": 1000 * (time.process_time() - start) / frames, "frames": frames}


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def per_100(echo: dict) -> float:
    return 100 * echo["false_interruptions"] / max(echo["replies"], 1)


def table(results: dict) -> str:
    rows = [
        "| | " + " | ".join(results) + " |",
        "|---|" + "---:|" * len(results),
    ]

    def row(label: str, fn: Callable[[dict], str]) -> None:
        rows.append(f"| {label} | " + " | ".join(fn(r) for r in results.values()) + " |")

    def f(v: float | None, d: int = 0) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    row("replies with echo only", lambda r: str(r["echo"]["replies"]))
    row("false interruptions per 100 replies", lambda r: f(per_100(r["echo"]), 1))
    row("speech heard in echo-only replies", lambda r: str(r["echo"]["speech_heard"]))
    row("ERLE median (dB)", lambda r: f(pct(r["echo"]["erle_db"], 50), 1))
    row("barge-in reaction median (ms)", lambda r: f(pct(r["spoken"]["reactions_ms"], 50)))
    row("barge-in reaction P95 (ms)", lambda r: f(pct(r["spoken"]["reactions_ms"], 95)))
    row("barge-ins stopped / tried", lambda r: f"{len(r['spoken']['reactions_ms'])}/{r['spoken']['trials']}")
    row("new question answered", lambda r: f"{r['spoken']['answered']}/{r['spoken']['trials']}")
    row(
        "second-half words lost (paused)", lambda r: f(100 * float(np.mean(r["spoken"]["words_lost"]))) + " %"
    )
    row("voice-to-voice median (ms)", lambda r: f(pct(r["spoken"]["v2v_ms"], 50)))
    row("voice-to-voice P95 (ms)", lambda r: f(pct(r["spoken"]["v2v_ms"], 95)))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code before (with its .venv)")
    parser.add_argument("--replies", type=int, default=20)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--delay-ms", type=int, default=60)
    parser.add_argument("--gain-db", type=float, default=-13)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    runtime = tempfile.mkdtemp(prefix="duplex-pulse-")
    script = str(ROOT / "scripts" / "virtual-audio.sh")
    started = subprocess.run(
        [script, "start"],
        env={**os.environ, "VIRTUAL_AUDIO_RUNTIME": runtime},
        capture_output=True,
        text=True,
    )
    env = dict(line.removeprefix("export ").split("=", 1) for line in started.stdout.split() if "=" in line)
    env = {k: v.strip("'\"") for k, v in env.items()}
    configs: dict[str, tuple[Path | None, list[str], list[str]]] = {"new": (None, [], [])}
    if args.before:
        configs = {"before": (args.before, ["--barge-in"], ["--barge-in"]), **configs}
    results: dict[str, dict] = {}
    try:
        with echo_path(env, args.delay_ms, args.gain_db, 2):
            for name, (checkout, echo_flags, spoken_flags) in configs.items():
                work = Path(tempfile.mkdtemp(prefix=f"duplex-{name}-"))
                (work / "echo").mkdir()
                (work / "spoken").mkdir()
                print(f"{name}: echo only, {args.replies} replies", file=sys.stderr)
                echo = echo_only(env, work / "echo", checkout, args.replies, echo_flags)
                print(f"{name}: {args.trials} barge-ins and paused questions", file=sys.stderr)
                talk = spoken(env, work / "spoken", checkout, args.trials, spoken_flags)
                results[name] = {"echo": echo, "spoken": talk}
    finally:
        subprocess.run(
            [script, "stop"], env={**os.environ, "VIRTUAL_AUDIO_RUNTIME": runtime}, capture_output=True
        )
    cpu = cpu_per_frame()
    print(table(results))
    print(
        f"\necho cancellation CPU: {cpu['cpu_ms_per_frame']:.3f} ms per 10 ms frame ({os.cpu_count()} cores)"
    )
    if args.json:
        meta = {"machine": platform.platform(), "cores": os.cpu_count(), "load_avg": os.getloadavg()}
        options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        report = {"meta": meta, "args": options, "cpu": cpu, "results": results}
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
