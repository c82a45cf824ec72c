"""Silences inside spoken replies: a piece ready only after the one before it had played out.

The real app (``assistant run --no-tui``) on the private PulseAudio of ``scripts/virtual-audio.sh``
answers typed questions aloud, told by its system prompt to answer in one long sentence: the
case where the splitter finds no sentence or clause end for seconds (a run-on sentence, a list
of numbers, a run of digits). Per reply: the silences inside it (:func:`bench.voice.gaps_ms`,
from the ``AudioReady`` events, each piece assumed to play right after the one before) and how
many pieces it was spoken in. ``--before DIR`` runs the same on another checkout (its own
``.venv``) first. Prints a markdown table and writes ``--json``.

    python -m bench.reply_gaps --before /tmp/before --json docs/results/reply-gaps.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.duplex import App
from bench.echo_rig import private_audio
from bench.results import write_results
from bench.voice import gaps_ms

RUN_ON = "You answer in one single very long sentence with no commas and no full stops until the very end."
QUESTIONS = (
    "List the first forty prime numbers.",
    "Tell me about the history of Paris.",
    "Recite the digits of pi.",
    "Describe the water cycle.",
    "Count from one to fifty.",
    "What is the square root of two?",
    "Name every planet and its moons.",
    "Explain how a car engine works.",
)


def replies(env: dict[str, str], folder: Path, checkout: Path | None, max_new_tokens: int) -> list[dict]:
    """Each question typed in turn, answered aloud; per reply its silences and pieces."""
    app = App(env, folder, checkout, "--max-new-tokens", str(max_new_tokens), "--system-prompt", RUN_ON)
    try:
        app.wait_line("listening on")
        for question in QUESTIONS:
            done = sum(e["event"] == "TurnDone" for e in app.events())
            app.ask(question)
            deadline = time.monotonic() + 180
            while sum(e["event"] == "TurnDone" for e in app.events()) <= done and time.monotonic() < deadline:
                time.sleep(0.2)
    finally:
        app.stop()
    events = app.events()
    rows = []
    for line in app.log_path.read_text().splitlines():
        record = json.loads(line)
        turn = record["turn_id"]
        pieces = [e["text"] for e in events if e["event"] == "SentenceReady" and e["turn_id"] == turn]
        gaps = gaps_ms(record, events)
        rows.append({"turn": turn, "gaps_ms": gaps, "pieces": pieces, "reply": record["reply"]})
    return rows


def summary(rows: list[dict]) -> dict:
    gaps = np.array([g for r in rows for g in r["gaps_ms"]])
    return {
        "replies": len(rows),
        "replies_with_silence": sum(bool(r["gaps_ms"]) for r in rows),
        "silences": int(gaps.size),
        "silent_ms_total": float(gaps.sum()),
        "silence_ms_median": float(np.median(gaps)) if gaps.size else None,
        "silence_ms_max": float(gaps.max()) if gaps.size else None,
        "pieces_median": float(np.median([len(r["pieces"]) for r in rows])) if rows else None,
    }


def table(results: dict[str, dict]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f} ms"

    lines = ["| | " + " | ".join(results) + " |", "|---|" + "---:|" * len(results)]
    for label, key, fmt in (
        ("replies", "replies", str),
        ("replies with a silence inside", "replies_with_silence", str),
        ("silences", "silences", str),
        ("silent time, total", "silent_ms_total", ms),
        ("silence, median", "silence_ms_median", ms),
        ("silence, longest", "silence_ms_max", ms),
        ("pieces per reply, median", "pieces_median", lambda v: "-" if v is None else f"{v:g}"),
    ):
        lines.append(f"| {label} | " + " | ".join(fmt(r["summary"][key]) for r in results.values()) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code before (with its .venv)")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    configs: dict[str, Path | None] = {"new": None}
    if args.before:
        configs = {"before": args.before, **configs}
    results = {}
    with private_audio("reply-gaps-pulse-") as env:
        for name, checkout in configs.items():
            print(f"{name}: {len(QUESTIONS)} replies", file=sys.stderr)
            folder = Path(tempfile.mkdtemp(prefix=f"reply-gaps-{name}-"))
            rows = replies(env, folder, checkout, args.max_new_tokens)
            results[name] = {"summary": summary(rows), "replies": rows}
    print(table(results))
    if args.json:
        write_results(args.json, args, results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
