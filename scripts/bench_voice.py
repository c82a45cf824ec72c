#!/usr/bin/env python
"""Voice-to-voice latency of the live loop over N spoken turns, stage by stage.

The real app (``assistant run --no-tui --log``) runs on the private PulseAudio of
``scripts/virtual-audio.sh``: each question is rendered by espeak-ng (varied voices and speeds),
played into the virtual microphone in real time, and answered through the virtual speaker.
Every number comes from the app's own per-turn JSONL records (``assistant.latency``), so the
definitions are those of docs/voice.md. Prints a table (median, P95, max per stage) and writes
JSON with the machine, versions and the command line.

    scripts/bench_voice.py --turns 20 --json docs/results/bench-voice-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from assistant.latency import STAGES

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "What is the capital of France?",
    "Tell me a fun fact about cats.",
    "How many days are in a week?",
    "What color is the sky?",
    "Name a big city in Japan.",
    "What do bees make?",
    "Give me a tip for sleeping better.",
    "What is the largest ocean?",
    "Who wrote Romeo and Juliet?",
    "What language is spoken in Spain?",
    "Suggest a name for a dog.",
    "What is water made of?",
    "How do I boil an egg?",
    "What is the opposite of hot?",
    "Tell me something about the moon.",
    "What is a good breakfast?",
    "Which planet is closest to the sun?",
    "What do you call a baby cat?",
    "How tall is Mount Everest?",
    "Say hello in French.",
]
VOICES = [("en-us", 160), ("en-us+f3", 175), ("en-gb", 150), ("en-us+m3", 185), ("en-gb+f2", 165)]


def render(text: str, voice: str, wpm: int, path: Path) -> None:
    raw = path.with_suffix(".raw.wav")
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(raw), text], check=True)
    subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(path)], check=True)


def wait_for(proc: subprocess.Popen[str], pattern: str, timeout_s: float, seen: list[str]) -> bool:
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            return False
        seen.append(line)
        if re.search(pattern, line):
            return True
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("app_args", nargs="*", help="extra 'assistant run' flags, after --")
    args = parser.parse_args()
    start = subprocess.run([str(ROOT / "scripts/virtual-audio.sh"), "start"], capture_output=True, text=True)
    if start.returncode:
        sys.exit(start.stderr)
    env = {**os.environ, **dict(kv.split("=", 1) for kv in start.stdout.split()[1:])}
    work = Path(tempfile.mkdtemp(prefix="bench-voice-"))
    log = work / "turns.jsonl"
    cmd = [sys.executable, "-m", "assistant", "run", "--no-tui", "--log", str(log), *args.app_args]
    app = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen: list[str] = []
    if not wait_for(app, "listening on", 300, seen):
        sys.exit("the app did not start: " + "".join(seen) + (app.stderr.read() if app.stderr else ""))
    asked = []
    try:
        for i in range(args.turns):
            text = QUESTIONS[i % len(QUESTIONS)]
            voice, wpm = VOICES[i % len(VOICES)]
            wav = work / f"q{i}.wav"
            render(text, voice, wpm, wav)
            before = log.read_text().count("\n") if log.exists() else 0
            subprocess.run(["paplay", "--device=micfeed", str(wav)], env=env, check=True)
            deadline = time.monotonic() + 120
            while (
                time.monotonic() < deadline and (log.read_text().count("\n") if log.exists() else 0) == before
            ):
                time.sleep(0.05)
            asked.append({"text": text, "voice": voice, "wpm": wpm})
            print(f"turn {i + 1}/{args.turns}: {text!r} ({voice}, {wpm} wpm)", file=sys.stderr, flush=True)
            time.sleep(0.5)
    finally:
        app.send_signal(2)
        app.wait(60)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    rows = {}
    for key in (*STAGES, "tokens_per_s"):
        values = np.array([r["metrics"][key] for r in records if r["metrics"].get(key) is not None])
        if values.size:
            rows[key] = {
                "median": float(np.median(values)),
                "p95": float(np.percentile(values, 95)),
                "max": float(values.max()),
                "n": int(values.size),
            }
    recognised = sum(
        1
        for a, r in zip(asked, records, strict=False)
        if a["text"].lower().rstrip("?.") in r["transcript"].lower()
    )
    backend = records[0]["backend"] if records else "?"
    print(f"\n{len(records)} turns ({recognised} transcribed exactly), backend {backend}")
    print("| stage | median | P95 | max | n |\n|---|---:|---:|---:|---:|")
    for key, row in rows.items():
        print(f"| {key} | {row['median']:.0f} | {row['p95']:.0f} | {row['max']:.0f} | {row['n']} |")
    if args.json:
        out = {
            "command": shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "machine": {
                "load_avg_at_end": os.getloadavg(),
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
            },
            "app_command": shlex.join(cmd[1:]),
            "stages": rows,
            "turns": records,
            "asked": asked,
        }
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
