"""An echo that appears after start-up heard none: how often a reply pauses for its own echo.

As when a headset is unplugged: the app starts on the echo rig with the echo path muted (its
probe hears no echo: "full duplex: no echo heard"), then the path is unmuted (60 ms, -13 dB,
two reflections, a steady delay: ``scripts/virtual-audio.sh echo mute|unmute``) and a typed
question is answered aloud with nobody speaking. Every ``ReplyPaused`` is a false one. Each
trial is a fresh app; ``--before DIR`` runs a checkout of other code (its own venv) alike.
Prints a markdown table and writes ``--json``.

    python -m bench.echo_appears --before /tmp/echo-before --trials 5 --json docs/results/echo-appears.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.duplex import App
from bench.echo_rig import SCRIPT, echo_path, private_audio
from bench.results import write_results

QUESTION = "Tell me about the history of Rome."


def trial(env: dict[str, str], folder: Path, checkout: Path | None) -> dict:
    """One app: start with the echo muted, unmute it, one typed question answered aloud."""
    full = {**os.environ, **env}
    subprocess.run([SCRIPT, "echo", "mute"], env=full, check=True)
    app = App(env, folder, checkout, "--max-new-tokens", "60", "--temperature", "0")
    try:
        app.wait_line("listening on", 300)
        subprocess.run([SCRIPT, "echo", "unmute"], env=full, check=True)
        time.sleep(0.5)
        app.ask(QUESTION)
        app.wait_event("TurnDone", timeout_s=120)
    finally:
        app.stop()
    events = app.events()
    states = [e["reason"] for e in events if e["event"] == "EchoState"]
    erle = [e["erle_db"] for e in events if e["event"] == "EchoMeasured" and e.get("erle_db") is not None]
    return {
        "pauses": sum(e["event"] == "ReplyPaused" for e in events),
        "barge_ins": sum(e["event"] == "BargeIn" for e in events),
        "heard": [e["text"] for e in events if e["event"] == "OverlapHeard"],
        "states": states,  # the mode as the status bar showed it, in order
        "erle_db": erle[0] if erle else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code before (with its .venv)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    configs = {"new": None} if args.before is None else {"before": args.before, "new": None}
    results: dict[str, list[dict]] = {name: [] for name in configs}
    with private_audio("echo-appears-pulse-") as env, echo_path(env, 60, -13, 2):
        for k in range(args.trials):  # alternated, so the machine's load falls on both alike
            for name, checkout in configs.items():
                folder = Path(tempfile.mkdtemp(prefix=f"echo-appears-{name}-"))
                results[name].append(trial(env, folder, checkout))
                print(f"{name} {k + 1}: {results[name][-1]}", file=sys.stderr)
    print("| code | replies | paused for their own echo | pauses | barge-ins | ERLE median dB |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        erle = [r["erle_db"] for r in runs if r["erle_db"] is not None]
        paused, pauses = sum(r["pauses"] > 0 for r in runs), sum(r["pauses"] for r in runs)
        print(
            f"| {name} | {len(runs)} | {paused} | {pauses} | {sum(r['barge_ins'] for r in runs)} "
            f"| {np.median(erle) if erle else float('nan'):.0f} |"
        )
    if args.json:
        write_results(args.json, args, results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
