"""The rest of a paused question said just after a session's first reply began, live on the echo rig.

Each trial starts a fresh ``assistant run --no-tui`` (so every reply spoken over is a session's
first) on the private PulseAudio with the echo path on (60 ms, -13 dB, two reflections), says
"I would like to know" in the Piper voice, waits for the reply's first audio, and says "how
many days are in a week?" ``--after`` seconds after it. Prints each trial's transcripts and the
judge's words over the reply (``OverlapHeard``); ``--tree`` runs another checkout (its own
``assistant``, e.g. a ``git worktree`` of the code before a change):

    python -m bench.continuation_live --after 0.2,0.3,0.4,0.5 --json continuation-live.json
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bench.corpus import PAUSED
from bench.duplex import words_lost
from bench.duplex_rig import LiveApp, piper_utterance
from bench.echo_rig import echo_path, private_audio
from bench.results import write_results

FIRST, REST, _ = PAUSED[0]  # "I would like to know", "how many days are in a week?"
ROOT = Path(__file__).resolve().parents[1]


def trial(env: dict[str, str], folder: Path, first: Path, rest: Path, after_s: float) -> dict:
    """One fresh app: the question's halves around its reply's start; what it transcribed and judged."""
    folder.mkdir()
    app = LiveApp(env, folder)
    try:
        app.wait_line("listening", 120)
        time.sleep(2.0)  # the probe has played and full duplex is on
        app.say(first)
        app.wait_event("AudioStarted", 1, 30)
        time.sleep(max(0.0, after_s - 0.2))  # the WAV's 0.2 s of silence first
        app.say(rest)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and all(r.get("cancelled") for r in app.records().values()):
            time.sleep(0.2)
        events = app.events()
    finally:
        app.stop()
    transcripts = [e["text"] for e in events if e["event"] == "TranscriptReady"]
    judged = [(e["text"], e["verdict"]) for e in events if e["event"] == "OverlapHeard"]
    answered = transcripts[-1] if len(transcripts) > 1 else ""
    return {"after_s": after_s, "transcripts": transcripts, "judged": judged, "lost": lost(answered)}


def lost(text: str) -> list[str]:
    """The words of :data:`REST` missing from ``text``."""
    return words_lost(REST, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--after", default="0.2,0.3,0.4,0.5", help="seconds after the reply's start, ',' between"
    )
    parser.add_argument("--wpm", type=int, default=175, help="the Piper voice's rate")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose app runs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="continuation-live-"))
    first = piper_utterance(folder, FIRST, "first", args.wpm)
    rest = piper_utterance(folder, REST, "rest", args.wpm)
    rows = []
    here = Path.cwd()
    os.chdir(args.tree)  # ``python -m assistant`` runs the tree's own code
    try:
        with private_audio("continuation-live-pulse-") as env, echo_path(env):
            for k, after_s in enumerate(map(float, args.after.split(","))):
                row = trial(env, folder / f"trial{k}", first, rest, after_s)
                rows.append(row)
                print(f"+{after_s:.2f} s: {row['transcripts']} | judged {row['judged']}", flush=True)
    finally:
        os.chdir(here)
    whole = sum(len(r["transcripts"]) > 1 and not r["lost"] for r in rows)
    unseen = sum(len(r["transcripts"]) < 2 for r in rows)
    print(f"\nanswered whole: {whole} of {len(rows)}; rest not seen: {unseen}")
    if args.json:
        write_results(args.json, args, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
