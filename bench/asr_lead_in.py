"""How the silence around a question moves tiny.en's words, on the fitted window and the full one.

Live, the endpointer hands ASR the speech with a pre-roll and some trailing silence whose length
varies from turn to turn. Each question (espeak-ng, en-us, 160 wpm) is transcribed with every
lead-in of ``--leads`` and trailing silence of ``--tails`` seconds, beam 5, by the app's
Transcriber with ``[asr] window = "fit"`` and ``"full"``; a transcript counts as right when it
holds the question's words. Prints the table and writes ``--json``:

    python -m bench.asr_lead_in --json docs/results/asr-lead-in.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from assistant.config import load_settings
from assistant.stages.asr import Transcriber
from bench.speech import speak
from store.bundled import ModelStore

QUESTIONS = [
    "What is the capital of France?",
    "What is the capital of Germany?",
    "Tell me about the history of Paris.",
    "How many legs does a spider have?",
]


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z ]", "", text.lower()).split()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leads", default="0,0.1,0.2,0.3,0.5", help="seconds of silence before")
    parser.add_argument("--tails", default="0.1,0.25,0.5", help="seconds of silence after")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    leads = [float(x) for x in args.leads.split(",")]
    tails = [float(x) for x in args.tails.split(",")]
    settings = load_settings(None, env={})
    store = ModelStore(settings.models.store_dir)
    folder = Path(tempfile.mkdtemp(prefix="lead-in-"))
    audio = {q: speak(q, folder, f"q{i}") for i, q in enumerate(QUESTIONS)}
    results: dict[str, dict[str, dict[str, int]]] = {}
    for window in ("full", "fit"):
        asr = Transcriber(dataclasses.replace(settings.asr, window=window), store)
        results[window] = {}
        for question, speech in audio.items():
            heard: Counter[str] = Counter()
            for lead in leads:
                for tail in tails:
                    pad = [np.zeros(round(s * 16000), np.float32) for s in (lead, tail)]
                    heard[asr.transcribe(np.concatenate([pad[0], speech, pad[1]])).text] += 1
            results[window][question] = dict(heard)
    trials = len(leads) * len(tails)
    print(f"| question | full window: right of {trials} | fitted: right of {trials} | fitted: what else |")
    print("|---|---:|---:|---|")
    for question in QUESTIONS:
        right = {
            w: sum(n for t, n in results[w][question].items() if words(t) == words(question)) for w in results
        }
        wrong = [f"{t!r} x{n}" for t, n in results["fit"][question].items() if words(t) != words(question)]
        print(f"| {question} | {right['full']} | {right['fit']} | {', '.join(wrong)} |")
    if args.json:
        report = {"leads": leads, "tails": tails, "results": results}
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
