"""What a long session costs the UI: a reply's redraw with more and more turns on screen.

A demo booth runs the UI for hours. This fills the real conversation pane (Textual's Pilot,
headless, no models) with N turns, a question and a two-sentence reply each, then times a
streamed token's way to the screen (the reply updated, the pane laid out and drawn: what the
UI does 20 times a second while a reply streams, holding the GIL) 20 times, and reports the
median and the worst, and the pane's entries. Prints a markdown table and writes JSON.

    python -m bench.ui_growth --turns 0,200,1000 --json docs/results/ui-growth.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import numpy as np

from bench.results import write_results

QUESTION = "What is the capital of France and why is it so famous?"
REPLY = " The capital of France is Paris, famous for its art, food and history." * 2


async def measure(counts: list[int], size: tuple[int, int]) -> list[dict]:
    """For each count of turns (ascending), the redraw times of one streamed token."""
    from assistant.tui.app import AssistantApp
    from assistant.tui.conversation import Conversation

    rows = []
    app = AssistantApp(None, gpu=False)
    async with app.run_test(size=size) as pilot:
        pane = app.query_one(Conversation)
        turn = 0
        for count in counts:
            while turn < count:
                turn += 1
                pane.user(turn, QUESTION)
                pane.token(turn, REPLY)
                pane.flush()
                if turn % 100 == 0:
                    await pilot.pause()
            for _ in range(3):
                await pilot.pause()
            times = []
            for _ in range(20):
                start = time.perf_counter()
                pane.token(turn, " more")
                pane.flush()
                await pilot.pause()
                times.append(1000 * (time.perf_counter() - start))
            rows.append(
                {
                    "turns": count,
                    "entries": len(pane.children),
                    "redraw_ms_median": float(np.median(times)),
                    "redraw_ms_max": float(max(times)),
                }
            )
            print(rows[-1], flush=True)
        await pilot.press("q")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", default="0,200,1000,3000", help="counts of turns, comma-separated")
    parser.add_argument("--size", default="160x40", help="terminal size of the UI")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    counts = sorted(int(v) for v in args.turns.split(","))
    width, height = (int(v) for v in args.size.split("x"))
    rows = asyncio.run(measure(counts, (width, height)))
    print("\n| turns in the session | entries on screen | token to screen, median | worst of 20 |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        median, worst = r["redraw_ms_median"], r["redraw_ms_max"]
        print(f"| {r['turns']} | {r['entries']} | {median:.1f} ms | {worst:.1f} ms |")
    if args.json:
        write_results(args.json, args, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
